import AuthIdentity
import Foundation
import OnboardingAPI
import OnboardingSettings
import ServiceRuntime

extension AuthService.Configuration {
    /// auth's configuration from the settings it was started with.
    ///
    /// The session lifetime is `ONBOARDING_SESSION_LIFETIME_SECONDS` when that is set, otherwise
    /// `ONBOARDING_SESSION_LIFETIME_DAYS` (30 by default).
    ///
    /// - Throws: ``SettingError`` or ``ServiceError`` naming a setting that cannot work.
    public init(_ settings: Settings) throws {
        let lifetime =
            try settings.optionalInteger(.sessionLifetimeSeconds).map(TimeInterval.init)
            ?? TimeInterval(try settings.integer(.sessionLifetimeDays)) * 86_400
        self.init(
            rpc: try settings.bindEndpoint(.rpcBind, of: .authRPC),
            events: try settings.bindEndpoint(.eventsBind, of: .authEvents),
            databasePath: settings.databasePath(.authDatabase, name: "auth.sqlite"),
            devMode: try settings.toggle(.authDevMode),
            serviceToken: try settings.serviceToken(create: true),
            eventRetention: try Outbox.Retention(settings),
            identityProviders: try IdentityProviderSettings(settings),
            sessions: SessionPolicy(
                lifetime: lifetime,
                maximumPerAccount: try settings.integer(.maxSessionsPerAccount)),
            unlink: try UnlinkConfiguration(settings))
    }
}
