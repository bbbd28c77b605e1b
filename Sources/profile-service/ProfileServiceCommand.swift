import ArgumentParser
import Foundation
import Logging
import OnboardingAPI
import ProfileService
import ServiceRuntime

@main
struct ProfileServiceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "profile-service",
        abstract: "Keeps profiles and usernames, answers profile.* requests and publishes profile events.")

    @Option(help: "Request endpoint. Env: ONBOARDING_PROFILE_RPC. Default: \(Defaults.profileRPC)")
    var rpc: String?

    @Option(help: "Event publisher endpoint. Env: ONBOARDING_PROFILE_EVENTS. Default: \(Defaults.profileEvents)")
    var events: String?

    @Option(help: "Auth's request endpoint, to verify sessions. Env: ONBOARDING_AUTH_RPC. Default: \(Defaults.authRPC)")
    var authRPC: String?

    @Option(help: "The SQLite database file. Env: ONBOARDING_PROFILE_DATABASE. Default: <data-dir>/profile.sqlite")
    var database: String?

    @Option(help: "How many people's profiles to cache. Default: \(ProfileService.Configuration.defaultCacheCapacity)")
    var cacheCapacity: Int?

    @OptionGroup var common: CommonServiceOptions

    @OptionGroup var retention: EventRetentionOptions

    func validate() throws {
        if let cacheCapacity, cacheCapacity < 1 {
            throw ValidationError("--cache-capacity must be at least 1.")
        }
    }

    func run() async throws {
        ServiceHost.bootstrapLogging(level: common.level)
        let logger = Logger(label: ServiceName.profile)
        let configuration = ProfileService.Configuration(
            rpc: Settings.endpoint(rpc, env: "ONBOARDING_PROFILE_RPC", default: Defaults.profileRPC),
            events: Settings.endpoint(events, env: "ONBOARDING_PROFILE_EVENTS", default: Defaults.profileEvents),
            authRPC: Settings.endpoint(authRPC, env: "ONBOARDING_AUTH_RPC", default: Defaults.authRPC),
            databasePath: database ?? Settings.environment("ONBOARDING_PROFILE_DATABASE")
                ?? URL(fileURLWithPath: common.dataDirectory).appendingPathComponent("profile.sqlite").path,
            cacheCapacity: cacheCapacity ?? ProfileService.Configuration.defaultCacheCapacity,
            serviceToken: try common.resolvedServiceToken(),
            eventRetention: try retention.retention())
        try await ServiceHost.run(name: ServiceName.profile, logger: logger) { bus in
            [try ProfileService(configuration: configuration, bus: bus, logger: logger)]
        }
    }
}
