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
        dispatcher.on(CheckOnboarding.self, access: .session) { [self] _, context in
            try await check(uid: try context.requireUID())
        }
        // "Check me now" on the bus's thread: the session is verified from there, the request
        // commits with its batch, and the answer goes out when the check's outcome commits.
        dispatcher.onLoop(CheckOnboarding.self, access: .session, database: database) { [self] _, context, db, reply in
            let uid = try context.requireUID()
            let waiter = nextWaiter.wrappingAdd(1, ordering: .relaxed).newValue
            let actions = try machine.withLock { machine in
                try apply([Submission(inputs: [.checkRequested(uid: uid, waiter: waiter)])], to: &machine, in: db)
            }
            db.afterNextTransaction { _ in
                self.waiters.withLock { $0[waiter] = { reply.send($0) } }
                for action in actions { self.perform(action) }
            }
            return nil
        }
        dispatcher.on(SetUpProfile.self, access: .session, attachment: .optional) { [self] request, context in
            try await setUp(request, uid: try context.requireUID(), image: context.attachment, correlationId: context.message.header.id)
        }
        dispatcher.on(CurrentIntent.self, access: .sessionOrService) { [self] _, context in
            let uid = try context.requireUID()
            return try await withStore(database, write: false, logger: logger) { try OrchestratorStore.routeState(of: uid, in: $0) }
        }
        dispatcher.on(ListRouteStates.self, access: .serviceWithoutUID) { [self] request, _ in
            let limit = min(request.limit ?? ListRouteStates.maximumLimit, ListRouteStates.maximumLimit)
            guard limit >= 1 else { throw ServiceError(.invalidRequest, "limit must be at least 1.") }
            return try await withStore(database, write: false, logger: logger) {
                try OrchestratorStore.routeStates(after: request.afterUID, limit: limit, in: $0)
            }
        }
        dispatcher.onEventsAfter(database: database)
        return dispatcher
    }

    /// "Check me now": the same decision as after sign-in, also answered to the caller.
    func check(uid: String) async throws -> OnboardingStatus {
        let waiter = nextWaiter.wrappingAdd(1, ordering: .relaxed).newValue
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                waiters.withLock { $0[waiter] = { continuation.resume(returning: $0) } }
                // Cancelled before the continuation was stored: onCancel found nothing to resume.
                if Task.isCancelled {
                    resume(waiter, with: .failure(Self.stopping))
                } else {
                    send(.checkRequested(uid: uid, waiter: waiter))
                }
            }
        } onCancel: {
            resume(waiter, with: .failure(Self.stopping))
        }
        return try result.get()
    }

    static let stopping = ServiceError(.shuttingDown, "The orchestrator is stopping; ask again in a moment.")
}
