import AuthIdentity
import AuthService
import Configuration
import Foundation
import FuzzKit
import Messaging
import OnboardingAPI
import OnboardingGateway
import OnboardingSettings
import ProfileService
import ServiceRuntime
import Testing

/// The one declaration of each setting, and everything made from it.
@Suite("Settings")
struct SettingsTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    // MARK: Names

    @Test("every key, variable and flag is declared once")
    func unique() {
        for names in [Setting.all.map(\.key), Setting.all.map(\.environmentVariable), Setting.all.map(\.flag)] {
            #expect(Set(names).count == names.count, "\(names.sorted())")
        }
        #expect(Set(Setting.all).count == Setting.all.count)
    }

    @Test("names follow from the key: auth.devMode is ONBOARDING_AUTH_DEV_MODE and --auth-dev-mode")
    func names() {
        #expect(Setting.authDevMode.environmentVariable == "ONBOARDING_AUTH_DEV_MODE")
        #expect(Setting.authDevMode.flag == "--auth-dev-mode")
        #expect(Setting.googleJWKSURL.environmentVariable == "ONBOARDING_GOOGLE_JWKS_URL")
        #expect(Setting.googleJWKSURL.flag == "--google-jwks-url")
        #expect(Setting.dataDir.fileKeyPath == ["dataDir"])
        #expect(Setting.authRPC.fileKeyPath == ["auth", "rpc"])
    }

    @Test("swift-configuration's environment provider reads each setting from the variable its declaration names")
    func environmentNames() {
        for setting in Setting.all {
            let settings = Settings(environment: [setting.environmentVariable: "x"])
            #expect(settings.raw(setting)?.text == "x", "\(setting.environmentVariable)")
            #expect(settings.raw(setting)?.source == .environment)
        }
    }

    @Test("every program's settings are flags of that program, and each setting is read by someone")
    func programs() throws {
        for setting in Setting.all { #expect(!setting.programs.isEmpty, "\(setting.key)") }
        for program in Program.allCases {
            let parsed = try Setting.parseFlags(program.settings.flatMap { [$0.flag, "1"] }, for: program)
            #expect(parsed.count == program.settings.count, "\(program)")
        }
    }

    // MARK: Precedence and kinds

    @Test("a flag beats the environment, which beats the file, which beats the default")
    func precedence() async throws {
        let file = try Self.file(#"{"auth": {"rpc": "tcp://127.0.0.1:1003", "events": "tcp://127.0.0.1:2003"}, "maxImageBytes": 77}"#)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let settings = try await Settings(
            flags: [.authRPC: "tcp://127.0.0.1:1001"],
            environment: ["ONBOARDING_AUTH_RPC": "tcp://127.0.0.1:1002", "ONBOARDING_PROFILE_RPC": "tcp://127.0.0.1:1012"],
            file: file)
        #expect(try settings.endpoint(.authRPC) == "tcp://127.0.0.1:1001")
        #expect(settings.raw(.authRPC)?.source == .flag)
        #expect(try settings.endpoint(.profileRPC) == "tcp://127.0.0.1:1012")
        #expect(try settings.endpoint(.authEvents) == "tcp://127.0.0.1:2003")
        #expect(settings.raw(.authEvents)?.source == .file(file))
        #expect(try settings.integer(.maxImageBytes) == 77, "a number in the file")
        #expect(try settings.endpoint(.routes) == Defaults.routes)
        #expect(settings.raw(.routes) == nil)
    }

    @Test("over random settings, each given by a random set of sources, the highest source wins and is named")
    func precedenceOverRandomSources() async throws {
        var random = FuzzRandom(seed: 0x5E77_1265)
        let integers = Setting.all.filter { if case .integer = $0.kind { true } else { false } }
        for round in 0..<40 {
            // A few settings, each set by any subset of the three sources, to values that say which.
            var flags: [Setting: String] = [:]
            var environment: [String: String] = [:]
            var file: [String: Any] = [:]
            var expected: [Setting: (Int, Settings.Source)] = [:]
            for _ in 0..<random.int(1...4) {
                let setting = random.pick(integers)
                guard expected[setting] == nil, case .integer(let range) = setting.kind else { continue }
                let values = (0..<3).map { _ in random.int(range.lowerBound...min(range.upperBound, range.lowerBound + 1000)) }
                let given = (0..<3).map { _ in random.chance(0.5) }
                if given[2] {
                    var node = file
                    // Nested by key: `a.b` is {"a": {"b": value}}.
                    let path = setting.fileKeyPath
                    if path.count == 1 {
                        node[path[0]] = values[2]
                    } else {
                        var inner = node[path[0]] as? [String: Any] ?? [:]
                        inner[path[1]] = values[2]
                        node[path[0]] = inner
                    }
                    file = node
                    expected[setting] = (values[2], .file(""))
                }
                if given[1] {
                    environment[setting.environmentVariable] = String(values[1])
                    expected[setting] = (values[1], .environment)
                }
                if given[0] {
                    flags[setting] = String(values[0])
                    expected[setting] = (values[0], .flag)
                }
                if !given.contains(true) { expected[setting] = (Int(setting.defaultText) ?? -1, .defaultValue) }
            }
            let path = try Self.file(String(decoding: try JSONSerialization.data(withJSONObject: file), as: UTF8.self))
            defer { try? FileManager.default.removeItem(atPath: path) }
            let settings = try await Settings(flags: flags, environment: environment, file: path)
            for (setting, (value, source)) in expected {
                #expect(try settings.optionalInteger(setting) == (source == .defaultValue && setting.defaultText == "none" ? nil : value),
                        "round \(round): \(setting)")
                let found = settings.raw(setting)?.source ?? .defaultValue
                #expect(found == (source == .file("") ? .file(path) : source), "round \(round): \(setting)")
            }
        }
    }

    @Test("ONBOARDING_CONFIG names the file when --config does not")
    func fileFromEnvironment() async throws {
        let file = try Self.file(#"{"gateway": {"trustedProxies": ["10.0.0.1", "10.0.0.2"], "heartbeatSeconds": 5}, "auth": {"devMode": true}}"#)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let settings = try await Settings(environment: ["ONBOARDING_CONFIG": file], file: nil)
        #expect(settings.list(.gatewayTrustedProxies) == ["10.0.0.1", "10.0.0.2"], "an array in the file")
        #expect(try settings.integer(.gatewayHeartbeatSeconds) == 5)
        #expect(try settings.toggle(.authDevMode), "a Boolean in the file")
    }

    @Test("a missing or malformed file fails with one line naming it")
    func badFile() async throws {
        await #expect(throws: SettingError.self) { try await Settings(environment: [:], file: "/nonexistent/onboarding.json") }
        let file = try Self.file("[1, 2]")
        defer { try? FileManager.default.removeItem(atPath: file) }
        let error = await #expect(throws: SettingError.self) { try await Settings(environment: [:], file: file) }
        #expect(error?.description.contains(file) == true)
    }

    @Test(
        "a value that cannot work names the variable, the flag, the value and what is allowed",
        arguments: [
            (Setting.maxImageBytes, "abc", "a whole number from 1 to 1073741824"),
            (Setting.maxImageBytes, "0", "a whole number from 1 to 1073741824"),
            (Setting.authRPC, "localhost:7101", "tcp://HOST:PORT"),
            (Setting.gatewayHTTP, "127.0.0.1", "http://HOST:PORT"),
            (Setting.authDevMode, "maybe", "1 or 0"),
            (Setting.logLevel, "loud", "trace, debug"),
            (Setting.googleJWKSURL, "http://keys.example.com/certs", "https://"),
        ])
    func invalid(setting: Setting, value: String, allowed: String) {
        let settings = Settings(environment: [setting.environmentVariable: value])
        let error = #expect(throws: SettingError.self) { try settings.validate(for: setting.programs.min()!) }
        let text = error?.description ?? ""
        #expect(text.contains(setting.environmentVariable) && text.contains(setting.flag), "\(text)")
        #expect(text.contains("\"\(value)\"") && text.contains(allowed) && text.contains("environment"), "\(text)")
        #expect(!text.contains("\n"))
    }

    @Test("an endpoint setting lists replicas; a replica binds the one rpc.bind and events.bind name, or the only one")
    func replicaEndpoints() throws {
        let two = Settings(environment: [
            "ONBOARDING_AUTH_RPC": "tcp://10.0.0.1:7101, tcp://10.0.0.2:7101", "ONBOARDING_SERVICE_TOKEN": "t",
        ])
        #expect(try two.endpoint(.authRPC).replicas == ["tcp://10.0.0.1:7101", "tcp://10.0.0.2:7101"])
        // The others connect to both; auth itself must be told which one it is.
        let profile = try ProfileService.Configuration(two)
        #expect(profile.authRPC.replicas.count == 2)
        let unsaid = #expect(throws: SettingError.self) { try AuthService.Configuration(two) }
        #expect(unsaid?.description.contains("ONBOARDING_RPC_BIND") == true, "\(unsaid?.description ?? "")")
        let said = Settings(
            flags: [.rpcBind: "tcp://*:7101"],
            environment: ["ONBOARDING_AUTH_RPC": "tcp://10.0.0.1:7101,tcp://10.0.0.2:7101", "ONBOARDING_SERVICE_TOKEN": "t"])
        #expect(try AuthService.Configuration(said).rpc == "tcp://*:7101")
        #expect(try AuthService.Configuration(said).events == "tcp://127.0.0.1:7102")
        for bad in ["tcp://a:1,", "tcp://a:1,tcp://a:1", "tcp://a:1,b:2"] {
            #expect(throws: SettingError.self) { try Settings(environment: ["ONBOARDING_AUTH_RPC": bad]).validate(for: .profile) }
        }
    }

    @Test("a secret is never printed: not in errors, not in the effective configuration")
    func secrets() {
        let settings = Settings(flags: [.serviceToken: "sekrit"], environment: ["ONBOARDING_KAKAO_ADMIN_KEY": "admin-sekrit"])
        let printed = settings.effectiveConfiguration(for: .auth)
        #expect(!printed.contains("sekrit"))
        #expect(printed.contains("ONBOARDING_SERVICE_TOKEN") && printed.contains("<secret>  (flag)"))
        #expect(!settings.invalid(.serviceToken, "sekrit").description.contains("sekrit"))
    }

    @Test("the effective configuration lists every setting of the program once, with its source")
    func effective() {
        let settings = Settings(environment: ["ONBOARDING_DATA_DIR": "/srv/onboarding"])
        let lines = settings.effectiveConfiguration(for: .profile).split(separator: "\n")
        #expect(lines.count == Program.profile.settings.count)
        #expect(lines.contains { $0.contains("ONBOARDING_DATA_DIR") && $0.contains("/srv/onboarding  (environment)") })
        #expect(lines.contains { $0.contains("ONBOARDING_PROFILE_DATABASE") && $0.contains("/srv/onboarding/profile.sqlite  (default)") })
    }

    // MARK: Flags

    @Test("flags: --name value, --name=value, a bare on/off flag")
    func flags() throws {
        let parsed = try Setting.parseFlags(
            ["--auth-rpc", "tcp://127.0.0.1:1", "--max-sessions-per-account=3", "--auth-dev-mode", "--log-level", "debug"],
            for: .auth)
        #expect(parsed == [.authRPC: "tcp://127.0.0.1:1", .maxSessionsPerAccount: "3", .authDevMode: "1", .logLevel: "debug"])
    }

    @Test("an unknown flag, another program's flag, or a flag without a value is refused in one line")
    func badFlags() {
        let unknown = #expect(throws: SettingError.self) { try Setting.parseFlags(["--bogus", "1"], for: .profile) }
        #expect(unknown?.description.contains("profile-service --help") == true)
        let other = #expect(throws: SettingError.self) { try Setting.parseFlags(["--google-client-ids", "x"], for: .profile) }
        #expect(other?.description.contains("auth-service") == true)
        let bare = #expect(throws: SettingError.self) { try Setting.parseFlags(["--auth-rpc"], for: .auth) }
        #expect(bare?.description.contains("needs a value") == true)
    }

    @Test("--help lists each of the program's settings with its variable and default, within 80 columns")
    func help() {
        for program in Program.allCases {
            let help = Setting.help(for: program)
            for setting in program.settings {
                #expect(help.contains(setting.flag), "\(program) \(setting.flag)")
                #expect(help.contains(setting.environmentVariable), "\(program) \(setting.environmentVariable)")
            }
            for line in help.split(separator: "\n") { #expect(line.count <= 80, "\(line)") }
        }
    }

    // MARK: Everything else that names settings agrees with the declarations

    @Test("the README's Configuration tables are the ones the declarations make (ONBOARDING_UPDATE_README=1 rewrites them)")
    func readme() throws {
        try Self.expectReadmeSection("settings", made: Setting.markdownTables())
    }

    @Test("the README's rights table is the one BusRights makes (ONBOARDING_UPDATE_README=1 rewrites it)")
    func rightsTable() throws {
        try Self.expectReadmeSection("rights", from: "Sources/OnboardingAPI/BusRights.swift", made: BusRights.markdownTable() + "\n")
    }

    @Test("the README's metrics table is the one the metric definitions make (ONBOARDING_UPDATE_README=1 rewrites it)")
    func metricsTable() throws {
        try Self.expectReadmeSection(
            "metrics", from: "Sources/ServiceRuntime/Metrics/MetricCatalog.swift", made: MetricDefinition.markdownTable())
    }

    /// Expects the README's text between `<!-- NAME: made from SOURCE; SettingsTests keeps them
    /// equal -->` and `<!-- end of NAME -->` to be `made`; with `ONBOARDING_UPDATE_README=1`,
    /// rewrites it instead.
    static func expectReadmeSection(
        _ name: String, from source: String = "Sources/OnboardingSettings/Setting+Catalog.swift", made expected: String
    ) throws {
        let path = root.appendingPathComponent("README.md").path
        let readme = try String(contentsOfFile: path, encoding: .utf8)
        let begin = "<!-- \(name): made from \(source); SettingsTests keeps them equal -->\n"
        let end = "<!-- end of \(name) -->"
        guard let start = readme.range(of: begin), let stop = readme.range(of: end, range: start.upperBound..<readme.endIndex)
        else {
            Issue.record("README.md has no \(name) between \(begin) and \(end)")
            return
        }
        let actual = String(readme[start.upperBound..<stop.lowerBound])
        if actual != expected, ProcessInfo.processInfo.environment["ONBOARDING_UPDATE_README"] == "1" {
            try (String(readme[..<start.upperBound]) + expected + String(readme[stop.lowerBound...]))
                .write(toFile: path, atomically: true, encoding: .utf8)
            return
        }
        #expect(actual == expected, "run ONBOARDING_UPDATE_README=1 swift test --filter SettingsTests to rewrite the \(name) table")
    }

    @Test("compose's default endpoints are the declared defaults")
    func compose() throws {
        let script = try String(contentsOf: Self.root.appendingPathComponent("compose/onboarding"), encoding: .utf8)
        var checked = 0
        for setting in Setting.all where [.endpoint, .endpoints, .httpAddress].contains(setting.kind) {
            // Each replica's own: `up --replicas` gives them to the second and later ones.
            if setting == .rpcBind || setting == .eventsBind { continue }
            guard case .value = setting.defaultValue else {
                // Off unless set (the metrics addresses): compose's `up` gives each one.
                #expect(script.contains("export \(setting.environmentVariable)=${\(setting.environmentVariable)-http://127.0.0.1:91"))
                continue
            }
            let line = "export \(setting.environmentVariable)=${\(setting.environmentVariable):-\(setting.defaultText)}"
            #expect(script.contains(line), "compose/onboarding should have: \(line)")
            checked += 1
        }
        #expect(checked == 8)
    }

    @Test("the libraries' own defaults are the declared ones")
    func libraryDefaults() throws {
        let identity = IdentityProviderSettings()
        #expect(identity.google.issuers == Setting.googleIssuers.defaultText.split(separator: ",").map(String.init))
        #expect(identity.google.jwksURL == Setting.googleJWKSURL.defaultText)
        #expect(identity.apple.issuers == [Setting.appleIssuers.defaultText])
        #expect(identity.apple.jwksURL == Setting.appleJWKSURL.defaultText)
        #expect(identity.kakao.issuers == [Setting.kakaoIssuers.defaultText])
        #expect(identity.kakao.jwksURL == Setting.kakaoJWKSURL.defaultText)
        #expect(identity.naver.profileURL == Setting.naverProfileURL.defaultText)
        #expect(Int(identity.clockLeeway) == Int(Setting.authTokenLeewaySeconds.defaultText))
        let apple = UnlinkSettings.Apple(teamID: "", keyID: "", privateKeyPEM: "", clientID: "")
        #expect(apple.tokenURL == Setting.appleTokenURL.defaultText && apple.revokeURL == Setting.appleRevokeURL.defaultText)
        #expect(UnlinkSettings.Kakao(adminKey: "").unlinkURL == Setting.kakaoUnlinkURL.defaultText)
        #expect(UnlinkSettings.Naver(clientID: "", clientSecret: "").tokenURL == Setting.naverTokenURL.defaultText)
        #expect(UnlinkSettings.Google().revokeURL == Setting.googleRevokeURL.defaultText)
        let gateway = GatewayConfiguration()
        #expect("http://\(gateway.host):\(gateway.port)" == Setting.gatewayHTTP.defaultText)
        #expect(gateway.heartbeat == .seconds(Int(Setting.gatewayHeartbeatSeconds.defaultText)!))
        #expect(gateway.idleTimeout == .seconds(Int(Setting.gatewayIdleTimeoutSeconds.defaultText)!))
        #expect(SessionPolicy().lifetime == TimeInterval(Int(Setting.sessionLifetimeDays.defaultText)! * 86_400))
        #expect(gateway.maxImageBytes == Int(Setting.maxImageBytes.defaultText))
        #expect(ProfileService.Configuration().cacheCapacity == Int(Setting.profileCacheCapacity.defaultText))
    }

    @Test("the settings a program reads make the configuration its service is built from")
    func serviceConfiguration() throws {
        let settings = Settings(
            flags: [.gatewayHTTP: "http://[::1]:9090", .gatewayTrustedProxies: "10.0.0.1, 10.0.0.2"],
            environment: ["ONBOARDING_SERVICE_TOKEN": "t", "ONBOARDING_GATEWAY_USERNAME_CHECKS_PER_SECOND": "7"])
        let gateway = try GatewayConfiguration(settings)
        #expect(gateway.host == "::1" && gateway.port == 9090)
        #expect(gateway.trustedProxies == ["10.0.0.1", "10.0.0.2"])
        #expect(gateway.usernameCheckLimit.perSecond == 7 && gateway.usernameCheckLimit.burst == 28)
        #expect(gateway.serviceToken == "t")
        let profile = try ProfileService.Configuration(Settings(environment: ["ONBOARDING_DATA_DIR": "/srv/x", "ONBOARDING_SERVICE_TOKEN": "t"]))
        #expect(profile.databasePath == "/srv/x/profile.sqlite")
        let idle = try GatewayConfiguration(Settings(environment: ["ONBOARDING_SERVICE_TOKEN": "t", "ONBOARDING_GATEWAY_IDLE_TIMEOUT_SECONDS": "5"]))
        #expect(idle.idleTimeout == .seconds(5))
        #expect(throws: SettingError.self) {
            try GatewayConfiguration(Settings(environment: ["ONBOARDING_SERVICE_TOKEN": "t", "ONBOARDING_GATEWAY_IDLE_TIMEOUT_SECONDS": "0"]))
        }
    }

    @Test("a session lifetime in seconds, for tests and demos, wins over the days; the days alone still work; 30 days unless set")
    func sessionLifetime() throws {
        func lifetime(_ environment: [String: String]) throws -> TimeInterval {
            try AuthService.Configuration(Settings(environment: environment.merging(["ONBOARDING_SERVICE_TOKEN": "t"]) { a, _ in a }))
                .sessions.lifetime
        }
        #expect(try lifetime([:]) == 30 * 86_400)
        #expect(try lifetime(["ONBOARDING_SESSION_LIFETIME_DAYS": "2"]) == 2 * 86_400)
        #expect(try lifetime(["ONBOARDING_SESSION_LIFETIME_SECONDS": "90"]) == 90)
        #expect(try lifetime(["ONBOARDING_SESSION_LIFETIME_SECONDS": "90", "ONBOARDING_SESSION_LIFETIME_DAYS": "2"]) == 90)
        #expect(throws: SettingError.self) { try lifetime(["ONBOARDING_SESSION_LIFETIME_SECONDS": "0"]) }
        #expect(throws: SettingError.self) { try lifetime(["ONBOARDING_SESSION_LIFETIME_SECONDS": "90s"]) }
        // A lifetime of seconds still slides with each use: its last use is recorded often enough.
        let short = try AuthService.Configuration(
            Settings(environment: ["ONBOARDING_SERVICE_TOKEN": "t", "ONBOARDING_SESSION_LIFETIME_SECONDS": "240"])).sessions
        #expect(short.renewalInterval == 10)
        #expect(SessionPolicy().renewalInterval == 3600)
    }

    static func file(_ text: String) throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("onboarding-\(UUID().uuidString).json").path
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }
}
