import Messaging
import OnboardingAPI

/// Everything the gateway is told at start.
public struct GatewayConfiguration: Sendable {
    /// Where it listens for HTTP: a host name or address.
    public var host: String
    /// Its TCP port; 0 picks a free one (tests).
    public var port: Int
    public var authRPC: Endpoint
    public var profileRPC: Endpoint
    public var orchestratorRPC: Endpoint
    /// The orchestrator's route-intent publisher, followed for the live intent streams.
    public var routes: Endpoint
    /// The services' shared secret: the gateway replays route intents with `events.after`,
    /// which requires it.
    public var serviceToken: String?
    /// The largest image a set-up may carry; a set-up body may be 64 KiB more.
    public var maxImageBytes: Int
    /// How long one call on the bus waits for its reply.
    public var callTimeout: Duration
    /// How long a call that is safe to repeat keeps trying.
    public var callDeadline: Duration
    /// How often an idle intent stream sends a heartbeat comment.
    public var heartbeat: Duration
    /// How long a connection may sit idle (no request being read or answered) before the
    /// gateway closes it. An open intent stream is a request being answered: never idle.
    public var idleTimeout: Duration
    /// How many intents a stream may have waiting for a slow client before the gateway closes
    /// it (the client reconnects with `Last-Event-ID` and loses nothing).
    public var streamBuffer: Int
    /// A client that reconnects further behind than this many route intents (everyone's, not
    /// only its own) gets the intent in force instead of a replay.
    public var maxReplay: UInt64
    /// `POST /v1/session` per client address.
    public var signInLimit: RateLimiter.Rule
    /// `GET /v1/usernames/{username}` per client address.
    public var usernameCheckLimit: RateLimiter.Rule
    /// Peers whose `X-Forwarded-For` is believed (see ``ClientAddress``).
    public var trustedProxies: Set<String>
    /// The name the gateway signs its bus messages with.
    public var name: String

    public init(
        host: String = GatewayDefaults.host,
        port: Int = GatewayDefaults.port,
        authRPC: Endpoint = Defaults.authRPC,
        profileRPC: Endpoint = Defaults.profileRPC,
        orchestratorRPC: Endpoint = Defaults.orchestratorRPC,
        routes: Endpoint = Defaults.routes,
        serviceToken: String? = nil,
        maxImageBytes: Int = Defaults.maxImageBytes,
        callTimeout: Duration = Defaults.requestTimeout,
        callDeadline: Duration = Defaults.retryDeadline,
        heartbeat: Duration = .seconds(15),
        idleTimeout: Duration = .seconds(75),
        streamBuffer: Int = 256,
        maxReplay: UInt64 = 100_000,
        signInLimit: RateLimiter.Rule = .perMinute(30),
        usernameCheckLimit: RateLimiter.Rule = RateLimiter.Rule(burst: 20, perSecond: 5),
        trustedProxies: Set<String> = [],
        name: String = GatewayDefaults.name
    ) {
        self.host = host
        self.port = port
        self.authRPC = authRPC
        self.profileRPC = profileRPC
        self.orchestratorRPC = orchestratorRPC
        self.routes = routes
        self.serviceToken = serviceToken
        self.maxImageBytes = maxImageBytes
        self.callTimeout = callTimeout
        self.callDeadline = callDeadline
        self.heartbeat = heartbeat
        self.idleTimeout = idleTimeout
        self.streamBuffer = streamBuffer
        self.maxReplay = maxReplay
        self.signInLimit = signInLimit
        self.usernameCheckLimit = usernameCheckLimit
        self.trustedProxies = trustedProxies
        self.name = name
    }
}

/// The gateway's defaults: where `ONBOARDING_GATEWAY_HTTP`'s default listens.
public enum GatewayDefaults {
    public static let host = "127.0.0.1"
    public static let port = 8080
    public static let name = "onboarding-gateway"
}
