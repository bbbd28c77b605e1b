import CoreMetrics
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import Messaging
import NIOCore
import OnboardingAPI
import OnboardingClient
import ServiceLifecycle
import ServiceRuntime

/// The app's front door: HTTP (JSON, `application/problem+json` errors) and a live intent
/// stream (Server-Sent Events) over the bus, through ``OnboardingClient``.
///
/// Stateless: it keeps no data of its own, so several can run side by side behind one address.
/// Every route is in ``routes``; `proto/openapi.json` describes them. Run it with ``run()`` (a
/// `Service`): it follows the orchestrator's route intents (``IntentHub``) and serves HTTP
/// until graceful shutdown, when it ends every open intent stream so that the server drains.
public struct OnboardingGateway: Service {
    public let configuration: GatewayConfiguration
    public let hub: IntentHub
    private let bus: any MessageBus
    private let logger: Logger
    private let replay: RouteReplay
    private let addresses: ClientAddress
    private let signIns: RateLimiter
    private let usernameChecks: RateLimiter
    private let startedAt = Timestamp.now()
    private let onServerRunning: @Sendable (Int) async -> Void

    /// - Parameter onServerRunning: called with the bound TCP port once the server listens.
    public init(
        configuration: GatewayConfiguration, bus: any MessageBus, logger: Logger,
        onServerRunning: @escaping @Sendable (Int) async -> Void = { _ in }
    ) {
        self.configuration = configuration
        self.bus = bus
        self.logger = logger
        self.hub = IntentHub(configuration: configuration, bus: bus, logger: logger)
        self.replay = RouteReplay(bus: bus, configuration: configuration)
        self.addresses = ClientAddress(trustedProxies: configuration.trustedProxies)
        self.signIns = RateLimiter(rule: configuration.signInLimit)
        self.usernameChecks = RateLimiter(rule: configuration.usernameCheckLimit)
        self.onServerRunning = onServerRunning
    }

    public func run() async throws {
        if configuration.serviceToken == nil {
            logger.warning("no service token: intent streams cannot replay what a reconnecting client missed")
        }
        let port = onServerRunning
        let logger = logger
        let application = Application(
            router: routes(),
            // Hummingbird's connection handler closes a connection idle this long: no request
            // being read, none being answered. A live intent stream is being answered: it stays.
            server: .http1(configuration: .init(idleTimeout: TimeAmount(configuration.idleTimeout))),
            configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: nil),
            onServerRunning: { channel in
                let bound = channel.localAddress?.port ?? 0
                logger.info("listening on http://\(channel.localAddress?.ipAddress ?? "?"):\(bound)")
                await port(bound)
            },
            logger: logger)
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { try await hub.run() }
            try await application.run()
            group.cancelAll()
        }
    }

    // MARK: Routes

    /// Every route ``routes()`` serves, as `proto/openapi.json` names them.
    public static let routeList: [(method: String, path: String)] = [
        ("GET", "/openapi.json"), ("GET", "/demo"), ("GET", "/v1/health"),
        ("POST", "/v1/session"), ("DELETE", "/v1/session"), ("DELETE", "/v1/me"),
        ("GET", "/v1/me/profile"), ("POST", "/v1/me/profile"), ("POST", "/v1/me/check"),
        ("GET", "/v1/me/intent"), ("GET", "/v1/me/intents"), ("GET", "/v1/usernames/{username}"),
    ]

    /// Every route, behind the middleware that turns every error into a problem.
    public func routes() -> Router<GatewayContext> {
        let router = Router(context: GatewayContext.self)
        router.addMiddleware {
            // Outermost: they see the status of every answer, problems included.
            HTTPTracingMiddleware()
            HTTPMetricsMiddleware()
            ProblemMiddleware(logger: logger)
        }
        router.get("openapi.json") { _, _ in try Self.resource("openapi", "json", type: "application/json") }
        router.get("demo") { _, _ in try Self.resource("demo", "html", type: "text/html; charset=utf-8") }
        router.get("v1/health") { _, _ in try await health() }
        router.post("v1/session") { request, context in try await signIn(request, context) }
        router.delete("v1/session") { request, _ in try await signOut(request) }
        router.delete("v1/me") { request, _ in try await withdraw(request) }
        router.get("v1/me/profile") { request, _ in
            let client = try client(for: request)
            return try Self.json(ProfileResult(profile: try await client.profile()))
        }
        router.post("v1/me/profile") { request, _ in try await setUp(request) }
        router.post("v1/me/check") { request, _ in
            try Self.json(try await client(for: request).checkNow())
        }
        router.get("v1/me/intent") { request, _ in
            try Self.json(try await client(for: request).currentIntent())
        }
        router.get("v1/me/intents") { request, _ in try await intentStream(request) }
        router.get("v1/usernames/:username") { request, context in try await checkUsername(request, context) }
        return router
    }

    /// The methods ``routeList`` serves at `path` (empty: no such path).
    static func methods(for path: String) -> [String] {
        let components = path.split(separator: "/", omittingEmptySubsequences: true)
        return routeList.filter { route in
            let pattern = route.path.split(separator: "/", omittingEmptySubsequences: true)
            return pattern.count == components.count
                && zip(pattern, components).allSatisfy { $0.hasPrefix("{") || $0 == $1 }
        }.map(\.method)
    }

    private func signIn(_ request: Request, _ context: GatewayContext) async throws -> Response {
        try limit(signIns, request, context, what: "sign-ins", counting: Self.signInsLimited)
        try request.requireJSON()
        let body = try await request.boundedBody(limit: RequestLimits.smallBody)
        let signIn = try StrictJSON.decode(
            SignIn.self, from: body,
            allowedFields: ["provider", "subject", "idToken", "accessToken", "nonce", "authorizationCode"])
        let result = try await makeClient(token: nil).signIn(
            provider: signIn.provider, subject: signIn.subject, idToken: signIn.idToken, accessToken: signIn.accessToken,
            nonce: signIn.nonce, authorizationCode: signIn.authorizationCode)
        return try Self.json(result)
    }

    private func signOut(_ request: Request) async throws -> Response {
        try await client(for: request).signOut()
        return Response(status: .noContent)
    }

    private func withdraw(_ request: Request) async throws -> Response {
        let token = try request.bearerToken()
        // The client library forgets the session as it withdraws; the uid comes from the reply.
        let result = try await bus.callRetrying(
            Withdraw(), to: configuration.authRPC, source: configuration.name, sessionToken: token,
            timeout: configuration.callTimeout, deadline: configuration.callDeadline)
        return try Self.json(result, status: .accepted)
    }

    private func setUp(_ request: Request) async throws -> Response {
        let client = try client(for: request)
        let key = request.headers[.idempotencyKey]
        if let problem = IdempotencyKey.problem(key) {
            throw ProblemError(.invalidRequest, "The Idempotency-Key header: \(problem.message)")
        }
        if request.mediaType != "multipart/form-data" {
            throw ProblemError(
                .unsupportedMediaType, "Send the set-up as multipart/form-data with a username field and an optional image file.")
        }
        let body = try await request.boundedBody(limit: configuration.maxImageBytes + RequestLimits.formOverhead)
        let form = try SetUpForm.parse(contentType: request.headers[.contentType], body: body)
        let profile = try await client.setUpProfile(
            username: form.username, image: form.image, contentType: form.imageContentType, idempotencyKey: key)
        return try Self.json(ProfileResult(profile: profile), status: .created)
    }

    private func checkUsername(_ request: Request, _ context: GatewayContext) async throws -> Response {
        try limit(usernameChecks, request, context, what: "username checks", counting: Self.usernameChecksLimited)
        guard let raw = context.parameters.get("username") else {
            throw ProblemError(.invalidRequest, "Name the username in the path: /v1/usernames/{username}.")
        }
        guard let username = raw.removingPercentEncoding else {
            throw ProblemError(.invalidRequest, "The username in the path is not valid percent-encoded UTF-8.")
        }
        return try Self.json(try await makeClient(token: nil).checkUsername(username))
    }

    private func health() async throws -> Response {
        let services = [
            (ServiceName.auth, configuration.authRPC), (ServiceName.profile, configuration.profileRPC),
            (ServiceName.orchestrator, configuration.orchestratorRPC),
        ]
        var dependencies: [GatewayHealth.Dependency] = []
        for (name, endpoint) in services {
            do {
                _ = try await bus.call(HealthCheck(), to: endpoint, source: configuration.name, timeout: .milliseconds(500))
                dependencies.append(.init(service: name, status: "ok"))
            } catch let error as ServiceError {
                dependencies.append(.init(service: name, status: error.code.rawValue))
            }
        }
        let health = GatewayHealth(
            service: configuration.name, status: "ok", startedAt: startedAt, dependencies: dependencies,
            streams: .init(open: hub.openStreams, following: hub.position != nil, sequence: hub.position ?? 0))
        return try Self.json(health)
    }

    // MARK: The intent stream

    private func intentStream(_ request: Request) async throws -> Response {
        let token = try request.bearerToken()
        let lastEventID = try Self.lastEventID(request)
        let client = makeClient(token: token)
        // Who the session is (and that it is live): the orchestrator answers for the session's person.
        let uid = try await client.currentIntent().uid
        try await hub.waitUntilFollowing(timeout: configuration.callTimeout)
        let opened = try await open(uid: uid, client: client, after: lastEventID)
        if let reason = opened.replayUnavailable {
            logger.notice("stream for \(uid) from Last-Event-ID \(lastEventID ?? 0) starts from the intent in force: \(reason)")
        }
        let bus = bus
        let configuration = configuration
        var headers = HTTPFields()
        headers[.contentType] = "text/event-stream; charset=utf-8"
        headers[.cacheControl] = "no-store"
        headers[HTTPField.Name("X-Accel-Buffering")!] = "no"
        return Response(
            status: .ok, headers: headers,
            body: ResponseBody { writer in
                var text = ServerSentEvents.opening()
                for received in opened.first { text += ServerSentEvents.intent(received) }
                // Where the stream stands (often past the intent in force): a reconnect before
                // the first heartbeat replays from here, not from an old intent's sequence.
                if opened.last > (opened.first.last?.sequence ?? 0) {
                    text += ServerSentEvents.position(opened.last)
                }
                try await writer.write(ByteBuffer(string: text))
                var last = opened.last
                // A client that went away is noticed when a write fails: at the next intent or
                // heartbeat. The subscription ends with this closure.
                loop: for await item in opened.subscription.items {
                    switch item {
                    case .intent(let received):
                        guard received.sequence > last else { continue }
                        last = received.sequence
                        try await writer.write(ByteBuffer(string: ServerSentEvents.intent(received)))
                    case .heartbeat(let through):
                        if await Self.sessionEnded(token, bus: bus, configuration: configuration) {
                            try await writer.write(ByteBuffer(string: ServerSentEvents.sessionEnded()))
                            break loop
                        }
                        last = max(last, through)
                        try await writer.write(ByteBuffer(string: ServerSentEvents.heartbeat(through: last)))
                    }
                }
                try await writer.finish(nil)
            })
    }

    /// Subscribes to the hub first, then reads what to send first, so nothing falls between.
    private func open(uid: String, client: OnboardingClient, after lastEventID: UInt64?) async throws -> OpenedIntentStream {
        let subscription = try hub.subscribe(uid: uid)
        var unavailable: String?
        if let lastEventID {
            switch try await replay.intents(of: uid, after: lastEventID) {
            case .missed(let intents, let through):
                return OpenedIntentStream(first: intents, last: through, subscription: subscription)
            case .unavailable(let reason):
                unavailable = reason
            }
        }
        // Where the record stands before the intent in force is read: an intent published after
        // this and not reflected in it arrives live.
        let position = try await recordPosition()
        let state = try await client.currentIntent()
        if let intent = state.intent, let sequence = state.sequence {
            let received = ReceivedIntent(intent: intent, time: state.time ?? Timestamp.now(), sequence: sequence)
            return OpenedIntentStream(
                first: [received], last: max(sequence, subscription.from), subscription: subscription,
                replayUnavailable: unavailable)
        }
        return OpenedIntentStream(
            first: [], last: max(position ?? subscription.from, subscription.from), subscription: subscription,
            replayUnavailable: unavailable)
    }

    /// The orchestrator's newest route sequence, or `nil` without a service token.
    private func recordPosition() async throws -> UInt64? {
        guard let serviceToken = configuration.serviceToken else { return nil }
        return try await bus.callRetrying(
            EventsAfter(sequence: UInt64(Int64.max), limit: 1), to: configuration.orchestratorRPC,
            source: configuration.name, serviceToken: serviceToken, timeout: configuration.callTimeout,
            deadline: configuration.callDeadline
        ).lastSequence
    }

    /// Whether auth says the session has ended (a failure to ask is not an answer: the stream goes on).
    private static func sessionEnded(_ token: String, bus: any MessageBus, configuration: GatewayConfiguration) async -> Bool {
        do {
            _ = try await bus.call(
                VerifySession(sessionToken: token), to: configuration.authRPC, source: configuration.name,
                timeout: configuration.callTimeout)
            return false
        } catch let error as ServiceError {
            return error.code == .unauthenticated
        } catch {
            return false
        }
    }

    static func lastEventID(_ request: Request) throws -> UInt64? {
        guard let text = request.headers[.lastEventID]?.trimmingCharacters(in: .whitespaces), !text.isEmpty else {
            return nil
        }
        guard let value = UInt64(text), value <= UInt64(Int64.max) else {
            throw ProblemError(
                .invalidRequest, "Last-Event-ID must be the id of an event this stream sent (a route sequence number).")
        }
        return value
    }

    // MARK: Helpers

    private func makeClient(token: String?) -> OnboardingClient {
        OnboardingClient(
            bus: bus,
            configuration: .init(
                authRPC: configuration.authRPC, profileRPC: configuration.profileRPC,
                orchestratorRPC: configuration.orchestratorRPC, routes: configuration.routes,
                timeout: configuration.callTimeout, deadline: configuration.callDeadline, name: configuration.name),
            // The client library acts on the session token; the provider is not read, and an empty
            // uid sends no hint with "check me now" (the gateway does not know it).
            session: token.map { .init(uid: "", sessionToken: $0, provider: .google) })
    }

    private func client(for request: Request) throws -> OnboardingClient {
        makeClient(token: try request.bearerToken())
    }

    private func limit(
        _ limiter: RateLimiter, _ request: Request, _ context: GatewayContext, what: String, counting refused: Counter
    ) throws {
        let client = addresses.resolve(peer: context.peerAddress, headers: request.headers)
        if case .limited(let seconds) = limiter.take(for: client) {
            refused.increment()
            var headers = HTTPFields()
            headers[.retryAfter] = String(seconds)
            throw ProblemError(
                .rateLimited,
                "Too many \(what) from \(client): at most \(Int(limiter.rule.burst)) at once and \(Self.rate(limiter.rule.perSecond)). Try again in \(seconds) s.",
                headers: headers)
        }
    }

    /// Requests refused by each limit, for the metrics (``MetricDefinition/rateLimited``).
    private static let signInsLimited = Counter(label: MetricDefinition.rateLimited.name, dimensions: [("limit", "sign_in")])
    private static let usernameChecksLimited = Counter(
        label: MetricDefinition.rateLimited.name, dimensions: [("limit", "username_check")])

    private static func rate(_ perSecond: Double) -> String {
        perSecond >= 1 ? "\(Int(perSecond)) a second" : "\(Int((perSecond * 60).rounded())) a minute"
    }

    static func json<Value: Encodable>(_ value: Value, status: HTTPResponse.Status = .ok) throws -> Response {
        let data = try JSONEncoder.gateway.encode(value)
        var headers = HTTPFields()
        headers[.contentType] = "application/json"
        headers[.cacheControl] = "no-store"
        return Response(status: status, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: data)))
    }

    /// A file built into the gateway: `openapi.json` (`proto/openapi.json`), `demo.html`.
    static func resource(_ name: String, _ ext: String, type: String) throws -> Response {
        guard let url = Bundle.module.url(forResource: name, withExtension: ext),
            let data = try? Data(contentsOf: url)
        else {
            throw ProblemError(.internalError, "\(name).\(ext) is missing from this build of the gateway.")
        }
        var headers = HTTPFields()
        headers[.contentType] = type
        return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: data)))
    }
}

/// `GET /v1/health`.
public struct GatewayHealth: Codable, Sendable, Hashable {
    public struct Dependency: Codable, Sendable, Hashable {
        public var service: String
        /// `ok`, or the error code asking it gave (`noResponder`, `timeout`, …).
        public var status: String
    }

    public struct Streams: Codable, Sendable, Hashable {
        /// Intent streams open on this gateway.
        public var open: Int
        /// Whether the gateway follows the orchestrator's route intents.
        public var following: Bool
        /// The last route sequence handed to the streams.
        public var sequence: UInt64
    }

    public var service: String
    /// Always `ok` when the gateway answers at all; see `dependencies` for the services.
    public var status: String
    public var startedAt: String
    public var dependencies: [Dependency]
    public var streams: Streams
}

/// Turns every error a route throws into an `application/problem+json` response.
struct ProblemMiddleware: RouterMiddleware {
    typealias Context = GatewayContext
    let logger: Logger

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let error as HTTPError where error.status == .notFound {
            // The path exists with other methods: 405 and what it takes.
            let allowed = OnboardingGateway.methods(for: request.uri.path)
            guard !allowed.isEmpty else { return ProblemError.from(error).response() }
            var headers = HTTPFields()
            headers[.allow] = allowed.joined(separator: ", ")
            return ProblemError(
                .methodNotAllowed, "\(request.uri.path) takes \(allowed.joined(separator: ", ")), not \(request.method).",
                headers: headers
            ).response()
        } catch {
            let problem = ProblemError.from(error)
            if problem.status.code >= 500 {
                logger.warning("\(request.method) \(request.uri.path) failed: \(problem.error)")
            }
            return problem.response()
        }
    }
}
