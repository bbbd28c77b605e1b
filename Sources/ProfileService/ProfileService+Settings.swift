import OnboardingAPI
import OnboardingSettings
import ServiceRuntime

extension ProfileService.Configuration {
    /// profile's configuration from the settings it was started with.
    ///
    /// - Throws: ``SettingError`` naming a setting that cannot work.
    public init(_ settings: Settings) throws {
        self.init(
            rpc: try settings.bindEndpoint(.rpcBind, of: .profileRPC),
            events: try settings.bindEndpoint(.eventsBind, of: .profileEvents),
            authRPC: try settings.endpoint(.authRPC),
            databasePath: settings.databasePath(.profileDatabase, name: "profile.sqlite"),
            cacheCapacity: try settings.integer(.profileCacheCapacity),
            serviceToken: try settings.serviceToken(create: true),
            eventRetention: try Outbox.Retention(settings))
    }
}
