import OnboardingAPI
import OnboardingOrchestrator
import OnboardingSettings
import ServiceHosting
import ServiceLifecycle

@main
enum OrchestratorMain: HostedProgram {
    static let program = Program.orchestrator
    static let name = ServiceName.orchestrator
    static let abstract = "Turns auth events into profile checks and route intents; runs profile set-up and withdrawal clean-up."

    static func services(_ host: Host) async throws -> [any Service] {
        [try OnboardingOrchestrator(configuration: .init(host.settings), bus: host.bus, logger: host.logger)]
    }
}
