import OnboardingAPI
import OnboardingSettings
import ProfileService
import ServiceHosting
import ServiceLifecycle

@main
enum ProfileServiceMain: HostedProgram {
    static let program = Program.profile
    static let name = ServiceName.profile
    static let abstract = "Keeps profiles and usernames, answers profile.* requests and publishes profile events."

    static func services(_ host: Host) async throws -> [any Service] {
        [try ProfileService(configuration: .init(host.settings), bus: host.bus, logger: host.logger)]
    }
}
