import OnboardingAPI
import OnboardingSettings

extension GatewayConfiguration {
    /// The gateway's configuration from the settings it was started with.
    ///
    /// - Throws: ``SettingError`` naming a setting that cannot work.
    public init(_ settings: Settings) throws {
        let (host, port) = try settings.httpAddress(.gatewayHTTP)
        let usernameChecks = try settings.integer(.gatewayUsernameChecksPerSecond)
        self.init(
            host: host, port: port,
            authRPC: try settings.endpoint(.authRPC),
            profileRPC: try settings.endpoint(.profileRPC),
            orchestratorRPC: try settings.endpoint(.orchestratorRPC),
            routes: try settings.endpoint(.routes),
            serviceToken: try settings.serviceToken(create: true),
            maxImageBytes: try settings.integer(.maxImageBytes),
            heartbeat: .seconds(try settings.integer(.gatewayHeartbeatSeconds)),
            idleTimeout: .seconds(try settings.integer(.gatewayIdleTimeoutSeconds)),
            signInLimit: .perMinute(try settings.integer(.gatewaySignInsPerMinute)),
            usernameCheckLimit: RateLimiter.Rule(burst: Double(usernameChecks * 4), perSecond: Double(usernameChecks)),
            trustedProxies: Set(settings.list(.gatewayTrustedProxies) ?? []))
    }
}
