import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime
import Synchronization

/// The orchestrator's requests: "check me now", set-up, the intent in force, route states, and
/// the route outbox's replay.
extension Engine {

    func dispatcher(sessions: any SessionVerifier) -> RequestDispatcher {
        var dispatcher = RequestDispatcher(
            source: source, sessions: sessions, serviceToken: configuration.serviceToken, logger: logger)
        switch commits {
        case .onLoop(let sqlite):
            // "Check me now" on the bus's thread (see `checkOnLoop`): it verifies the session
            // itself, while profile is asked at the same time.
            dispatcher.onLoop(CheckOnboarding.self, access: .open, database: sqlite.database, writes: false, replyUID: { $0.uid }) {
                [self] _, context, _, reply in
                try checkOnLoop(context.message.header, sessions: sessions, reply: reply)
                return nil
            }
            dispatcher.onEventsAfter(database: sqlite.database)
        case .buffered:
            // "Check me now" as on the bus's thread, in a task: one commit decides it.
            dispatcher.on(CheckOnboarding.self, access: .open, replyUID: { $0.uid }) { [self] _, context in
                try await check(context.message.header, sessions: sessions)
            }
            dispatcher.on(EventsAfter.self, access: .serviceWithoutUID) { [self] request, _ in
                try await storage.events(after: request.sequence, limit: request.limit)
            }
        }
        dispatcher.on(SetUpProfile.self, access: .session, attachment: .optional) { [self] request, context in
            try await setUp(request, uid: try context.requireUID(), image: context.attachment, correlationId: context.message.header.id)
        }
        dispatcher.on(CurrentIntent.self, access: .sessionOrService) { [self] _, context in
            let uid = try context.requireUID()
            return try await storage.routeState(of: uid)
        }
        dispatcher.on(ListRouteStates.self, access: .serviceWithoutUID) { [self] request, _ in
            let limit = min(request.limit ?? ListRouteStates.maximumLimit, ListRouteStates.maximumLimit)
            guard limit >= 1 else { throw ServiceError(.invalidRequest, "limit must be at least 1.") }
            return try await storage.routeStates(after: request.afterUID, limit: limit)
        }
        return dispatcher
    }

    /// "Check me now" from the bus's thread. Auth verifies the session; when the request also
    /// names its `uid` (a hint: the session decides), profile is asked for that person's profile
    /// at the same time, so the check costs one round trip instead of two. Once both have
    /// answered, the check and its answer are decided and committed together, and the reply
    /// goes out after that commit. Without a hint, or when it is not the session's person, or
    /// when the profile answer failed, the check asks profile afterwards, as after a sign-in.
    func checkOnLoop(
        _ header: EnvelopeHeader, sessions: any SessionVerifier, reply: LoopReply<OnboardingStatus>
    ) throws(ServiceError) {
        guard let token = header.sessionToken, !token.isEmpty else { throw ServiceError.missingSessionToken }
        let hint = header.uid.flatMap { $0.isEmpty ? nil : $0 }
        let join = CheckJoin(expectingProfile: hint != nil)
        sessions.uid(forSessionToken: token) { [self] result in
            if let ready = join.verified(result) { startCheck(ready, hint: hint, reply: reply) }
        }
        if let hint {
            bus.call(
                GetProfile(), to: configuration.profileRPC, source: source, uid: hint,
                serviceToken: configuration.serviceToken, timeout: configuration.callTimeout
            ) { [self] result in
                if let ready = join.profiled(result) { startCheck(ready, hint: hint, reply: reply) }
            }
        }
    }

    /// "Check me now" on a shared store, as ``checkOnLoop(_:sessions:reply:)`` does it on the
    /// bus's thread: the session is verified and, when the request names its `uid`, profile is
    /// asked at the same time, so the check and its answer commit together; the reply follows
    /// that commit.
    private func check(_ header: EnvelopeHeader, sessions: any SessionVerifier) async throws -> OnboardingStatus {
        guard let token = header.sessionToken, !token.isEmpty else { throw ServiceError.missingSessionToken }
        let hint = header.uid.flatMap { $0.isEmpty ? nil : $0 }
        async let asked: ProfileResult? = {
            guard let hint else { return nil }
            return try? await call(GetProfile(), to: configuration.profileRPC, uid: hint)
        }()
        let uid = try await sessions.uid(forSessionToken: token)
        let profile = await asked
        return try await withCheckedThrowingContinuation { continuation in
            let waiter = nextWaiter.wrappingAdd(1, ordering: .relaxed).newValue
            waiters.withLock { $0[waiter] = { continuation.resume(with: $0) } }
            var submission = Submission(inputs: [.checkRequested(uid: uid, waiter: waiter)])
            if uid == hint, let profile { submission.profiles[uid] = profile }
            enqueue(submission)
        }
    }

    /// Queues the check once the session is known; its answer is sent when the check's outcome
    /// has committed.
    private func startCheck(_ ready: CheckJoin.Ready, hint: String?, reply: LoopReply<OnboardingStatus>) {
        let uid: String
        switch ready.session {
        case .failure(let error):
            reply.send(.failure(error))
            return
        case .success(let verified):
            uid = verified
        }
        let waiter = nextWaiter.wrappingAdd(1, ordering: .relaxed).newValue
        waiters.withLock { $0[waiter] = { reply.send($0) } }
        var submission = Submission(inputs: [.checkRequested(uid: uid, waiter: waiter)])
        if uid == hint, case .success(let found)? = ready.profile { submission.profiles[uid] = found }
        enqueue(submission)
    }

    static let stopping = ServiceError(.shuttingDown, "The orchestrator is stopping; ask again in a moment.")
}

/// Waits for the two answers a "check me now" may need (the session's person, and the profile
/// asked ahead) and hands them on once, when the last of them arrives.
///
/// Threading: both callbacks run on the bus's thread; the mutex keeps it correct from anywhere.
///
/// Why ours: a mutex around a three-field state machine, as the model packages do; both answers
/// arrive as callbacks on the bus's thread, where a task per check (`async let`) would cost a
/// task and two continuations on the "check me now" path.
final class CheckJoin: Sendable {
    typealias Ready = (session: Result<String, ServiceError>, profile: Result<ProfileResult, ServiceError>?)

    private struct State {
        var session: Result<String, ServiceError>?
        var profile: Result<ProfileResult, ServiceError>?
        var expectingProfile: Bool
        var done = false
    }

    private let state: Mutex<State>

    init(expectingProfile: Bool) {
        state = Mutex(State(expectingProfile: expectingProfile))
    }

    /// The session's answer; both answers when this completes them.
    func verified(_ result: Result<String, ServiceError>) -> Ready? {
        state.withLock { state in
            state.session = result
            return Self.ready(&state)
        }
    }

    /// The profile's answer; both answers when this completes them.
    func profiled(_ result: Result<ProfileResult, ServiceError>) -> Ready? {
        state.withLock { state in
            state.profile = result
            return Self.ready(&state)
        }
    }

    private static func ready(_ state: inout State) -> Ready? {
        guard !state.done, let session = state.session else { return nil }
        // A refused session needs no profile answer.
        if case .success = session, state.expectingProfile, state.profile == nil { return nil }
        state.done = true
        return (session, state.profile)
    }
}
