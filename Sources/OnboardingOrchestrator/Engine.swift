import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime
import Synchronization

/// Carries out the state machine's decisions and keeps them.
///
/// **One way in: decisions commit on the bus's own thread, in batches.** Live events (from
/// ``EventFeed``), "check me now" requests and profile-check answers arrive there already;
/// everything else (events the feed fetched, timers, clean-up and set-up outcomes) is queued and
/// handed to that thread with ``MessageBus/perform(onLoop:)``, which takes whatever has queued up
/// at once. Each batch is fed to the machine inside one write transaction, which also stores the
/// people it changed, the feeds' cursors and the route intents it emitted (in the route outbox,
/// which publishes them after the commit). Under load one commit carries many decisions.
///
/// The machine lives behind a mutex that only these write transactions take. When a
/// transaction rolls back, the next one first rebuilds the machine from the store, so memory
/// never runs ahead of what is stored.
final class Engine: Sendable {
    let configuration: OnboardingOrchestrator.Configuration
    let bus: any MessageBus
    let database: any DatabaseWriter
    let outbox: Outbox
    let logger: Logger
    let work: AsyncStream<Work>.Continuation
    let machine: Mutex<OnboardingStateMachine>
    /// Set when a transaction that changed the machine rolled back: the next one starts the
    /// machine again from the store.
    let stale = Atomic<Bool>(false)
    /// The largest uid with a row in `person` as of this engine's last commit: someone above it
    /// has no row, so nothing is read for them. A new account's uid is time-ordered, above
    /// everyone stored before, so a sign-in of a new account reads nothing before it writes.
    let largestStoredUID = KeptSinceCommit<String>()
    /// The largest stored uid the transaction under way will have committed: set at the end of
    /// `apply`, kept by its commit (one transaction observer for both this and `stale`: GRDB
    /// rebuilds its statement caches for every observer added).
    private let largestAfterCommit = Mutex<String?>(nil)
    /// Inputs waiting for the bus's thread, and whether a job to commit them is on its way there.
    private let inbox = Mutex<(submissions: [Submission], scheduled: Bool, closed: Bool)>(([], false, false))
    /// Who is told the outcome of each "check me now" under way.
    let waiters = Mutex<[OnboardingStateMachine.WaiterID: @Sendable (Result<OnboardingStatus, ServiceError>) -> Void]>([:])
    let nextWaiter = Atomic<UInt64>(0)
    /// People whose set-up is running in this process (a set-up, or settling one).
    let settingUp = Mutex<Set<String>>([])
    let source = ServiceName.orchestrator

    init(configuration: OnboardingOrchestrator.Configuration, bus: any MessageBus, database: any DatabaseWriter,
         outbox: Outbox, logger: Logger, work: AsyncStream<Work>.Continuation) {
        self.configuration = configuration
        self.bus = bus
        self.database = database
        self.outbox = outbox
        self.logger = logger
        self.work = work
        self.machine = Mutex(OnboardingStateMachine(retryPolicy: configuration.retryPolicy))
    }

    // MARK: Inputs

    /// What one caller hands the machine: inputs, and what waits on their commit.
    struct Submission: Sendable {
        var inputs: [OnboardingStateMachine.Input]
        /// The feed and sequence to store as handled, with these inputs.
        var cursor: (String, UInt64)?
        /// Resumed once the inputs have committed (or failed to).
        var committed: CheckedContinuation<Void, any Error>?
        /// Profile answers fetched ahead, by uid: a check these inputs start for that person
        /// takes its answer from here, in the same transaction, instead of asking profile.
        var profiles: [String: ProfileResult] = [:]
    }

    /// Queues `input`; its effects follow once the batch it joins has committed.
    func send(_ input: OnboardingStateMachine.Input) {
        enqueue(Submission(inputs: [input]))
    }

    /// Queues `inputs` and waits until they have committed.
    func sendAndWait(_ inputs: [OnboardingStateMachine.Input]) async throws {
        try await withCheckedThrowingContinuation { continuation in
            enqueue(Submission(inputs: inputs, committed: continuation))
        }
    }

    /// Queues `submission` for the bus's thread; one job there commits everything queued.
    func enqueue(_ submission: Submission) {
        let (accepted, schedule) = inbox.withLock { inbox -> (Bool, Bool) in
            guard !inbox.closed else { return (false, false) }
            inbox.submissions.append(submission)
            defer { inbox.scheduled = true }
            return (true, !inbox.scheduled)
        }
        guard accepted else {
            refuse(submission)
            return
        }
        if schedule, !bus.perform(onLoop: { [self] in commitQueued() }) {
            // The bus has shut down: nothing queued can commit any more.
            for refused in takeQueued() { refuse(refused) }
        }
    }

    /// Tells whoever waits on `submission` (its commit, the "check me now" it carries) that it
    /// will not be carried out: the orchestrator is stopping.
    private func refuse(_ submission: Submission) {
        submission.committed?.resume(throwing: Self.stopping)
        for case .checkRequested(_, let waiter) in submission.inputs {
            resume(waiter, with: .failure(Self.stopping))
        }
    }

    /// On the bus's thread: commits everything queued, in one transaction.
    private func commitQueued() {
        let batch = takeQueued()
        if !batch.isEmpty { try? commitNow(batch) }
    }

    private func takeQueued() -> [Submission] {
        inbox.withLock { inbox in
            defer {
                inbox.submissions = []
                inbox.scheduled = false
            }
            return inbox.submissions
        }
    }

    /// Refuses what is queued from now on (``stopping``); what was queued still commits. Anyone
    /// still waiting for a "check me now" is told to ask again.
    func stopTakingInputs() {
        inbox.withLock { $0.closed = true }
        let waiting = waiters.withLock { waiters in
            defer { waiters = [:] }
            return Array(waiters.values)
        }
        for answer in waiting { answer(.failure(Self.stopping)) }
    }

    /// Returns once what was queued for the bus's thread before this call has been carried out
    /// there (jobs run in turn), or at once when the bus takes no more jobs (it is shutting down:
    /// on a graceful stop the bus stops after the services, so only a cancelled one gets here
    /// early). Call it after ``stopTakingInputs()``, before the database closes.
    func finishQueued() async {
        let bus = self.bus
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            if !bus.perform(onLoop: { done.resume() }) { done.resume() }
        }
    }

    /// Reads the events the engine handles in one pass, payload included.
    static let eventReader: EnvelopeReader = {
        var reader = EnvelopeReader()
        reader.register(SignedIn.self, for: SignedIn.type)
        reader.register(SignedOut.self, for: SignedOut.type)
        reader.register(Withdrawn.self, for: Withdrawn.type)
        reader.register(ProfileCreated.self, for: ProfileCreated.type)
        reader.register(ProfileUpdated.self, for: ProfileUpdated.type)
        reader.register(ProfileDeleted.self, for: ProfileDeleted.type)
        return reader
    }()

    /// An ``EventFeed`` handler: the events' inputs and the feed's new cursor commit together.
    func handle(_ events: [Message], from publisher: String, through sequence: UInt64) async throws {
        try await withCheckedThrowingContinuation { continuation in
            enqueue(Submission(inputs: inputs(from: events), cursor: (publisher, sequence), committed: continuation))
        }
    }

    /// The hot path's ``EventFeed`` handler, on the bus's own thread: live events that follow
    /// the cursor commit with it at once, and their intents are published after the commit.
    func handleOnLoop(_ events: [Message], from publisher: String, through sequence: UInt64) throws {
        try commitNow([Submission(inputs: inputs(from: events), cursor: (publisher, sequence))])
    }

    private func inputs(from events: [Message]) -> [OnboardingStateMachine.Input] {
        var inputs: [OnboardingStateMachine.Input] = []
        inputs.reserveCapacity(events.count)
        for event in events {
            do {
                switch event.header.type {
                case SignedIn.type:
                    let signedIn = try event.payload(as: SignedIn.self)
                    inputs.append(.signedIn(uid: signedIn.uid, isNewAccount: signedIn.isNewAccount, sessions: signedIn.sessions))
                case SignedOut.type:
                    let signedOut = try event.payload(as: SignedOut.self)
                    inputs.append(.signedOut(uid: signedOut.uid, sessions: signedOut.sessions))
                case Withdrawn.type: inputs.append(.withdrawn(uid: try event.payload(as: Withdrawn.self).uid))
                // Profile events are ordered by their own sequence, not by when they arrive.
                case ProfileCreated.type:
                    let uid = try event.payload(as: ProfileCreated.self).profile.uid
                    inputs.append(.profileCreated(uid: uid, asOf: event.header.sequence))
                case ProfileUpdated.type:
                    let uid = try event.payload(as: ProfileUpdated.self).profile.uid
                    inputs.append(.profileUpdated(uid: uid, asOf: event.header.sequence))
                case ProfileDeleted.type:
                    let deleted = try event.payload(as: ProfileDeleted.self)
                    inputs.append(.profileDeleted(uid: deleted.uid, reason: deleted.reason, asOf: event.header.sequence))
                default: break
                }
            } catch {
                logger.warning("ignored an unreadable \(event.header.type) event from \(event.header.source): \(error)")
            }
        }
        return inputs
    }

    // MARK: Committing

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

    // MARK: Actions

    func perform(_ action: OnboardingStateMachine.Action) {
        switch action {
        case .checkProfile(let uid, let check):
            // The hot path of a returning person: asked from the bus's thread, and the answer
            // decided and committed there when it comes.
            bus.call(
                GetProfile(), to: configuration.profileRPC, source: source, uid: uid,
                serviceToken: configuration.serviceToken, timeout: configuration.callTimeout
            ) { [self] result in
                let input: OnboardingStateMachine.Input =
                    switch result {
                    case .success(let found):
                        .profileChecked(uid: uid, check: check, exists: found.profile != nil, asOf: found.asOfSequence)
                    case .failure(let error):
                        .profileCheckFailed(uid: uid, check: check, error: error)
                    }
                // Committed with the other answers that arrived together (one job on the loop).
                send(input)
            }
        case .retryCheck(let uid, let check, let delay, let attempt, let error):
            logger.warning("profile check for \(uid) failed (\(error)); retry \(attempt) in \(delay)")
            enqueue(timer: true) { engine in
                guard (try? await Task.sleep(for: delay)) != nil else { return }
                engine.send(.checkRetryDue(uid: uid, check: check))
            }
        case .emit(let intent):
            // Emitted inside the transaction (see `apply`); never reaches here.
            logger.error("an intent \(intent.intent.rawValue) for \(intent.uid) was not stored")
        case .answer(let waiter, let status):
            resume(waiter, with: .success(status))
        case .answerFailure(let waiter, let error):
            resume(waiter, with: .failure(error))
        case .evictProfileCache(let uid):
            enqueue { engine in
                do {
                    _ = try await engine.call(EvictCachedProfile(), to: engine.configuration.profileRPC, uid: uid)
                } catch {
                    engine.logger.warning("could not clear the cached profile of \(uid): \(error)")
                }
            }
        case .cleanUp(let uid, let step):
            enqueue { engine in
                do {
                    switch step {
                    case .deleteProfile:
                        _ = try await engine.call(DeleteProfile(reason: .withdrawal), to: engine.configuration.profileRPC, uid: uid)
                    case .deleteImages:
                        _ = try await engine.call(DeleteAllImages(), to: engine.configuration.imageRPC, uid: uid)
                    }
                    engine.send(.cleanupFinished(uid: uid, step: step))
                } catch {
                    engine.send(.cleanupFailed(uid: uid, step: step, error: Self.serviceError(error)))
                }
            }
        case .retryCleanup(let uid, let step, let delay, let attempt, let error):
            logger.warning("withdrawal clean-up \(step.rawValue) for \(uid) failed (\(error)); retry \(attempt) in \(delay)")
            enqueue(timer: true) { engine in
                guard (try? await Task.sleep(for: delay)) != nil else { return }
                engine.send(.cleanupRetryDue(uid: uid, step: step))
            }
        }
    }

    func enqueue(timer: Bool = false, _ job: @escaping @Sendable (Engine) async -> Void) {
        work.yield(Work(isTimer: timer) { [self] in await job(self) })
    }

    /// A call to another service on behalf of `uid`, with the service token.
    ///
    /// - Parameter retrying: the call is safe to repeat: resend it after a timeout or while the
    ///   service restarts, for up to two call timeouts. The state machine retries checks and
    ///   clean-ups itself, with backoff and without end.
    func call<Request: APIRequest>(
        _ request: Request, to endpoint: Endpoint, uid: String, correlationId: String? = nil, attachment: Data? = nil,
        retrying: Bool = false
    ) async throws -> Request.Response {
        if retrying {
            return try await bus.callRetrying(
                request, to: endpoint, source: source, uid: uid, serviceToken: configuration.serviceToken,
                correlationId: correlationId, attachment: attachment, timeout: configuration.callTimeout,
                retry: RetryPolicy(initial: .milliseconds(50), maximum: .milliseconds(500)), deadline: configuration.callTimeout * 2)
        }
        return try await bus.call(
            request, to: endpoint, source: source, uid: uid, serviceToken: configuration.serviceToken,
            correlationId: correlationId, attachment: attachment, timeout: configuration.callTimeout)
    }

    func resume(_ waiter: OnboardingStateMachine.WaiterID, with result: Result<OnboardingStatus, ServiceError>) {
        let answer = waiters.withLock { $0.removeValue(forKey: waiter) }
        answer?(result)
    }

    static func serviceError(_ error: any Error) -> ServiceError {
        (error as? ServiceError) ?? ServiceError(.internalError, "\(error)")
    }
}
