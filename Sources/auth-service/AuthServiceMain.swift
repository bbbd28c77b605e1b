import AuthPostgres
import AuthService
import OnboardingAPI
import OnboardingSettings
import ServiceHosting
import ServiceLifecycle

@main
enum AuthServiceMain: HostedProgram {
    static let program = Program.auth
    static let name = ServiceName.auth
    static let abstract = "Signs people in with a social provider, keeps their sessions and publishes auth events."

    static func services(_ host: Host) async throws -> [any Service] {
        var configuration = try AuthService.Configuration(host.settings)
        configuration.database = try AuthPostgresDatabase(host.settings)
        return [try AuthService(configuration: configuration, bus: host.bus, logger: host.logger)]
    }
}
