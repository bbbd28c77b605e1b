import GRDB
import Messaging
import OnboardingAPI
import ServiceRuntime

/// One transaction per batch: the machine's decisions, the people and cursors they change and the
/// intents they emit; after a rollback, and at start-up, the machine is rebuilt from the store.
extension Engine {
    /// Applies `batch` to the machine and stores the outcome in one transaction, then carries
    /// out the actions. On failure everyone waiting on the batch is told, and the error rethrown.
    /// Called on the bus's thread.
    func commitNow(_ batch: [Submission]) throws {
        do {
            let actions = try database.writeTransaction { [self] db in
                try machine.withLock { machine in try apply(batch, to: &machine, in: db) }
            }
            committed(batch, actions)
        } catch {
            try failed(batch, error)
        }
    }

    private func committed(_ batch: [Submission], _ actions: [OnboardingStateMachine.Action]) {
        for submission in batch { submission.committed?.resume() }
        for action in actions { perform(action) }
    }

    /// Tells everyone waiting on `batch` (and on the machine's work) that it failed; rethrows.
    private func failed(_ batch: [Submission], _ error: any Error) throws -> Never {
        if !(error is CancellationError) {
            logger.error("could not store \(batch.count) decision(s): \(error); starting again from the store")
        }
        let failure = ServiceError(.storeUnavailable, "The orchestrator could not store a decision; try again.")
        for submission in batch { submission.committed?.resume(throwing: failure) }
        // The machine starts again from the store (see `apply`): what it was working on for
        // waiting callers is gone, so they are told to ask again. Feeds resend their events.
        let waiting = waiters.withLock { waiters in
            defer { waiters = [:] }
            return Array(waiters.values)
        }
        for answer in waiting { answer(.failure(failure)) }
        throw error
    }

    func apply(
        _ batch: [Submission], to machine: inout OnboardingStateMachine, in db: Database
    ) throws -> [OnboardingStateMachine.Action] {
        var later: [OnboardingStateMachine.Action] = []
        // Registered first, so that a rollback anywhere below (the rebuild included) is noticed.
        db.afterNextTransaction(
            onCommit: { [self] db in
                if let largest = largestAfterCommit.withLock({ $0.take() }) {
                    largestStoredUID.keep(largest, committedIn: db)
                } else {
                    largestStoredUID.forget()
                }
            },
            onRollback: { [self] _ in
                stale.store(true, ordering: .releasing)
                largestAfterCommit.withLock { $0 = nil }
                largestStoredUID.forget()
            })
        if stale.exchange(false, ordering: .acquiringAndReleasing) {
            // An earlier transaction rolled back after changing the machine: memory ran ahead of
            // the store. Start again from what is stored, and resume the work under way. The
            // machine forgets who waits for a "check me now": they are told to ask again.
            let waiting = waiters.withLock { waiters in
                defer { waiters = [:] }
                return Array(waiters.values)
            }
            let failure = ServiceError(.storeUnavailable, "The orchestrator could not store a decision; try again.")
            for answer in waiting { answer(.failure(failure)) }
            machine.reset()
            for (uid, person) in try OrchestratorStore.peopleWithWork(in: db) {
                later += machine.restore(uid: uid, person)
            }
        }
        // Each person's row and each feed's cursor are written once per transaction, after
        // the batch: the last intent emitted for a person goes in with its row.
        var emitted: [String: OrchestratorStore.PublishedIntent] = [:]
        var cursors: [String: UInt64] = [:]
        var largestStored = try largestStoredUID.value(in: db) ?? OrchestratorStore.largestUID(in: db)
        for submission in batch {
            var inputs = submission.inputs
            var profiles = submission.profiles
            var next = 0
            while next < inputs.count {
                let input = inputs[next]
                next += 1
                if !machine.isTracking(input.uid), !Self.isAbove(input.uid, largestStored),
                    let stored = try OrchestratorStore.person(input.uid, in: db)
                {
                    later += machine.restore(uid: input.uid, stored)
                }
                for action in machine.handle(input) {
                    switch action {
                    case .emit(let intent):
                        emitted[intent.uid] = try emit(intent, in: db)
                    case .checkProfile(let uid, let check) where profiles[uid] != nil:
                        // Answered ahead (see `Submission.profiles`): decided in this transaction.
                        let found = profiles.removeValue(forKey: uid)!
                        inputs.append(.profileChecked(uid: uid, check: check, exists: found.profile != nil, asOf: found.asOfSequence))
                    default:
                        later.append(action)
                    }
                }
            }
            if let (publisher, sequence) = submission.cursor { cursors[publisher] = sequence }
        }
        for (publisher, sequence) in cursors {
            try OrchestratorStore.setCursor(publisher, to: sequence, in: db)
        }
        for (uid, person) in machine.takeChanges() {
            try OrchestratorStore.save(uid, person, published: emitted.removeValue(forKey: uid), in: db)
            if Self.isAbove(uid, largestStored) { largestStored = uid }
        }
        // An intent emitted again without a change of state (a repeat for a new session).
        for published in emitted.values {
            try OrchestratorStore.recordIntent(published, in: db)
            if Self.isAbove(published.intent.uid, largestStored) { largestStored = published.intent.uid }
        }
        largestAfterCommit.withLock { $0 = largestStored }
        return later
    }

    /// Whether `uid` sorts after `other` in byte order (SQLite's order for text, so `max(uid)`'s).
    static func isAbove(_ uid: String, _ other: String) -> Bool {
        other.utf8.lexicographicallyPrecedes(uid.utf8)
    }

    /// Puts a route intent in the route outbox, which publishes it once the transaction
    /// commits; the caller records it as the person's intent in force.
    func emit(_ intent: RouteIntent, in db: Database) throws -> OrchestratorStore.PublishedIntent {
        let time = Timestamp.now()
        let sequence = try outbox.append(intent, uid: intent.uid, topic: Topics.route(uid: intent.uid), time: time, in: db)
        logger.debug("\(intent.intent.rawValue) → \(intent.uid) (\(intent.reason.rawValue), \(intent.intentId))")
        return OrchestratorStore.PublishedIntent(intent: intent, sequence: sequence, time: time)
    }

    /// Puts back everyone with work under way (checks, clean-ups) and resumes it.
    func resumeUnfinishedWork() async throws {
        let actions = try await withStore(database, logger: logger) { [self] db in
            let people = try OrchestratorStore.peopleWithWork(in: db)
            return machine.withLock { machine in
                people.flatMap { uid, person in machine.restore(uid: uid, person) }
            }
        }
        if !actions.isEmpty { logger.info("resuming \(actions.count) unfinished check(s) and clean-up step(s)") }
        for action in actions { perform(action) }
    }
}
