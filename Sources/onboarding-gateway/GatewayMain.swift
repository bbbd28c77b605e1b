import OnboardingGateway
import OnboardingSettings
import ServiceHosting
import ServiceLifecycle

@main
enum GatewayMain: HostedProgram {
    static let program = Program.gateway
    static let name = GatewayDefaults.name
    static let abstract = "The app's front door: HTTP and a live intent stream (Server-Sent Events) over the onboarding bus."

    static func services(_ host: Host) async throws -> [any Service] {
        [OnboardingGateway(configuration: try GatewayConfiguration(host.settings), bus: host.bus, logger: host.logger)]
    }
}
