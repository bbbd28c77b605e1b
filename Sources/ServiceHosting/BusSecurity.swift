import Foundation
import Messaging
import OnboardingAPI
import OnboardingSettings
import ZeroMQMessaging

extension Program {
    /// The name of the program's key pair unless `ONBOARDING_KEY_NAME` says otherwise.
    public var keyName: String { shortName }
}

/// The bus's CURVE keys as the settings say: where they are, whose pair a process uses, and
/// which server holds each endpoint.
public enum BusSecurity {
    /// The key pairs `onboarding-keys make` makes when given no names: one per program.
    public static let standardNames = Program.allCases.map(\.keyName)

    /// The keys directory: `ONBOARDING_KEYS_DIR`, or `keys` in the data directory.
    public static func keysDirectory(_ settings: Settings) -> String {
        settings.path(.keysDir, derived: "\(settings.text(.dataDir) ?? ".data")/keys")
    }

    /// Which server (by key name) binds each endpoint of the settings.
    public static func serverEndpoints(_ settings: Settings) throws -> [String: [Endpoint]] {
        [
            Program.auth.keyName: [try settings.endpoint(.authRPC), try settings.endpoint(.authEvents)],
            Program.profile.keyName: [try settings.endpoint(.profileRPC), try settings.endpoint(.profileEvents)],
            Program.imageUpload.keyName: [try settings.endpoint(.imageRPC)],
            Program.orchestrator.keyName: [try settings.endpoint(.orchestratorRPC), try settings.endpoint(.routes)],
        ]
    }

    /// Where `program` answers requests, as this host reaches it (its metrics ask it for its own
    /// health there): the address it binds, with a wildcard host (`tcp://*:7101`,
    /// `tcp://0.0.0.0:7101`) read as loopback. `nil` for a program that answers none.
    public static func ownRequestEndpoint(of program: Program, settings: Settings) throws -> Endpoint? {
        guard let service = requestSetting(of: program) else { return nil }
        let bound = try settings.bindEndpoint(.rpcBind, of: service)
        for wildcard in ["tcp://*:", "tcp://0.0.0.0:"] where bound.rawValue.hasPrefix(wildcard) {
            return Endpoint("tcp://127.0.0.1:" + bound.rawValue.dropFirst(wildcard.count))
        }
        return bound
    }

    /// The setting that lists `program`'s request endpoints (one per replica), or `nil` for a
    /// program that answers no requests on the bus.
    public static func requestSetting(of program: Program) -> Setting? {
        switch program {
        case .auth: .authRPC
        case .profile: .profileRPC
        case .imageUpload: .imageRPC
        case .orchestrator: .orchestratorRPC
        default: nil
        }
    }

    /// The keys `program` runs its bus with, or `nil` when CURVE is off (`ONBOARDING_CURVE=false`).
    ///
    /// - Throws: ``SettingError`` with one line naming the key file that is missing, unreadable,
    ///   readable by others or malformed, and what to do.
    public static func keys(for program: Program, settings: Settings) throws -> BusKeys? {
        guard try settings.toggle(.curve) else { return nil }
        let directory = keysDirectory(settings)
        let name = settings.text(.keyName) ?? program.keyName
        do {
            var servers = try serverEndpoints(settings)
            // The program asks itself for its health (metrics) at its own address, which the
            // lists may not name as such (a wildcard bind).
            if let own = try ownRequestEndpoint(of: program, settings: settings),
                !servers.values.contains(where: { $0.flatMap(\.replicas).contains(own) })
            {
                servers[name, default: []].append(own)
            }
            var keys = try BusKeys.load(from: directory, identity: name, servers: servers)
            // Who may follow each publisher: the rights table, by the server that binds it. A
            // publisher asks at the address it binds, which may be a wildcard of its own.
            var publishers: [Endpoint: String] = [:]
            for (setting, service, publisher) in [
                (Setting.authEvents, ServiceName.auth, Program.auth), (.profileEvents, ServiceName.profile, .profile),
                (.routes, ServiceName.orchestrator, .orchestrator),
            ] {
                for replica in try settings.endpoint(setting).replicas { publishers[replica] = service }
                if program == publisher { publishers[try settings.bindEndpoint(.eventsBind, of: setting)] = service }
            }
            keys.mayFollow = { [publishers] caller, endpoint in
                publishers[endpoint].map { BusRights.may(caller, follow: $0) } ?? true
            }
            return keys
        } catch let error as SettingError {
            throw error
        } catch {
            throw SettingError(
                "the bus's keys: \(error). Make missing keys with `onboarding-keys make --keys-dir \(directory)`; "
                    + "ONBOARDING_CURVE=false runs without them (one trusted machine only).")
        }
    }

    /// A bus configuration with `program`'s keys (see ``keys(for:settings:)``).
    public static func busConfiguration(
        for program: Program, settings: Settings, base: ZeroMQBus.Configuration = ZeroMQBus.Configuration()
    ) throws -> ZeroMQBus.Configuration {
        var configuration = base
        configuration.keys = try keys(for: program, settings: settings)
        return configuration
    }

    /// Makes every program's key pair and `name`'s in `directory` (those missing), and returns
    /// `name`'s keys for the servers at `servers`: what a test or a tool of your own needs to
    /// talk to services started with that keys directory.
    public static func makeKeys(in directory: String, andLoad name: String, servers: [String: [Endpoint]]) throws -> BusKeys {
        _ = try makeKeys(in: directory, names: standardNames + [name])
        return try BusKeys.load(from: directory, identity: name, servers: servers)
    }

    /// What became of one name in ``makeKeys(in:names:)``.
    public struct MadeKey: Sendable {
        public let name: String
        public let publicKey: CurveKey
        /// `false` when the pair was there already (it is never replaced).
        public let made: Bool
    }

    /// Makes `directory` (mode 0700, tightened when it exists) and a key pair for each of
    /// `names` that has none; existing pairs are kept.
    public static func makeKeys(in directory: String, names: [String]) throws -> [MadeKey] {
        try FileManager.default.createDirectory(
            atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        try FileManager.default.setAttributes([.posixPermissions: 0o700], ofItemAtPath: directory)
        return try names.map { name in
            guard !name.isEmpty, !name.contains("/"), !name.hasPrefix(".") else {
                throw SettingError("\"\(name)\" cannot name a key: use letters, digits, '-' and '+'")
            }
            let secret = CurveKeyFile.secretPath(name, in: directory)
            if FileManager.default.fileExists(atPath: secret) {
                return MadeKey(name: name, publicKey: try CurveKeyFile.readPair(secret).publicKey, made: false)
            }
            let pair = try CurveKeyPair.generate()
            try CurveKeyFile.write(pair, name: name, in: directory)
            return MadeKey(name: name, publicKey: pair.publicKey, made: true)
        }
    }
}
