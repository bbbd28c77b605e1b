import OnboardingAPI
import OnboardingSettings
import ServiceRuntime

extension OnboardingOrchestrator.Configuration {
    /// The orchestrator's configuration from the settings it was started with.
    ///
    /// - Throws: ``SettingError`` naming a setting that cannot work.
    public init(_ settings: Settings) throws {
        self.init(
            rpc: try settings.bindEndpoint(.rpcBind, of: .orchestratorRPC),
            routes: try settings.bindEndpoint(.eventsBind, of: .routes),
            authRPC: try settings.endpoint(.authRPC),
            authEvents: try settings.endpoint(.authEvents),
            profileRPC: try settings.endpoint(.profileRPC),
            profileEvents: try settings.endpoint(.profileEvents),
            imageRPC: try settings.endpoint(.imageRPC),
            databasePath: settings.databasePath(.orchestratorDatabase, name: "orchestrator.sqlite"),
            maxImageBytes: try settings.integer(.maxImageBytes),
            retention: try Outbox.Retention(settings),
            serviceToken: try settings.serviceToken(create: true))
    }
}
