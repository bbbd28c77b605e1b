/// Every setting of the system, each declared once. `Setting.all` lists them in this order.
extension Setting {
    // MARK: Endpoints

    public static let authRPC = Setting(
        "auth.rpc", .endpoints, default: .value("tcp://127.0.0.1:7101"),
        "auth's request endpoint, one per replica (auth binds its own, see rpc.bind; the others connect to every one)",
        group: .endpoints, programs: [.auth, .profile, .orchestrator, .gateway, .tap, .client, .chaos, .bench])
    public static let authEvents = Setting(
        "auth.events", .endpoints, default: .value("tcp://127.0.0.1:7102"),
        "auth's event publisher, one per replica (see events.bind; the orchestrator connects to every one)",
        group: .endpoints, programs: [.auth, .orchestrator])
    public static let profileRPC = Setting(
        "profile.rpc", .endpoints, default: .value("tcp://127.0.0.1:7201"),
        "profile's request endpoint, one per replica",
        group: .endpoints, programs: [.profile, .orchestrator, .gateway, .tap, .client, .chaos, .bench])
    public static let profileEvents = Setting(
        "profile.events", .endpoints, default: .value("tcp://127.0.0.1:7202"),
        "profile's event publisher, one per replica",
        group: .endpoints, programs: [.profile, .orchestrator])
    public static let imageRPC = Setting(
        "image.rpc", .endpoints, default: .value("tcp://127.0.0.1:7301"),
        "image-upload's request endpoint, one per replica",
        group: .endpoints, programs: [.imageUpload, .orchestrator, .tap, .client, .chaos, .bench])
    public static let orchestratorRPC = Setting(
        "orchestrator.rpc", .endpoints, default: .value("tcp://127.0.0.1:7401"),
        "the orchestrator's request endpoint, one per replica (only the one that leads binds it)",
        group: .endpoints, programs: [.orchestrator, .gateway, .tap, .client, .chaos, .bench])
    public static let routes = Setting(
        "routes", .endpoints, default: .value("tcp://127.0.0.1:7402"),
        "the orchestrator's route-intent publisher, one per replica",
        group: .endpoints, programs: [.orchestrator, .gateway, .tap, .client, .chaos, .bench])
    public static let rpcBind = Setting(
        "rpc.bind", .endpoint, default: .derived("the service's own request endpoint, when it lists one"),
        "the address this replica binds for requests: one of its service's list, or the same port on tcp://* or an interface's IP",
        group: .endpoints, programs: [.auth, .profile, .imageUpload, .orchestrator])
    public static let eventsBind = Setting(
        "events.bind", .endpoint, default: .derived("the service's own event publisher, when it lists one"),
        "the address this replica binds its event (or route-intent) publisher at, as rpc.bind",
        group: .endpoints, programs: [.auth, .profile, .orchestrator])
    public static let gatewayHTTP = Setting(
        "gateway.http", .httpAddress, default: .value("http://127.0.0.1:8080"),
        "where the gateway listens for apps (plain HTTP: TLS is for the proxy in front of it)",
        group: .endpoints, programs: [.gateway])

    // MARK: Storage

    public static let dataDir = Setting(
        "dataDir", .path, default: .value(".data"),
        "where databases, images and the service token are kept (compose: <repo>/.data)",
        group: .storage, programs: Set(Program.allCases))
    public static let authDatabase = Setting(
        "auth.database", .path, default: .derived("<data-dir>/auth.sqlite"),
        "auth's SQLite database", group: .storage, programs: [.auth, .chaos])
    public static let profileDatabase = Setting(
        "profile.database", .path, default: .derived("<data-dir>/profile.sqlite"),
        "profile's SQLite database", group: .storage, programs: [.profile, .chaos])
    public static let orchestratorDatabase = Setting(
        "orchestrator.database", .path, default: .derived("<data-dir>/orchestrator.sqlite"),
        "the orchestrator's SQLite database", group: .storage, programs: [.orchestrator])
    public static let postgresURL = Setting(
        "postgres.url", .text, default: .unset("SQLite files in the data directory"),
        "a PostgreSQL database to keep the stores in instead (postgresql://USER[:PASSWORD]@HOST:PORT/DATABASE[?sslmode=require]); each service keeps its tables in its own schema",
        secret: true, group: .storage, programs: [.auth, .profile, .orchestrator, .chaos])
    public static let authPostgresSchema = Setting(
        "auth.postgresSchema", .text, default: .value("auth"),
        "the schema auth's tables live in, with postgres.url", group: .storage, programs: [.auth, .chaos])
    public static let profilePostgresSchema = Setting(
        "profile.postgresSchema", .text, default: .value("profile"),
        "the schema profile's tables live in, with postgres.url", group: .storage, programs: [.profile, .chaos])
    public static let orchestratorPostgresSchema = Setting(
        "orchestrator.postgresSchema", .text, default: .value("orchestrator"),
        "the schema the orchestrator's tables live in, with postgres.url", group: .storage, programs: [.orchestrator])
    public static let imageDir = Setting(
        "image.dir", .path, default: .derived("<data-dir>/images"),
        "where image-upload keeps images (folders 0700, files 0600)", group: .storage, programs: [.imageUpload, .chaos])
    public static let eventRetentionHours = Setting(
        "eventRetentionHours", .integer(1...87_600), default: .value("24"),
        "how many hours of published events stay replayable (events.after)",
        group: .storage, programs: Program.publishers)
    public static let profileCacheCapacity = Setting(
        "profile.cacheCapacity", .integer(1...10_000_000), default: .value("100000"),
        "how many people's profiles profile keeps in memory", group: .storage, programs: [.profile])

    // MARK: Process

    public static let serviceToken = Setting(
        "serviceToken", .text, default: .derived("read from <data-dir>/service.token, created by the first service to start"),
        "the secret the services share for calls between them (prefer the file or the variable: other local users can see command lines)",
        secret: true, group: .process, programs: Program.servers.union([.tap, .chaos]))
    public static let logLevel = Setting(
        "logLevel", .choice(["trace", "debug", "info", "notice", "warning", "error", "critical"]), default: .value("info"),
        "the least severe log line written", group: .process, programs: Program.servers)
    public static let exitWithParent = Setting(
        "exitWithParent", .integer(1...Int(Int32.max)), default: .unset("none"),
        "a pid: stop (gracefully) once the parent process is no longer that one (the tests set it, so a crashed run leaves nothing behind)",
        group: .process, programs: Program.servers)

    // MARK: Images

    public static let maxImageBytes = Setting(
        "maxImageBytes", .integer(1...(1 << 30)), default: .value("5242880"),
        "the largest image accepted, in bytes (5 MiB)", group: .images, programs: [.imageUpload, .orchestrator, .gateway])
    public static let maxImagePixels = Setting(
        "maxImagePixels", .integer(1...1_000_000_000), default: .value("40000000"),
        "the most pixels (width × height, read from the header before decoding) an image may have",
        group: .images, programs: [.imageUpload])
    public static let maxImageSide = Setting(
        "maxImageSide", .integer(1...100_000), default: .value("10000"),
        "the longest side an image may have, in pixels", group: .images, programs: [.imageUpload])
    public static let imageDecodeThreads = Setting(
        "imageDecodeThreads", .integer(1...64), default: .value("2"),
        "how many images are decoded at once, each on a thread of its own", group: .images, programs: [.imageUpload])

    // MARK: Sessions

    public static let authDevMode = Setting(
        "auth.devMode", .toggle, default: .value("0"),
        "accept a provider subject without an ID token, for local use only (compose: 1)",
        group: .sessions, programs: [.auth])
    public static let sessionLifetimeDays = Setting(
        "sessionLifetimeDays", .integer(1...3650), default: .value("30"),
        "days a session lives unused; each use slides it", group: .sessions, programs: [.auth])
    public static let sessionLifetimeSeconds = Setting(
        "sessionLifetimeSeconds", .integer(1...(3650 * 86_400)), default: .unset("none: the days decide"),
        "seconds a session lives unused, for tests and demos; when set, it wins over ONBOARDING_SESSION_LIFETIME_DAYS",
        group: .sessions, programs: [.auth])
    public static let maxSessionsPerAccount = Setting(
        "maxSessionsPerAccount", .integer(1...1000), default: .value("10"),
        "live sessions an account may hold; a sign-in beyond ends the least recently used",
        group: .sessions, programs: [.auth])

    // MARK: Identity providers

    public static let googleClientIDs = Setting(
        "google.clientIds", .list, default: .unset("none: Google sign-in refused"),
        "Google client ids", group: .identity, programs: [.auth])
    public static let googleIssuers = Setting(
        "google.issuers", .list, default: .value("https://accounts.google.com,accounts.google.com"),
        "accepted Google issuers", group: .identity, programs: [.auth])
    public static let googleJWKSURL = Setting(
        "google.jwksUrl", .url, default: .value("https://www.googleapis.com/oauth2/v3/certs"),
        "Google's key set", group: .identity, programs: [.auth])
    public static let appleClientIDs = Setting(
        "apple.clientIds", .list, default: .unset("none: Apple sign-in refused"),
        "Apple client ids (bundle or service ids)", group: .identity, programs: [.auth])
    public static let appleIssuers = Setting(
        "apple.issuers", .list, default: .value("https://appleid.apple.com"),
        "accepted Apple issuers", group: .identity, programs: [.auth])
    public static let appleJWKSURL = Setting(
        "apple.jwksUrl", .url, default: .value("https://appleid.apple.com/auth/keys"),
        "Apple's key set", group: .identity, programs: [.auth])
    public static let kakaoClientIDs = Setting(
        "kakao.clientIds", .list, default: .unset("none: Kakao sign-in refused"),
        "Kakao app keys (client ids)", group: .identity, programs: [.auth])
    public static let kakaoIssuers = Setting(
        "kakao.issuers", .list, default: .value("https://kauth.kakao.com"),
        "accepted Kakao issuers", group: .identity, programs: [.auth])
    public static let kakaoJWKSURL = Setting(
        "kakao.jwksUrl", .url, default: .value("https://kauth.kakao.com/.well-known/jwks.json"),
        "Kakao's key set", group: .identity, programs: [.auth])
    public static let naverClientIDs = Setting(
        "naver.clientIds", .list, default: .unset("none: Naver sign-in refused"),
        "Naver client ids", group: .identity, programs: [.auth])
    public static let naverProfileURL = Setting(
        "naver.profileUrl", .url, default: .value("https://openapi.naver.com/v1/nid/me"),
        "Naver's profile API", group: .identity, programs: [.auth])
    public static let authTokenLeewaySeconds = Setting(
        "auth.tokenLeewaySeconds", .integer(0...600), default: .value("60"),
        "seconds an ID token's exp, iat and nbf may be off", group: .identity, programs: [.auth])

    // MARK: Unlinking

    public static let appleTeamID = Setting(
        "apple.teamId", .text, default: .unset("none: Apple not unlinked"),
        "your Apple developer team id", group: .unlinking, programs: [.auth])
    public static let appleKeyID = Setting(
        "apple.keyId", .text, default: .unset("none"),
        "the id of your Sign in with Apple key", group: .unlinking, programs: [.auth])
    public static let applePrivateKeyPath = Setting(
        "apple.privateKeyPath", .path, default: .unset("none"),
        "that key's .p8 file", group: .unlinking, programs: [.auth])
    public static let applePrivateKey = Setting(
        "apple.privateKey", .text, default: .unset("none"),
        "that key's PEM text, instead of the file (\\n for line breaks)", secret: true,
        group: .unlinking, programs: [.auth])
    public static let appleUnlinkClientID = Setting(
        "apple.unlinkClientId", .text, default: .derived("the first of ONBOARDING_APPLE_CLIENT_IDS"),
        "the client id Apple's tokens are exchanged for", group: .unlinking, programs: [.auth])
    public static let appleTokenURL = Setting(
        "apple.tokenUrl", .url, default: .value("https://appleid.apple.com/auth/token"),
        "Apple's token endpoint", group: .unlinking, programs: [.auth])
    public static let appleRevokeURL = Setting(
        "apple.revokeUrl", .url, default: .value("https://appleid.apple.com/auth/revoke"),
        "Apple's revoke endpoint", group: .unlinking, programs: [.auth])
    public static let kakaoAdminKey = Setting(
        "kakao.adminKey", .text, default: .unset("none: Kakao not unlinked"),
        "your Kakao app's admin key", secret: true, group: .unlinking, programs: [.auth])
    public static let kakaoUnlinkURL = Setting(
        "kakao.unlinkUrl", .url, default: .value("https://kapi.kakao.com/v1/user/unlink"),
        "Kakao's unlink endpoint", group: .unlinking, programs: [.auth])
    public static let naverClientSecret = Setting(
        "naver.clientSecret", .text, default: .unset("none: Naver not unlinked"),
        "your Naver app's client secret", secret: true, group: .unlinking, programs: [.auth])
    public static let naverUnlinkClientID = Setting(
        "naver.unlinkClientId", .text, default: .derived("the first of ONBOARDING_NAVER_CLIENT_IDS"),
        "the Naver client id that goes with the secret", group: .unlinking, programs: [.auth])
    public static let naverTokenURL = Setting(
        "naver.tokenUrl", .url, default: .value("https://nid.naver.com/oauth2.0/token"),
        "Naver's token endpoint", group: .unlinking, programs: [.auth])
    public static let googleUnlink = Setting(
        "google.unlink", .toggle, default: .value("0"),
        "revoke Google access tokens on withdrawal", group: .unlinking, programs: [.auth])
    public static let googleRevokeURL = Setting(
        "google.revokeUrl", .url, default: .value("https://oauth2.googleapis.com/revoke"),
        "Google's revoke endpoint", group: .unlinking, programs: [.auth])

    // MARK: HTTP gateway

    public static let gatewayTrustedProxies = Setting(
        "gateway.trustedProxies", .list, default: .unset("none"),
        "addresses of reverse proxies whose X-Forwarded-For is believed", group: .gateway, programs: [.gateway])
    public static let gatewaySignInsPerMinute = Setting(
        "gateway.signInsPerMinute", .integer(1...1_000_000), default: .value("30"),
        "sign-ins a client address may make a minute (all at once if need be)", group: .gateway, programs: [.gateway])
    public static let gatewayUsernameChecksPerSecond = Setting(
        "gateway.usernameChecksPerSecond", .integer(1...1_000_000), default: .value("5"),
        "username checks a client address may make a second, after a burst of four times that",
        group: .gateway, programs: [.gateway])
    public static let gatewayHeartbeatSeconds = Setting(
        "gateway.heartbeatSeconds", .integer(1...3600), default: .value("15"),
        "seconds between heartbeats on an idle intent stream", group: .gateway, programs: [.gateway])
    public static let gatewayIdleTimeoutSeconds = Setting(
        "gateway.idleTimeoutSeconds", .integer(1...3600), default: .value("75"),
        "seconds a connection may sit idle, no request being read or answered, before the gateway closes it (an open intent stream is never idle)",
        group: .gateway, programs: [.gateway])

    // MARK: The bus's keys

    public static let curve = Setting(
        "curve", .toggle, default: .value("true"),
        "encrypt the bus and admit only known keys (CURVE); false only on one trusted machine",
        group: .bus, programs: Set(Program.allCases))
    public static let keysDir = Setting(
        "keysDir", .path, default: .derived("<data-dir>/keys"),
        "the bus's key pairs and public keys (`onboarding-keys make` makes them)",
        group: .bus, programs: Set(Program.allCases))
    public static let keyName = Setting(
        "keyName", .text, default: .derived("the program's: auth, profile, image-upload, orchestrator, gateway, tap, …"),
        "whose key pair this process uses: NAME.key_secret in the keys directory", group: .bus,
        programs: Set(Program.allCases))

    // MARK: Metrics

    public static let authMetrics = metricsAddress("auth", for: .auth)
    public static let profileMetrics = metricsAddress("profile", for: .profile)
    public static let imageMetrics = metricsAddress("image", for: .imageUpload, named: "image-upload")
    public static let orchestratorMetrics = metricsAddress("orchestrator", for: .orchestrator)
    public static let gatewayMetrics = metricsAddress("gateway", for: .gateway)

    private static func metricsAddress(_ prefix: String, for program: Program, named name: String? = nil) -> Setting {
        Setting(
            "\(prefix).metrics", .httpAddress, default: .unset("off"),
            "where \(name ?? prefix) serves its figures to Prometheus (`GET /metrics`; compose's `up`: 127.0.0.1:91xx; `off`: none)",
            group: .metrics, programs: [program])
    }

    /// Where spans go (OTLP over HTTP); unset: no traces.
    public static let otlpEndpoint = Setting(
        "otlpEndpoint", .url, default: .unset("none: no traces"),
        "where the program sends its spans, OTLP over HTTP: an OpenTelemetry collector at `http://127.0.0.1:4318` on this host, or `https://…` (`/v1/traces` is added); unset: nothing is traced",
        group: .metrics, programs: Program.servers)
    public static let traceSamplePercent = Setting(
        "traceSamplePercent", .integer(0...100), default: .value("100"),
        "of the traces the gateway starts, the share kept, in percent (a request's own `traceparent` keeps its decision; services continue sampled traces only)",
        group: .metrics, programs: Program.servers)

    /// The metrics address setting of `program`, if it has one.
    public static func metrics(for program: Program) -> Setting? {
        [authMetrics, profileMetrics, imageMetrics, orchestratorMetrics, gatewayMetrics].first { $0.programs.contains(program) }
    }

    // MARK: Command-line tools

    public static let clientState = Setting(
        "client.state", .path, default: .derived("~/.onboarding-client/session.json"),
        "where onboarding-client keeps the session between commands", group: .tools, programs: [.client])

    /// Every setting, in the order help and the README list them.
    public static let all: [Setting] = [
        authRPC, authEvents, profileRPC, profileEvents, imageRPC, orchestratorRPC, routes, rpcBind, eventsBind, gatewayHTTP,
        dataDir, authDatabase, profileDatabase, orchestratorDatabase, postgresURL, authPostgresSchema, profilePostgresSchema, orchestratorPostgresSchema, imageDir, eventRetentionHours, profileCacheCapacity,
        serviceToken, logLevel, exitWithParent,
        maxImageBytes, maxImagePixels, maxImageSide, imageDecodeThreads,
        authDevMode, sessionLifetimeDays, sessionLifetimeSeconds, maxSessionsPerAccount,
        googleClientIDs, googleIssuers, googleJWKSURL, appleClientIDs, appleIssuers, appleJWKSURL,
        kakaoClientIDs, kakaoIssuers, kakaoJWKSURL, naverClientIDs, naverProfileURL, authTokenLeewaySeconds,
        appleTeamID, appleKeyID, applePrivateKeyPath, applePrivateKey, appleUnlinkClientID, appleTokenURL, appleRevokeURL,
        kakaoAdminKey, kakaoUnlinkURL, naverClientSecret, naverUnlinkClientID, naverTokenURL, googleUnlink, googleRevokeURL,
        gatewayTrustedProxies, gatewaySignInsPerMinute, gatewayUsernameChecksPerSecond, gatewayHeartbeatSeconds,
        gatewayIdleTimeoutSeconds,
        curve, keysDir, keyName,
        authMetrics, profileMetrics, imageMetrics, orchestratorMetrics, gatewayMetrics, otlpEndpoint, traceSamplePercent,
        clientState,
    ]
}
