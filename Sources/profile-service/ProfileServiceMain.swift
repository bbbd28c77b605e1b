import OnboardingAPI
import OnboardingSettings
import ProfilePostgres
import ProfileService
import ServiceHosting
import ServiceLifecycle

@main
enum ProfileServiceMain: HostedProgram {
    static let program = Program.profile
    static let name = ServiceName.profile
    static let abstract = "Keeps profiles and usernames, answers profile.* requests and publishes profile events."

    static func services(_ host: Host) async throws -> [any Service] {
        var configuration = try ProfileService.Configuration(host.settings)
        configuration.database = try ProfilePostgresDatabase(host.settings)
        return [try ProfileService(configuration: configuration, bus: host.bus, logger: host.logger)]
    }
}
