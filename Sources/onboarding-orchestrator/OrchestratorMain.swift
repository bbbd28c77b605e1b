import OnboardingAPI
import OnboardingOrchestrator
import OnboardingSettings
import OrchestratorPostgres
import ServiceHosting
import ServiceLifecycle

@main
enum OrchestratorMain: HostedProgram {
    static let program = Program.orchestrator
    static let name = ServiceName.orchestrator
    static let abstract = "Turns auth events into profile checks and route intents; runs profile set-up and withdrawal clean-up."

    static func services(_ host: Host) async throws -> [any Service] {
        var configuration = try OnboardingOrchestrator.Configuration(host.settings)
        configuration.database = try OrchestratorPostgresDatabase(host.settings)
        return [try OnboardingOrchestrator(configuration: configuration, bus: host.bus, logger: host.logger)]
    }
}
