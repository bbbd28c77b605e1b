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
public final class OnboardingClient: Sendable {
    /// Where the services are.
    public struct Configuration: Sendable {
        public var authRPC: Endpoint
        public var profileRPC: Endpoint
        public var orchestratorRPC: Endpoint
        public var routes: Endpoint
        public var timeout: Duration
        /// The `source` the client signs its messages with.
        public var name: String

        public init(
            authRPC: Endpoint = Defaults.authRPC,
            profileRPC: Endpoint = Defaults.profileRPC,
            orchestratorRPC: Endpoint = Defaults.orchestratorRPC,
            routes: Endpoint = Defaults.routes,
            timeout: Duration = Defaults.requestTimeout,
            name: String = "onboarding-client"
        ) {
            self.authRPC = authRPC
            self.profileRPC = profileRPC
            self.orchestratorRPC = orchestratorRPC
            self.routes = routes
            self.timeout = timeout
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
    @discardableResult
    public func signIn(provider: Provider, subject: String, idToken: String? = nil) async throws -> SignInResult {
        let result = try await bus.call(
            SignIn(provider: provider, subject: subject, idToken: idToken), to: configuration.authRPC,
            source: configuration.name, timeout: configuration.timeout)
        currentSession.withLock {
            $0 = Session(uid: result.uid, sessionToken: result.sessionToken, provider: result.provider)
        }
        return result
    }

    /// Ends the session. Cached data about the person is forgotten; the profile stays.
    public func signOut() async throws {
        _ = try await userCall(SignOut(), to: configuration.authRPC)
        currentSession.withLock { $0 = nil }
    }

    /// Deletes the account; the profile, username and images go with it.
    public func withdraw() async throws {
        _ = try await userCall(Withdraw(), to: configuration.authRPC)
        currentSession.withLock { $0 = nil }
    }

    // MARK: Onboarding

    /// "Check me now": call whenever Home appears. When the profile is missing the answer's
    /// `intent` is `presentProfileSetup` (also sent on the route topic).
    public func checkNow() async throws -> OnboardingStatus {
        try await userCall(CheckOnboarding(), to: configuration.orchestratorRPC)
    }

    /// Whether `username` could be claimed now. Check the format locally first
    /// (``UsernameRules/formatProblem(_:)``), or use a ``UsernameChecker``.
    public func checkUsername(_ username: String) async throws -> UsernameAvailability {
        try await bus.call(
            CheckUsername(username: username), to: configuration.profileRPC, source: configuration.name,
            timeout: configuration.timeout)
    }

    /// Sets up the profile: uploads `image` (if any), creates the profile, then the system
    /// sends `dismiss`.
    ///
    /// - Parameter contentType: what you believe the image is; informational, the bytes decide.
    public func setUpProfile(username: String, image: Data? = nil, contentType: String? = nil) async throws -> Profile {
        let result = try await userCall(
            SetUpProfile(username: username, contentType: contentType), to: configuration.orchestratorRPC,
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

    // MARK: Route intents

    /// The route intents for one person (`uid`), or for everyone when `uid` is `nil`, from now on.
    ///
    /// The sequence ends when the iterating task is cancelled.
    public func routeIntents(for uid: String?) async throws -> RouteIntents {
        let topic = uid.map { Topics.route(uid: $0) } ?? Topics.routePrefix
        let messages = try await bus.subscribe(to: [configuration.routes], topics: [topic], limits: MessageLimits())
        return RouteIntents(messages: messages)
    }

    /// Asks a service whether it is up.
    public func health(of endpoint: Endpoint) async throws -> HealthStatus {
        try await bus.call(HealthCheck(), to: endpoint, source: configuration.name, timeout: configuration.timeout)
    }

    private func userCall<Request: APIRequest>(
        _ request: Request, to endpoint: Endpoint, attachment: Data? = nil
    ) async throws -> Request.Response {
        guard let session else {
            throw ServiceError(.unauthenticated, "Nobody is signed in. Sign in first.")
        }
        return try await bus.call(
            request, to: endpoint, source: configuration.name, sessionToken: session.sessionToken,
            attachment: attachment, timeout: configuration.timeout)
    }
}

/// A route intent as received, with its envelope's time and sequence number.
public struct ReceivedIntent: Sendable, Hashable {
    public var intent: RouteIntent
    /// When the orchestrator made the decision (RFC 3339, UTC).
    public var time: String
    /// The orchestrator's sequence number for this message.
    public var sequence: UInt64
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
