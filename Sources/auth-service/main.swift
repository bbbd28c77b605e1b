import ArgumentParser
import AuthService
import Logging
import OnboardingAPI
import ServiceRuntime

@main
struct AuthServiceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "auth-service",
        abstract: "Signs people in with a social provider, keeps their sessions and publishes auth events.")

    @Option(help: "Request endpoint. Env: ONBOARDING_AUTH_RPC. Default: \(Defaults.authRPC)")
    var rpc: String?

    @Option(help: "Event publisher endpoint. Env: ONBOARDING_AUTH_EVENTS. Default: \(Defaults.authEvents)")
    var events: String?

    @Option(help: "SQLite database file. Env: ONBOARDING_AUTH_DATABASE. Default: <data-dir>/auth.sqlite")
    var database: String?

    @Flag(help: "Accept provider subjects without ID tokens, for local use only. Env: ONBOARDING_AUTH_DEV_MODE=1. Default: off")
    var devMode = false

    @OptionGroup var common: CommonServiceOptions

    @OptionGroup var retention: EventRetentionOptions

    @OptionGroup(title: "Identity providers (ignored in dev mode)") var identity: IdentityProviderOptions

    @OptionGroup(title: "Sessions") var sessions: SessionOptions

    func run() async throws {
        ServiceHost.bootstrapLogging(level: common.level)
        let logger = Logger(label: ServiceName.auth)
        let configuration = AuthService.Configuration(
            rpc: Settings.endpoint(rpc, env: "ONBOARDING_AUTH_RPC", default: Defaults.authRPC),
            events: Settings.endpoint(events, env: "ONBOARDING_AUTH_EVENTS", default: Defaults.authEvents),
            databasePath: database ?? Settings.environment("ONBOARDING_AUTH_DATABASE") ?? "\(common.dataDirectory)/auth.sqlite",
            devMode: devMode || ["1", "true"].contains(Settings.environment("ONBOARDING_AUTH_DEV_MODE")?.lowercased()),
            serviceToken: try common.resolvedServiceToken(),
            eventRetention: try retention.retention(),
            identityProviders: try identity.settings(),
            sessions: try sessions.policy(),
            unlink: try UnlinkConfiguration.fromEnvironment())
        try await ServiceHost.run(name: ServiceName.auth, logger: logger) { bus in
            [try AuthService(configuration: configuration, bus: bus, logger: logger)]
        }
    }
}
