import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime

/// The profile service's request handlers: the cache and the store, put together.
///
/// Thread safety: immutable; handlers run concurrently, one task per request.
struct ProfileRequests: Sendable {
    let store: any ProfileStorage
    let cache: ProfileCache

    func dispatcher(sessions: any SessionVerifier, serviceToken: String?, logger: Logger) -> RequestDispatcher {
        var dispatcher = RequestDispatcher(
            source: ServiceName.profile, sessions: sessions, serviceToken: serviceToken, logger: logger)
        // The orchestrator asks for a profile on every check: on SQLite, answered on the bus's
        // thread; elsewhere from the cache, or the store when the cache misses.
        let cache = self.cache
        if let sqlite = store as? ProfileStore {
            dispatcher.onLoop(GetProfile.self, access: .sessionOrService, database: sqlite.writer, writes: false) { _, context, db in
                let uid = try context.requireUID()
                switch cache.lookup(uid) {
                case .hit(let answer):
                    return answer
                case .miss(let ticket):
                    let answer = try ProfileStore.read(uid: uid, in: db)
                    cache.fill(uid, with: answer, ticket: ticket)
                    return answer
                }
            }
            dispatcher.onEventsAfter(database: sqlite.writer)
        } else {
            dispatcher.on(GetProfile.self, access: .sessionOrService) { _, context in
                let uid = try context.requireUID()
                switch cache.lookup(uid) {
                case .hit(let answer):
                    return answer
                case .miss(let ticket):
                    let answer = try await store.read(uid: uid)
                    cache.fill(uid, with: answer, ticket: ticket)
                    return answer
                }
            }
            dispatcher.on(EventsAfter.self, access: .serviceWithoutUID) { request, _ in
                try await store.events(after: request.sequence, limit: request.limit)
            }
        }
        dispatcher.on(CreateProfile.self, access: .service) { request, context in
            let created = try await store.createRecorded(
                uid: context.requireUID(), username: request.username, imagePath: request.imagePath,
                idempotencyKey: request.idempotencyKey, attempt: request.attempt, correlationId: context.message.header.id)
            return ProfileResult(profile: created.profile, asOfSequence: created.sequence)
        }
        dispatcher.on(AbandonCreates.self, access: .service) { request, context in
            try await store.abandonCreates(uid: context.requireUID(), through: request.throughAttempt)
        }
        dispatcher.on(UpdateProfile.self, access: .sessionOrService) { request, context in
            let updated = try await store.updateRecorded(
                uid: context.requireUID(), username: request.username, imagePath: request.imagePath,
                correlationId: context.message.header.id)
            return ProfileResult(profile: updated.profile, asOfSequence: updated.sequence)
        }
        dispatcher.on(DeleteProfile.self, access: .sessionOrService) { request, context in
            let uid = try context.requireUID()
            // An app deletes a profile only as the person's own request: a withdrawal is auth's
            // to announce (auth.withdraw), and the orchestrator treats the two differently.
            if request.reason == .withdrawal, context.message.header.sessionToken != nil {
                throw Self.withdrawalFromSession
            }
            let deleted = try await store.delete(uid: uid, reason: request.reason, correlationId: context.message.header.id)
            cache.remove(uid)
            return DeleteProfileResult(deleted: deleted)
        }
        dispatcher.on(CheckUsername.self, access: .open) { request, _ in
            try await store.availability(of: request.username)
        }
        dispatcher.on(EvictCachedProfile.self, access: .service) { _, context in
            cache.remove(try context.requireUID())
            return Acknowledged()
        }
        return dispatcher
    }

    /// The refusal of `profile.delete` with reason `withdrawal` from an app (a session caller).
    static let withdrawalFromSession = ServiceError(
        .invalidRequest,
        "An app deletes a profile with reason 'request'; 'withdrawal' is for our services. "
            + "To withdraw the account, call auth.withdraw.",
        reason: "withdrawalNotAllowed")
}
