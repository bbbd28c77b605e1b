import ArgumentParser
import Foundation
import Messaging
import OnboardingAPI

/// The session settings as flags, each with its environment variable as fallback.
public struct SessionOptions: ParsableArguments {
    @Option(help: "Days a session lives unused; each use slides it (1 to 3650). Env: ONBOARDING_SESSION_LIFETIME_DAYS. Default: 30")
    var sessionLifetimeDays: Int?

    @Option(help: "Live sessions an account may hold; a sign-in beyond ends the least recently used (1 to 1000). Env: ONBOARDING_MAX_SESSIONS_PER_ACCOUNT. Default: 10")
    var maxSessionsPerAccount: Int?

    public init() {}

    /// - Throws: ``ServiceError`` `invalidRequest` naming the setting that is out of range.
    public func policy() throws -> SessionPolicy {
        let days = try Settings.integer(sessionLifetimeDays, env: "ONBOARDING_SESSION_LIFETIME_DAYS", default: 30)
        guard (1...3650).contains(days) else {
            throw ServiceError(
                .invalidRequest, "The session lifetime (--session-lifetime-days, ONBOARDING_SESSION_LIFETIME_DAYS) must be from 1 to 3650 days, not \(days).")
        }
        let count = try Settings.integer(maxSessionsPerAccount, env: "ONBOARDING_MAX_SESSIONS_PER_ACCOUNT", default: 10)
        guard (1...1000).contains(count) else {
            throw ServiceError(
                .invalidRequest,
                "The sessions per account (--max-sessions-per-account, ONBOARDING_MAX_SESSIONS_PER_ACCOUNT) must be from 1 to 1000, not \(count).")
        }
        return SessionPolicy(lifetime: TimeInterval(days) * 86_400, maximumPerAccount: count)
    }
}
