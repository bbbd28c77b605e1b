import Foundation
import OnboardingClient
import Synchronization

/// Plays the onboarding orchestrator for code that shows route intents: you decide, it
/// publishes as the real one does.
///
/// ```swift
/// let bus = InProcessBus()
/// let orchestrator = try await StandInOrchestrator.start(on: bus)
/// let app = OnboardingClient(bus: bus, configuration: orchestrator.clientConfiguration,
///                            session: orchestrator.session(for: "u1"))
/// let intents = try await app.intents()
/// try orchestrator.presentProfileSetup(for: "u1")
/// try orchestrator.dismiss(for: "u1")
/// ```
///
/// Like the real one it
/// - publishes each intent on topic `route.<uid>` (``Topics/route(uid:)``) at
///   ``SystemEndpoints/routes``, as event `route.intent` from `onboarding-orchestrator`, with a
///   route sequence number that only grows and a new `intentId` for each decision;
/// - keeps the intent in force for each person and answers `onboarding.intent` with it, and
///   `onboarding.check` from it (republishing `presentProfileSetup` with the same `intentId`);
/// - accepts the sessions of ``session(for:provider:)`` (nothing checks them with auth), and
///   the `uid` of a request that carries a service token.
///
/// Its requests are served by ``service``, a ``StandInService``: set other answers there, for
/// example `service.fail(CheckOnboarding.self, with: ServiceError(.dependencyUnavailable, …))`.
///
/// Thread safety: every member may be used from any task.
public final class StandInOrchestrator: Sendable {
    /// Serves the orchestrator's endpoint: change or fail its answers here.
    public let service: StandInService
    /// Where it serves and publishes.
    public let endpoints: SystemEndpoints
    private let publisher: any EventPublisher
    private let state = Mutex(State())

    private struct State {
        var sequence: UInt64 = 0
        var inForce: [String: RouteState] = [:]
    }

    /// The prefix of the session tokens ``session(for:provider:)`` makes.
    static let tokenPrefix = "stand-in-session."

    private init(service: StandInService, endpoints: SystemEndpoints, publisher: any EventPublisher) {
        self.service = service
        self.endpoints = endpoints
        self.publisher = publisher
    }

    /// Binds the orchestrator's request endpoint and route publisher (of `endpoints`) on `bus`.
    ///
    /// - Throws: the bus's `addressInUse` when something else is bound there.
    public static func start(on bus: any MessageBus, endpoints: SystemEndpoints = .inProcess) async throws -> StandInOrchestrator {
        let publisher = try await bus.publisher(at: endpoints.routes)
        let service: StandInService
        do {
            service = try await StandInService.start(on: bus, at: endpoints.orchestratorRPC, name: ServiceName.orchestrator)
        } catch {
            publisher.close()
            throw error
        }
        let orchestrator = StandInOrchestrator(service: service, endpoints: endpoints, publisher: publisher)
        service.answer(CurrentIntent.self) { [weak orchestrator] _, message in
            guard let orchestrator else { throw ServiceError(.shuttingDown, "The stand-in orchestrator is gone.") }
            return orchestrator.intentInForce(for: try orchestrator.uid(of: message))
        }
        service.answer(CheckOnboarding.self) { [weak orchestrator] _, message in
            guard let orchestrator else { throw ServiceError(.shuttingDown, "The stand-in orchestrator is gone.") }
            return try orchestrator.check(uid: try orchestrator.uid(of: message))
        }
        return orchestrator
    }

    /// Unbinds both endpoints.
    public func stop() async {
        publisher.close()
        await service.stop()
    }

    /// A session for `uid` that this stand-in accepts: give it to an `OnboardingClient`.
    public func session(for uid: String, provider: Provider = .google) -> OnboardingClient.Session {
        OnboardingClient.Session(uid: uid, sessionToken: Self.tokenPrefix + uid, provider: provider)
    }

    /// A client configuration whose orchestrator and routes endpoints are this stand-in's.
    public var clientConfiguration: OnboardingClient.Configuration {
        endpoints.clientConfiguration()
    }

    // MARK: Deciding

    /// Decides `presentProfileSetup` for `uid`: a new decision (new `intentId`), stored as the
    /// intent in force and published.
    @discardableResult
    public func presentProfileSetup(for uid: String, reason: RouteIntent.Reason = .signedIn) throws -> RouteIntent {
        try decide(.presentProfileSetup, for: uid, reason: reason)
    }

    /// Decides `dismiss` for `uid` (see ``presentProfileSetup(for:reason:)``).
    @discardableResult
    public func dismiss(for uid: String, reason: RouteIntent.Reason = .profileCreated) throws -> RouteIntent {
        try decide(.dismiss, for: uid, reason: reason)
    }

    /// Decides `kind` for `uid`: a new `intentId`, stored as the intent in force, then published
    /// with the next route sequence number.
    @discardableResult
    public func decide(_ kind: RouteIntent.Kind, for uid: String, reason: RouteIntent.Reason) throws -> RouteIntent {
        let intent = RouteIntent(intentId: UUID().uuidString.lowercased(), uid: uid, intent: kind, reason: reason)
        try publish(intent)
        return intent
    }

    /// Publishes the intent in force for `uid` again, with its `intentId` and a new route
    /// sequence number, as a check that confirms a decision does.
    ///
    /// - Throws: `invalidRequest` when no intent is in force for `uid`.
    public func republish(for uid: String) throws {
        guard let intent = state.withLock({ $0.inForce[uid]?.intent }) else {
            throw ServiceError(.invalidRequest, "No intent is in force for \(uid): decide one first.")
        }
        try publish(intent)
    }

    /// Ends the intent in force for `uid`, as the last sign-out does (nothing is published).
    public func endIntent(for uid: String) {
        _ = state.withLock { $0.inForce.removeValue(forKey: uid) }
    }

    /// The intent in force for `uid`, as `onboarding.intent` answers.
    public func intentInForce(for uid: String) -> RouteState {
        state.withLock { $0.inForce[uid] } ?? RouteState(uid: uid, intent: nil, sequence: nil, time: nil)
    }

    /// Stores `intent` as the one in force and publishes it, under the lock so that sequence
    /// numbers go out in order.
    private func publish(_ intent: RouteIntent) throws {
        try state.withLock { state in
            state.sequence += 1
            let time = Timestamp.now()
            state.inForce[intent.uid] = RouteState(uid: intent.uid, intent: intent, sequence: state.sequence, time: time)
            try publisher.publish(
                intent, source: ServiceName.orchestrator, sequence: state.sequence, uid: intent.uid,
                topic: Topics.route(uid: intent.uid))
        }
    }

    private func check(uid: String) throws -> OnboardingStatus {
        let inForce = intentInForce(for: uid).intent
        if inForce?.intent == .presentProfileSetup { try republish(for: uid) }
        return OnboardingStatus(
            uid: uid, hasProfile: inForce?.intent == .dismiss,
            intent: inForce?.intent == .presentProfileSetup ? .presentProfileSetup : nil)
    }

    private func uid(of message: Message) throws -> String {
        if let token = message.header.sessionToken, token.hasPrefix(Self.tokenPrefix) {
            return String(token.dropFirst(Self.tokenPrefix.count))
        }
        if message.header.serviceToken != nil, let uid = message.header.uid { return uid }
        throw ServiceError(
            .unauthenticated,
            "The stand-in orchestrator accepts the sessions of StandInOrchestrator.session(for:) and service calls with a uid.")
    }
}
