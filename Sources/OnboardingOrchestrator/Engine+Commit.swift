import GRDB
import Messaging
import OnboardingAPI
import ServiceRuntime
import Tracing

/// One transaction per batch: the machine's decisions, the people and cursors they change and the
/// intents they emit; after a rollback, and at start-up, the machine is rebuilt from the store.
extension Engine {
    /// SQLite: applies `batch` to the machine and stores the outcome in one transaction, then
    /// carries out the actions. On failure everyone waiting on the batch is told, and the error
    /// rethrown. Called on the bus's thread.
    func commitNow(_ batch: [Submission], in sqlite: SQLiteOrchestratorStorage) throws {
        let started = ContinuousClock.now
        let tracedStart = DefaultTracerClock.now
        do {
            let actions = try decide(batch, in: sqlite)
            count(batch, committed: true, since: started, tracedStart)
            committed(batch, actions)
        } catch {
            count(batch, committed: false, since: started, tracedStart)
            try failed(batch, error)
        }
    }

    /// The batch's transaction, its size and its decisions, for the metrics.
    private func count(
        _ batch: [Submission], committed: Bool, since started: ContinuousClock.Instant, _ tracedStart: DefaultTracerClock.Instant
    ) {
        StoreFigures.transaction(committed: committed, since: started)
        traces.ended(batch.flatMap(\.spans), committed: committed, started: tracedStart)
        guard committed else { return figures.rolledBack() }
        StoreFigures.eventBatch(batch.reduce(0) { $0 + $1.inputs.count })
        figures.committed()
    }

    /// SQLite: applies `batch` to the machine and stores the outcome in one transaction.
    /// - Returns: the actions to carry out now that it has committed.
    func decide(_ batch: [Submission], in sqlite: SQLiteOrchestratorStorage) throws -> [OnboardingStateMachine.Action] {
        try sqlite.database.writeTransaction { [self] db in
            observeCommit(of: db)
            var decisions = SQLiteDecisions(
                db: db, outbox: sqlite.outbox,
                largestStored: try largestStoredUID.value(in: db) ?? OrchestratorStore.largestUID(in: db))
            let actions = try machine.withLock { machine in try apply(batch, to: &machine, in: &decisions) }
            largestAfterCommit.withLock { $0 = decisions.largestStored }
            return actions
        }
    }

    /// A shared store: reads what `batch` needs, applies it to the machine and stores the outcome
    /// in one transaction off the bus's thread, then carries out the actions. On failure everyone
    /// waiting on the batch is told; the next batch starts the machine again from the store.
    func commit(_ batch: [Submission], in store: any BufferedDecisionStore) async {
        let started = ContinuousClock.now
        let tracedStart = DefaultTracerClock.now
        do {
            let actions = try await decide(batch, in: store)
            count(batch, committed: true, since: started, tracedStart)
            committed(batch, actions)
        } catch {
            count(batch, committed: false, since: started, tracedStart)
            // Whatever failed after the machine moved on (the writes, the commit) leaves it ahead
            // of the store.
            stale.store(true, ordering: .releasing)
            try? failed(batch, error)
        }
    }

    /// A shared store: applies `batch` to the machine and stores the outcome in one transaction.
    /// When it throws, the machine may have moved on: the caller marks it stale (``commit(_:in:)``).
    /// - Returns: the actions to carry out now that it has committed.
    func decide(_ batch: [Submission], in store: any BufferedDecisionStore) async throws -> [OnboardingStateMachine.Action] {
        // Commits take turns, and only a failed one marks the machine stale: this holds until `apply`.
        let restarting = stale.load(ordering: .acquiring)
        // The stored rows of everyone the batch names whom the machine will not know: when it
        // starts again from the store, that is everyone.
        let unknown = machine.withLock { machine in
            var uids: Set<String> = []
            for submission in batch {
                for input in submission.inputs where restarting || !machine.isTracking(input.uid) { uids.insert(input.uid) }
            }
            return Array(uids)
        }
        return try await store.commit(reading: unknown, restarting: restarting) { [self] buffer in
            try machine.withLock { machine in try apply(batch, to: &machine, in: &buffer) }
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

    /// SQLite: after `db`'s transaction, keeps the largest stored uid it committed; after a
    /// rollback, marks the machine stale. Registered first, so that a rollback anywhere in the
    /// transaction (the rebuild included) is noticed.
    private func observeCommit(of db: Database) {
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
    }

    /// Feeds `batch` to the machine inside `transaction`, which stores the people it changed, the
    /// feeds' cursors and the route intents it emitted. Returns the actions to carry out once it
    /// has committed.
    func apply<Transaction: DecisionTransaction>(
        _ batch: [Submission], to machine: inout OnboardingStateMachine, in transaction: inout Transaction
    ) throws -> [OnboardingStateMachine.Action] {
        var later: [OnboardingStateMachine.Action] = []
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
            for (uid, person) in try transaction.peopleWithWork() {
                later += machine.restore(uid: uid, person)
            }
        }
        // Each person's row and each feed's cursor are written once per transaction, after
        // the batch: the last intent emitted for a person goes in with its row.
        var emitted: [String: OrchestratorStore.PublishedIntent] = [:]
        var cursors: [String: UInt64] = [:]
        for submission in batch {
            var inputs = submission.inputs
            var profiles = submission.profiles
            var next = 0
            while next < inputs.count {
                let input = inputs[next]
                next += 1
                if !machine.isTracking(input.uid), let stored = try transaction.storedPerson(input.uid) {
                    later += machine.restore(uid: input.uid, stored)
                }
                for action in traces.deciding(input.uid, { machine.handle(input) }) {
                    switch action {
                    case .emit(let intent):
                        emitted[intent.uid] = try traces.publishing(intent.uid) { try emit(intent, in: &transaction) }
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
            try transaction.setCursor(publisher, to: sequence)
        }
        for (uid, person) in machine.takeChanges() {
            var published = emitted.removeValue(forKey: uid)
            if let emitted = published, emitted.intent.intentId != person.intent?.intentId {
                // Emitted, then replaced or withdrawn within the transaction: recorded as it was,
                // then the row says what is in force now.
                try transaction.recordIntent(emitted)
                published = nil
            }
            try transaction.save(uid, person, published: published)
        }
        // An intent emitted again without a change of state (a repeat for a new session).
        for published in emitted.values {
            try transaction.recordIntent(published)
        }
        return later
    }

    /// Whether `uid` sorts after `other` in byte order (SQLite's order for text, so `max(uid)`'s).
    static func isAbove(_ uid: String, _ other: String) -> Bool {
        other.utf8.lexicographicallyPrecedes(uid.utf8)
    }

    /// Puts a route intent in the route outbox, which publishes it once the transaction
    /// commits; the caller records it as the person's intent in force.
    private func emit<Transaction: DecisionTransaction>(
        _ intent: RouteIntent, in transaction: inout Transaction
    ) throws -> OrchestratorStore.PublishedIntent {
        let published = try transaction.emit(intent, time: Timestamp.now())
        figures.decided(intent)
        logger.debug("\(intent.intent.rawValue) → \(intent.uid) (\(intent.reason.rawValue), \(intent.intentId))")
        return published
    }

    /// Puts back everyone with work under way (checks, clean-ups) and resumes it.
    func resumeUnfinishedWork() async throws {
        let people = try await storage.peopleWithWork()
        let actions = machine.withLock { machine in
            people.flatMap { uid, person in machine.restore(uid: uid, person) }
        }
        if !actions.isEmpty { logger.info("resuming \(actions.count) unfinished check(s) and clean-up step(s)") }
        for action in actions { perform(action) }
    }
}
