import ArgumentParser
import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingOrchestrator
import ServiceRuntime

@main
struct OrchestratorCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "onboarding-orchestrator",
        abstract: "Turns auth events into profile checks and route intents; runs profile set-up and withdrawal clean-up.")

    @Option(help: "Where to answer requests. Env: ONBOARDING_ORCHESTRATOR_RPC. Default: \(Defaults.orchestratorRPC)")
    var rpc: String?
    @Option(help: "Where to publish route intents. Env: ONBOARDING_ROUTES. Default: \(Defaults.routes)")
    var routes: String?
    @Option(help: "auth's request endpoint. Env: ONBOARDING_AUTH_RPC. Default: \(Defaults.authRPC)")
    var authRpc: String?
    @Option(help: "auth's event publisher. Env: ONBOARDING_AUTH_EVENTS. Default: \(Defaults.authEvents)")
    var authEvents: String?
    @Option(help: "profile's request endpoint. Env: ONBOARDING_PROFILE_RPC. Default: \(Defaults.profileRPC)")
    var profileRpc: String?
    @Option(help: "profile's event publisher. Env: ONBOARDING_PROFILE_EVENTS. Default: \(Defaults.profileEvents)")
    var profileEvents: String?
    @Option(help: "image-upload's request endpoint. Env: ONBOARDING_IMAGE_RPC. Default: \(Defaults.imageRPC)")
    var imageRpc: String?
    @Option(help: "The largest image accepted. Env: ONBOARDING_MAX_IMAGE_BYTES. Default: \(Defaults.maxImageBytes)")
    var maxImageBytes: Int?
    @Option(help: "The orchestrator's SQLite database. Env: ONBOARDING_ORCHESTRATOR_DATABASE. Default: <data-dir>/orchestrator.sqlite")
    var database: String?
    @OptionGroup var retention: EventRetentionOptions
    @OptionGroup var common: CommonServiceOptions

    func run() async throws {
        ServiceHost.bootstrapLogging(level: common.level)
        let logger = Logger(label: ServiceName.orchestrator)
        let configuration = OnboardingOrchestrator.Configuration(
            rpc: Settings.endpoint(rpc, env: "ONBOARDING_ORCHESTRATOR_RPC", default: Defaults.orchestratorRPC),
            routes: Settings.endpoint(routes, env: "ONBOARDING_ROUTES", default: Defaults.routes),
            authRPC: Settings.endpoint(authRpc, env: "ONBOARDING_AUTH_RPC", default: Defaults.authRPC),
            authEvents: Settings.endpoint(authEvents, env: "ONBOARDING_AUTH_EVENTS", default: Defaults.authEvents),
            profileRPC: Settings.endpoint(profileRpc, env: "ONBOARDING_PROFILE_RPC", default: Defaults.profileRPC),
            profileEvents: Settings.endpoint(profileEvents, env: "ONBOARDING_PROFILE_EVENTS", default: Defaults.profileEvents),
            imageRPC: Settings.endpoint(imageRpc, env: "ONBOARDING_IMAGE_RPC", default: Defaults.imageRPC),
            databasePath: database ?? Settings.environment("ONBOARDING_ORCHESTRATOR_DATABASE")
                ?? URL(fileURLWithPath: common.dataDirectory).appendingPathComponent("orchestrator.sqlite").path,
            maxImageBytes: try Settings.imageLimit(maxImageBytes),
            retention: try retention.retention(),
            serviceToken: try common.resolvedServiceToken())
        try await ServiceHost.run(name: ServiceName.orchestrator, logger: logger) { bus in
            [try OnboardingOrchestrator(configuration: configuration, bus: bus, logger: logger)]
        }
    }
}
