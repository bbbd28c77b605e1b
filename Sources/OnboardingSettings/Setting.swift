import Foundation

/// One setting of the system, declared once in ``Setting`` `+Catalog.swift`.
///
/// Everything a person sees of a setting follows from this declaration: its flag
/// (`--auth-rpc`), its environment variable (`ONBOARDING_AUTH_RPC`), its place in a
/// configuration file (`{"auth": {"rpc": ...}}`), the line in each program's `--help`, the row in
/// the README's Configuration table, and the line `--print-config` prints.
public struct Setting: Sendable, Hashable, CustomStringConvertible {
    /// The dotted key, in camelCase words: `auth.rpc`, `maxImageBytes`.
    public let key: String
    public let kind: Kind
    public let defaultValue: Default
    /// One line: what it changes.
    public let meaning: String
    /// Never printed: `--print-config` shows `<secret>`, errors never echo it.
    public let isSecret: Bool
    /// The programs that read it.
    public let programs: Set<Program>
    /// The heading it is listed under in help and in the README.
    public let group: Group

    /// What a setting's value is, and so how it is checked.
    public enum Kind: Sendable, Hashable {
        /// A ZeroMQ endpoint: `tcp://host:port`, `ipc://path` or `inproc://name`.
        case endpoint
        /// One ZeroMQ endpoint per replica of a service, comma-separated.
        case endpoints
        /// `http://host:port`, where an HTTP server listens.
        case httpAddress
        /// A file or folder.
        case path
        /// Any text.
        case text
        /// A whole number within a range.
        case integer(ClosedRange<Int>)
        /// On or off: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off`.
        case toggle
        /// A comma-separated list.
        case list
        /// `https://`, or `http://` to a loopback host (a local fake provider).
        case url
        /// One of a fixed set of words.
        case choice([String])
    }

    /// What a setting is when nobody sets it.
    public enum Default: Sendable, Hashable {
        /// This value.
        case value(String)
        /// Worked out at start from other settings, as the text says (`<data-dir>/auth.sqlite`).
        case derived(String)
        /// Not set, which means what the text says (`none: Google sign-in refused`).
        case unset(String)
    }

    /// Headings, in the order help and the README list them.
    public enum Group: String, Sendable, Hashable, CaseIterable {
        case endpoints = "Endpoints"
        case storage = "Storage"
        case process = "Process"
        case images = "Images"
        case sessions = "Sessions"
        case identity = "Identity providers (auth outside dev mode)"
        case unlinking = "Unlinking at the provider on withdrawal (auth)"
        case gateway = "HTTP gateway"
        case bus = "The bus's keys (CURVE)"
        case metrics = "Metrics and traces"
        case tools = "Command-line tools"
    }

    public init(
        _ key: String, _ kind: Kind, default defaultValue: Default, _ meaning: String,
        secret: Bool = false, group: Group, programs: Set<Program>
    ) {
        self.key = key
        self.kind = kind
        self.defaultValue = defaultValue
        self.meaning = meaning
        self.isSecret = secret
        self.group = group
        self.programs = programs
    }

    /// `ONBOARDING_` and the key's words in capitals: `auth.devMode` is `ONBOARDING_AUTH_DEV_MODE`.
    public var environmentVariable: String {
        "ONBOARDING_" + words.map { $0.uppercased() }.joined(separator: "_")
    }

    /// `--` and the key's words in lower case: `auth.devMode` is `--auth-dev-mode`.
    public var flag: String {
        "--" + words.map { $0.lowercased() }.joined(separator: "-")
    }

    /// The key's components, for a configuration file: `auth.rpc` is `{"auth": {"rpc": …}}`.
    public var fileKeyPath: [String] { key.split(separator: ".").map(String.init) }

    public var description: String { "\(environmentVariable) (\(flag))" }

    /// The key split at dots and at each lower-to-upper case change: `auth.devMode` is
    /// `auth`, `dev`, `Mode`.
    var words: [String] {
        fileKeyPath.flatMap { component -> [String] in
            var words: [String] = []
            var current = ""
            var previous: Character?
            for character in component {
                if let previous, previous.isLowercase || previous.isNumber, character.isUppercase {
                    words.append(current)
                    current = ""
                }
                current.append(character)
                previous = character
            }
            words.append(current)
            return words
        }
    }

    /// The default as the README and `--help` show it.
    public var defaultText: String {
        switch defaultValue {
        case .value(let value): value
        case .derived(let text), .unset(let text): text
        }
    }

    /// What is wrong with `text` as a provider's URL, or `nil` when nothing is: it must be
    /// `https`, or `http` to a loopback host (a fake provider on this machine), so that tokens
    /// are never checked against keys that crossed a network in the clear.
    public static func providerURLProblem(_ text: String) -> String? {
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased(),
            let host = components.host, !host.isEmpty
        else { return "not a URL; give https://host/path" }
        let loopback = host == "localhost" || host.hasPrefix("127.") || host == "::1" || host == "[::1]"
        guard scheme == "https" || (scheme == "http" && loopback) else {
            return "it must be https:// (http:// only to 127.0.0.1 or localhost, for a local fake provider)"
        }
        return nil
    }

    /// One line for a tool's `--help`: what it is, its variable and its default.
    public var helpLine: String {
        meaning.prefix(1).uppercased() + meaning.dropFirst() + ". Env: \(environmentVariable). Default: \(defaultText)"
    }

    /// What values are allowed, in words (`1 to 87600`), or `nil` when any text goes.
    public var allowedText: String? {
        switch kind {
        case .endpoint: "tcp://HOST:PORT, ipc://PATH or inproc://NAME"
        case .endpoints: "tcp://HOST:PORT, ipc://PATH or inproc://NAME; one per replica, comma-separated"
        case .httpAddress: "http://HOST:PORT"
        case .path, .text: nil
        case .integer(let range): "a whole number from \(range.lowerBound) to \(range.upperBound)"
        case .toggle: "1 or 0 (true/false, yes/no, on/off)"
        case .list: "comma-separated"
        case .url: "https://…, or http:// to 127.0.0.1 or localhost"
        case .choice(let words): words.joined(separator: ", ")
        }
    }
}

/// The programs that read settings.
public enum Program: String, Sendable, Hashable, CaseIterable, Comparable {
    case auth = "auth-service"
    case profile = "profile-service"
    case imageUpload = "image-upload-service"
    case orchestrator = "onboarding-orchestrator"
    case gateway = "onboarding-gateway"
    case tap = "onboarding-tap"
    case client = "onboarding-client"
    case chaos = "onboarding-chaos"
    case bench = "onboarding-bench"

    /// The four services and the gateway.
    public static let servers: Set<Program> = [.auth, .profile, .imageUpload, .orchestrator, .gateway]
    /// The services that keep a database and publish from an outbox.
    public static let publishers: Set<Program> = [.auth, .profile, .orchestrator]

    /// The settings this program reads, in catalog order.
    public var settings: [Setting] { Setting.all.filter { $0.programs.contains(self) } }

    /// A short name for tables: `auth`, `gateway`.
    public var shortName: String {
        switch self {
        case .auth: "auth"
        case .profile: "profile"
        case .imageUpload: "image-upload"
        case .orchestrator: "orchestrator"
        case .gateway: "gateway"
        case .tap: "tap"
        case .client: "client"
        case .chaos: "chaos"
        case .bench: "bench"
        }
    }

    public static func < (lhs: Program, rhs: Program) -> Bool {
        allCases.firstIndex(of: lhs)! < allCases.firstIndex(of: rhs)!
    }
}
