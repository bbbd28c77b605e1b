import Foundation
import Messaging
import OnboardingAPI
import Synchronization

/// What an app does with the onboarding back end, as typed calls.
///
/// Works over any ``MessageBus``: `ZeroMQBus` against a running system, or `InProcessBus` in
/// tests. Every method may be called from any task. Failures are ``ServiceError``s whose `code`
/// says what happened: a service's refusal (`usernameTaken`, `unauthenticated`, …) or the bus's
/// own `timeout` and `noResponder`.
///
/// Retries: every call is resent after a failure that may pass (``ErrorCode/retryable``:
/// `timeout`, `noResponder`, `overloaded`, `shuttingDown`, `storeUnavailable`,
/// `dependencyUnavailable`), with backoff, until ``Configuration/deadline``, when it is
/// safe to repeat: the queries, `onboarding.check`, sign-out and withdrawal (auth answers a
/// repeat with the first answer), and ``setUpProfile(username:image:contentType:idempotencyKey:)``,
/// whose every attempt carries one idempotency key. Sign-in is resent only after failures that
/// prove it was not handled (`noResponder`, `overloaded`, `shuttingDown`), never after a
/// `timeout`: a sign-in that did happen but whose reply was lost would, if repeated, open a
/// second session and publish a second `auth.signedIn` (telling a brand-new account that it is
/// not new). That first session is harmless (its token was never seen), and the person can sign
/// in again.
public final class OnboardingClient: Sendable {
    /// Where the services are, and how long to wait for them.
    public struct Configuration: Sendable {
        public var authRPC: Endpoint
        public var profileRPC: Endpoint
        public var orchestratorRPC: Endpoint
        public var routes: Endpoint
        /// How long one attempt waits for its reply.
        public var timeout: Duration
        /// The backoff between attempts of a call that is retried.
        public var retry: RetryPolicy
        /// The longest a call takes over all its attempts. A call that is not retried waits at
        /// most ``timeout``.
        public var deadline: Duration
        /// The `source` the client signs its messages with.
        public var name: String

        public init(
            authRPC: Endpoint = Defaults.authRPC,
            profileRPC: Endpoint = Defaults.profileRPC,
            orchestratorRPC: Endpoint = Defaults.orchestratorRPC,
            routes: Endpoint = Defaults.routes,
            timeout: Duration = Defaults.requestTimeout,
            retry: RetryPolicy = RetryPolicy(),
            deadline: Duration = Defaults.retryDeadline,
            name: String = "onboarding-client"
        ) {
            self.authRPC = authRPC
            self.profileRPC = profileRPC
            self.orchestratorRPC = orchestratorRPC
            self.routes = routes
            self.timeout = timeout
            self.retry = retry
            self.deadline = deadline
            self.name = name
        }
    }

    /// A signed-in person: what the app keeps between launches.
    public struct Session: Codable, Sendable, Hashable {
        public var uid: String
        public var sessionToken: String
        public var provider: Provider

        public init(uid: String, sessionToken: String, provider: Provider) {
            self.uid = uid
            self.sessionToken = sessionToken
            self.provider = provider
        }
    }

    public let bus: any MessageBus
    public let configuration: Configuration
    private let currentSession: Mutex<Session?>

    public init(bus: any MessageBus, configuration: Configuration = Configuration(), session: Session? = nil) {
        self.bus = bus
        self.configuration = configuration
        self.currentSession = Mutex(session)
    }

    /// The signed-in person, if any.
    public var session: Session? { currentSession.withLock { $0 } }

    // MARK: Signing in and out

    /// Signs in and keeps the session for later calls.
    ///
    /// Resent only when the request provably was not handled (see the type's notes on retries);
    /// a `timeout` is thrown.
    @discardableResult
    public func signIn(
        provider: Provider, subject: String, idToken: String? = nil, accessToken: String? = nil, nonce: String? = nil,
        authorizationCode: String? = nil
    ) async throws -> SignInResult {
        let request = SignIn(
            provider: provider, subject: subject, idToken: idToken, accessToken: accessToken, nonce: nonce,
            authorizationCode: authorizationCode)
        let result = try await call(
            request, to: configuration.authRPC,
            retryingOn: ErrorCode.notHandled)
        currentSession.withLock {
            $0 = Session(uid: result.uid, sessionToken: result.sessionToken, provider: result.provider)
        }
        return result
    }

    /// Ends the session. Cached data about the person is forgotten; the profile stays.
    ///
    /// Retried: a repeat of a sign-out that happened is answered as the first one was.
    /// - Parameter everywhere: end every session of the account (every device), not only this one.
    public func signOut(everywhere: Bool = false) async throws {
        _ = try await userCall(SignOut(everywhere: everywhere ? true : nil), to: configuration.authRPC)
        currentSession.withLock { $0 = nil }
    }

    /// Deletes the account; the profile, username and images go with it.
    ///
    /// Retried: a repeat of a withdrawal that happened is answered as the first one was.
    public func withdraw() async throws {
        _ = try await userCall(Withdraw(), to: configuration.authRPC)
        currentSession.withLock { $0 = nil }
    }

    // MARK: Onboarding

    /// "Check me now": call whenever Home appears. When the profile is missing the answer's
    /// `intent` is `presentProfileSetup` (also sent on the route topic).
    ///
    /// The request names the session's uid as well (when this client knows it from signing in),
    /// so that the orchestrator can ask for the profile while auth verifies the session.
    public func checkNow() async throws -> OnboardingStatus {
        try await userCall(CheckOnboarding(), to: configuration.orchestratorRPC, namingUID: true)
    }

    /// Whether `username` could be claimed now. Check the format locally first
    /// (``UsernameRules/formatProblem(_:)``), or use a ``UsernameChecker``.
    public func checkUsername(_ username: String) async throws -> UsernameAvailability {
        try await call(CheckUsername(username: username), to: configuration.profileRPC)
    }

    /// Sets up the profile: uploads `image` (if any), creates the profile, then the system
    /// sends `dismiss`.
    ///
    /// Every attempt of one call carries the same idempotency key, so a set-up whose reply was
    /// lost is answered, when resent, with the profile it created, rather than `profileExists`.
    ///
    /// - Parameters:
    ///   - contentType: what you believe the image is; informational, the bytes decide.
    ///   - idempotencyKey: the key for this set-up (see ``IdempotencyKey``); by default a new
    ///     one. Pass your own to repeat a set-up across calls (an app that was stopped while
    ///     waiting, say): keep it until the set-up has an answer, and use a new one for the next
    ///     set-up the person confirms.
    /// - Throws: `invalidRequest` for a malformed key, before anything is sent.
    public func setUpProfile(
        username: String, image: Data? = nil, contentType: String? = nil, idempotencyKey: String? = nil
    ) async throws -> Profile {
        let key = idempotencyKey ?? IdempotencyKey.make()
        if let problem = IdempotencyKey.problem(key) { throw problem }
        let result = try await userCall(
            SetUpProfile(username: username, contentType: contentType, idempotencyKey: key), to: configuration.orchestratorRPC,
            attachment: image)
        guard let profile = result.profile else {
            throw ServiceError(.invalidMessage, "The set-up was answered without a profile.")
        }
        return profile
    }

    /// The signed-in person's profile, or `nil` when they have none.
    public func profile() async throws -> Profile? {
        try await userCall(GetProfile(), to: configuration.profileRPC).profile
    }

    /// The route intent in force for the signed-in person (`onboarding.intent`): what the app
    /// should show now, for an app that starts, or reconnects, after the intent was published.
    /// Compare its `sequence` with live intents' to skip those it already reflects.
    public func currentIntent() async throws -> RouteState {
        try await userCall(CurrentIntent(), to: configuration.orchestratorRPC)
    }

    // MARK: Route intents

    /// The route intents for one person (`uid`), or for everyone when `uid` is `nil`, from now on.
    ///
    /// The sequence ends when the iterating task is cancelled.
    public func routeIntents(for uid: String?) async throws -> RouteIntents {
        let topic = uid.map { Topics.route(uid: $0) } ?? Topics.routePrefix
        let messages = try await bus.subscribe(to: [configuration.routes], topics: [topic], limits: MessageLimits())
        return RouteIntents(messages: messages)
    }

    /// Asks a service whether it is up, retrying until ``Configuration/deadline`` while it is not.
    public func health(of endpoint: Endpoint) async throws -> HealthStatus {
        try await call(HealthCheck(), to: endpoint)
    }

    /// A call for the signed-in person, retried (only requests that are safe to repeat come here).
    /// - Parameter namingUID: the envelope also names the session's uid, as a hint (the session
    ///   decides whose request it is).
    private func userCall<Request: APIRequest>(
        _ request: Request, to endpoint: Endpoint, attachment: Data? = nil, namingUID: Bool = false
    ) async throws -> Request.Response {
        guard let session else {
            throw ServiceError(.unauthenticated, "Nobody is signed in. Sign in first.")
        }
        let uid = namingUID && !session.uid.isEmpty ? session.uid : nil
        return try await call(request, to: endpoint, uid: uid, sessionToken: session.sessionToken, attachment: attachment)
    }

    private func call<Request: APIRequest>(
        _ request: Request, to endpoint: Endpoint, uid: String? = nil, sessionToken: String? = nil, attachment: Data? = nil,
        retryingOn codes: Set<ErrorCode> = ErrorCode.retryable
    ) async throws -> Request.Response {
        try await bus.callRetrying(
            request, to: endpoint, source: configuration.name, uid: uid, sessionToken: sessionToken, attachment: attachment,
            timeout: configuration.timeout, retry: configuration.retry, deadline: configuration.deadline, retryingOn: codes)
    }
}

/// A route intent as received, with its envelope's time and sequence number.
public struct ReceivedIntent: Sendable, Hashable {
    public var intent: RouteIntent
    /// When the orchestrator made the decision (RFC 3339, UTC).
    public var time: String
    /// The orchestrator's sequence number for this message.
    public var sequence: UInt64

    public init(intent: RouteIntent, time: String, sequence: UInt64) {
        self.intent = intent
        self.time = time
        self.sequence = sequence
    }
}

/// Route intents as an `AsyncSequence`. Messages that are not readable intents are skipped.
public struct RouteIntents: AsyncSequence, Sendable {
    public typealias Element = ReceivedIntent
    let messages: AsyncStream<Message>

    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: AsyncStream<Message>.AsyncIterator

        public mutating func next() async -> ReceivedIntent? {
            while let message = await base.next() {
                guard message.header.type == RouteIntent.type,
                    let intent = try? message.payload(as: RouteIntent.self)
                else { continue }
                return ReceivedIntent(intent: intent, time: message.header.time, sequence: message.header.sequence)
            }
            return nil
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: messages.makeAsyncIterator())
    }
}
