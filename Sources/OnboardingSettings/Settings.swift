import Configuration
import SystemPackage
import Foundation
import Messaging

/// The settings a program was started with: its flags first, then `ONBOARDING_*` environment
/// variables, then an optional JSON configuration file, then each setting's default.
///
/// Built once at start, read through swift-configuration's `ConfigReader`, and passed down as
/// plain values (each service's `Configuration` struct); libraries never read the environment.
/// Every getter checks the value against the setting's ``Setting/Kind`` and throws a
/// ``SettingError`` that names the setting, the value (never a secret's) and what is allowed.
public struct Settings: Sendable {
    /// Where a value came from, for `--print-config` and for errors.
    public enum Source: Sendable, Hashable, CustomStringConvertible {
        case flag
        case environment
        case file(String)
        case defaultValue

        public var description: String {
            switch self {
            case .flag: "flag"
            case .environment: "environment"
            case .file(let path): "file \(path)"
            case .defaultValue: "default"
            }
        }
    }

    /// The environment variable that names a configuration file, and the flag that does.
    public static let fileVariable = "ONBOARDING_CONFIG"

    private let reader: ConfigReader
    private let flags: [Setting: String]
    private let environment: [String: String]
    private let filePath: String?

    /// The settings from flags and the environment, without a configuration file (the
    /// command-line tools read no file).
    ///
    /// - Parameters:
    ///   - flags: values given on the command line (see ``Setting/parseFlags(_:for:)``).
    ///   - environment: the process's environment; empty values count as unset.
    public init(flags: [Setting: String] = [:], environment: [String: String] = ProcessInfo.processInfo.environment) {
        self.init(flags: flags, environment: environment, file: nil, filePath: nil)
    }

    /// The settings from flags, the environment and a configuration file.
    ///
    /// - Parameters:
    ///   - flags: values given on the command line (see ``Setting/parseFlags(_:for:)``).
    ///   - environment: the process's environment; empty values count as unset.
    ///   - file: a JSON configuration file, nested by key (`{"auth": {"rpc": "tcp://…"}}`);
    ///     `nil` reads `ONBOARDING_CONFIG` from `environment`, and no file when that is unset too.
    /// - Throws: ``SettingError`` when the file cannot be read or is not a JSON object.
    public init(flags: [Setting: String] = [:], environment: [String: String], file: String?) async throws {
        guard let path = file ?? environment[Self.fileVariable].flatMap({ $0.isEmpty ? nil : $0 }) else {
            self.init(flags: flags, environment: environment)
            return
        }
        guard FileManager.default.isReadableFile(atPath: path) else {
            throw SettingError(
                "The configuration file \(path) (--config, \(Self.fileVariable)) cannot be read: check the path and its permissions.")
        }
        let provider: FileProvider<JSONSnapshot>
        do {
            provider = try await FileProvider<JSONSnapshot>(filePath: FilePath(path))
        } catch {
            throw SettingError("The configuration file \(path) is not a JSON object of settings (\(error)); see the README's Configuration.")
        }
        self.init(flags: flags, environment: environment, file: provider, filePath: path)
    }

    private init(flags: [Setting: String], environment: [String: String], file: (any ConfigProvider)?, filePath: String?) {
        let environment = environment.filter { $0.key.hasPrefix("ONBOARDING_") && !$0.value.isEmpty }
        self.flags = flags
        self.environment = environment
        self.filePath = filePath
        var flagValues: [AbsoluteConfigKey: ConfigValue] = [:]
        for (setting, value) in flags {
            flagValues[AbsoluteConfigKey(setting.fileKeyPath)] = ConfigValue(.string(value), isSecret: setting.isSecret)
        }
        let secretVariables = Set(Setting.all.filter(\.isSecret).map(\.environmentVariable))
        var providers: [any ConfigProvider] = [
            InMemoryProvider(name: "flags", values: flagValues),
            EnvironmentVariablesProvider(environmentVariables: environment, secretsSpecifier: .specific(secretVariables))
                .prefixKeys(with: "onboarding"),
        ]
        if let file { providers.append(file) }
        self.reader = ConfigReader(providers: providers)
    }

    // MARK: Raw values

    /// The value as text, and where it came from; `nil` when nobody set it.
    ///
    /// A file may hold a number, a Boolean or an array where the environment holds text: each
    /// is turned into the text the environment would have held (an array joined with commas).
    public func raw(_ setting: Setting) -> (text: String, source: Source)? {
        let key = ConfigKey(setting.fileKeyPath)
        let secret = setting.isSecret
        let text: String?
        if let value = reader.string(forKey: key, isSecret: secret) {
            text = value
        } else if let value = reader.int(forKey: key, isSecret: secret) {
            text = String(value)
        } else if let value = reader.bool(forKey: key, isSecret: secret) {
            text = value ? "1" : "0"
        } else if let value = reader.stringArray(forKey: key, isSecret: secret) {
            text = value.joined(separator: ",")
        } else if let value = reader.double(forKey: key, isSecret: secret) {
            text = String(value)
        } else {
            text = nil
        }
        guard let text else { return nil }
        if flags[setting] != nil { return (text, .flag) }
        if environment[setting.environmentVariable] != nil { return (text, .environment) }
        return (text, .file(filePath ?? "?"))
    }

    /// The values set for `settings`, by environment variable, for readers that take them so
    /// (what is unset is left out, to keep its default).
    public func environmentValues(_ settings: [Setting]) -> [String: String] {
        var values: [String: String] = [:]
        for setting in settings {
            if let (text, _) = raw(setting) { values[setting.environmentVariable] = text }
        }
        return values
    }

    // MARK: Typed values

    /// The text given, or the default when the setting has one; `nil` when it is unset and has
    /// none (or only a derived one).
    public func text(_ setting: Setting) -> String? {
        if let (text, _) = raw(setting) { return text }
        if case .value(let value) = setting.defaultValue { return value }
        return nil
    }

    /// A ZeroMQ endpoint; for a setting of kind ``Setting/Kind/endpoints``, one that may list
    /// several replicas (see ``Endpoint/replicas``).
    public func endpoint(_ setting: Setting) throws -> Endpoint {
        let text = try required(setting)
        let schemes = ["tcp://", "ipc://", "inproc://"]
        let parts = setting.kind == .endpoints ? text.split(separator: ",", omittingEmptySubsequences: false) : [Substring(text)]
        let replicas = try parts.map { part in
            let address = part.trimmingCharacters(in: .whitespaces)
            guard let scheme = schemes.first(where: address.hasPrefix), address.count > scheme.count else {
                throw invalid(setting, text)
            }
            return Endpoint(address)
        }
        guard Set(replicas).count == replicas.count else { throw invalid(setting, text, reason: "name each replica once") }
        return Endpoint(replicas: replicas)
    }

    /// The one address this process binds for `service` (a list of its replicas' endpoints):
    /// `bind` when set, else the list's only entry.
    ///
    /// - Throws: ``SettingError`` when the list names several replicas and `bind` is unset, or
    ///   a value is malformed.
    public func bindEndpoint(_ bind: Setting, of service: Setting) throws -> Endpoint {
        let replicas = try endpoint(service).replicas
        if raw(bind) != nil { return try endpoint(bind) }
        guard replicas.count == 1 else {
            throw SettingError(
                "\(service.environmentVariable) lists \(replicas.count) replicas: set \(bind.environmentVariable) to the "
                    + "address this one binds (one of them, or its port on tcp://*)")
        }
        return replicas[0]
    }

    /// A whole number within the setting's range.
    public func integer(_ setting: Setting) throws -> Int {
        guard let number = try optionalInteger(setting) else { throw invalid(setting, "") }
        return number
    }

    /// A whole number within the setting's range, or `nil` when it is unset and has no default.
    public func optionalInteger(_ setting: Setting) throws -> Int? {
        guard let text = text(setting) else { return nil }
        guard let number = Int(text.trimmingCharacters(in: .whitespaces)) else { throw invalid(setting, text) }
        if case .integer(let range) = setting.kind, !range.contains(number) { throw invalid(setting, text) }
        return number
    }

    /// On or off.
    public func toggle(_ setting: Setting) throws -> Bool {
        guard let text = text(setting) else { return false }
        switch text.trimmingCharacters(in: .whitespaces).lowercased() {
        case "1", "true", "yes", "on": return true
        case "0", "false", "no", "off": return false
        default: throw invalid(setting, text)
        }
    }

    /// The comma-separated items, trimmed, without empty ones; `nil` when unset with no default.
    public func list(_ setting: Setting) -> [String]? {
        text(setting).map {
            $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }
    }

    /// Any text; `derived` when it is unset (for settings whose default is worked out at start).
    public func path(_ setting: Setting, derived: @autoclosure () -> String) -> String {
        text(setting) ?? derived()
    }

    /// A URL: `https://`, or `http://` to a loopback host; `nil` when unset with no default.
    public func url(_ setting: Setting) throws -> String? {
        guard let text = text(setting)?.trimmingCharacters(in: .whitespaces), !text.isEmpty else { return nil }
        if let problem = Setting.providerURLProblem(text) { throw invalid(setting, text, reason: problem) }
        return text
    }

    /// One of the setting's words, in lower case.
    public func choice(_ setting: Setting) throws -> String {
        let text = try required(setting)
        guard case .choice(let words) = setting.kind, words.contains(text.lowercased()) else {
            throw invalid(setting, text)
        }
        return text.lowercased()
    }

    /// `http://HOST:PORT` (or `HOST:PORT`) as host and port; an IPv6 host may be in brackets.
    public func httpAddress(_ setting: Setting) throws -> (host: String, port: Int) {
        let text = try required(setting)
        var rest = Substring(text)
        if rest.hasPrefix("http://") { rest = rest.dropFirst("http://".count) }
        if rest.hasSuffix("/") { rest = rest.dropLast() }
        guard let colon = rest.lastIndex(of: ":"), colon > rest.startIndex,
            let port = Int(rest[rest.index(after: colon)...]), (0...65535).contains(port)
        else { throw invalid(setting, text) }
        var host = String(rest[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        return (host, port)
    }

    /// An address that may be off: `nil` when unset, empty or `off`.
    public func optionalHTTPAddress(_ setting: Setting) throws -> (host: String, port: Int)? {
        guard let text = text(setting), !["", "off"].contains(text.trimmingCharacters(in: .whitespaces).lowercased())
        else { return nil }
        return try httpAddress(setting)
    }

    private func required(_ setting: Setting) throws -> String {
        guard let text = text(setting) else { throw invalid(setting, "") }
        return text
    }

    /// The error for a value that cannot work, naming where it came from.
    public func invalid(_ setting: Setting, _ text: String, reason: String? = nil) -> SettingError {
        let source = raw(setting)?.source
        let shown = setting.isSecret ? "<secret>" : "\"\(text)\""
        let origin = source.map { " (from the \($0))" } ?? ""
        let allowed = reason ?? setting.allowedText.map { "give \($0)" } ?? "give a value"
        return SettingError("\(setting.environmentVariable) (\(setting.flag)) is \(shown)\(origin): \(allowed).")
    }
}

/// A setting that cannot work: one line that names it, the value and what is allowed.
public struct SettingError: Error, CustomStringConvertible, Equatable {
    public let description: String

    public init(_ description: String) { self.description = description }
}
