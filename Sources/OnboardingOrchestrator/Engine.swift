import GRDB
import Logging
import Messaging
import OnboardingAPI
import Tracing
import ServiceRuntime
import Synchronization

/// Carries out the state machine's decisions and keeps them.
///
/// **One way in: decisions commit in batches, one at a time.** On SQLite they commit on the bus's
/// own thread: live events (from ``EventFeed``), "check me now" requests and profile-check
/// answers arrive there already; everything else (events the feed fetched, timers, clean-up and
/// set-up outcomes) is queued and handed to that thread with ``MessageBus/perform(onLoop:)``,
/// which takes whatever has queued up at once. On a shared store (PostgreSQL) one task commits
/// whatever has queued while the previous transaction ran. Each batch is fed to the machine
/// inside one write transaction, which also stores the people it changed, the feeds' cursors and
/// the route intents it emitted (in the route outbox, which publishes them after the commit).
/// Under load one commit carries many decisions.
///
/// The machine lives behind a mutex that only these write transactions take. When a
/// transaction rolls back, the next one first rebuilds the machine from the store, so memory
/// never runs ahead of what is stored.
final class Engine: Sendable {
    let configuration: OnboardingOrchestrator.Configuration
    let bus: any MessageBus
    let storage: any OrchestratorStorage
    /// How decisions are written: SQLite's store on the bus's thread, or a shared one off it.
    let commits: Commits
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
    let largestAfterCommit = Mutex<String?>(nil)
    /// Inputs waiting to commit, whether a job to commit them is on its way, and whether inputs
    /// are still taken.
    private let inbox = Mutex<(submissions: [Submission], scheduled: Bool, closed: Bool)>(([], false, false))
    /// Who is told the outcome of each "check me now" under way.
    let waiters = Mutex<[OnboardingStateMachine.WaiterID: @Sendable (Result<OnboardingStatus, ServiceError>) -> Void]>([:])
    let nextWaiter = Atomic<UInt64>(0)
    /// People whose set-up is running in this process (a set-up, or settling one).
    let settingUp = Mutex<Set<String>>([])
    let source = ServiceName.orchestrator
    /// Decisions, sign-in to intent, clean-ups: for the metrics.
    let figures = DecisionFigures()
    /// Traced events, their decisions and intents: for the traces.
    let traces = DecisionTraces()

    /// The task committing queued batches to a shared store, while it runs.
    private let committing = Mutex<Task<Void, Never>?>(nil)

    enum Commits: Sendable {
        case onLoop(SQLiteOrchestratorStorage)
        case buffered(any BufferedDecisionStore)
    }

    init(configuration: OnboardingOrchestrator.Configuration, bus: any MessageBus, storage: any OrchestratorStorage,
         logger: Logger, work: AsyncStream<Work>.Continuation) throws {
        self.configuration = configuration
        self.bus = bus
        self.storage = storage
        if let sqlite = storage as? SQLiteOrchestratorStorage {
            commits = .onLoop(sqlite)
        } else if let buffered = storage as? any BufferedDecisionStore {
            commits = .buffered(buffered)
        } else {
            throw ServiceError(.internalError, "The orchestrator cannot write decisions to \(type(of: storage)).")
        }
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
        /// The spans of the traced events among the inputs, ended once they have committed.
        var spans: [any Tracing.Span] = []
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

    /// Queues `submission`; one job commits everything queued (on SQLite, on the bus's thread).
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
        guard schedule else { return }
        switch commits {
        case .onLoop(let sqlite):
            if !bus.perform(onLoop: { [self] in commitQueued(in: sqlite) }) {
                // The bus has shut down: nothing queued can commit any more.
                for refused in takeQueued() { refuse(refused) }
            }
        case .buffered(let store):
            // Not in the trace of whatever request queued it: each decision takes its own.
            committing.withLock { $0 = Task { await ServiceContext.withValue(nil) { await commitQueued(in: store) } } }
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
    private func commitQueued(in sqlite: SQLiteOrchestratorStorage) {
        let batch = takeQueued()
        if !batch.isEmpty { try? commitNow(batch, in: sqlite) }
    }

    /// Commits what is queued, a transaction at a time, until nothing is.
    private func commitQueued(in store: any BufferedDecisionStore) async {
        while true {
            let batch = inbox.withLock { inbox -> [Submission] in
                defer { inbox.submissions = [] }
                if inbox.submissions.isEmpty { inbox.scheduled = false }
                return inbox.submissions
            }
            if batch.isEmpty { return }
            await commit(batch, in: store)
        }
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

    /// Returns once what was queued before this call has been carried out (on SQLite, the jobs
    /// queued for the bus's thread run in turn), or at once when the bus takes no more jobs (it is
    /// shutting down: on a graceful stop the bus stops after the services, so only a cancelled
    /// one gets here early). Call it after ``stopTakingInputs()``, before the database closes.
    func finishQueued() async {
        switch commits {
        case .onLoop:
            let bus = self.bus
            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                if !bus.perform(onLoop: { done.resume() }) { done.resume() }
            }
        case .buffered:
            await committing.withLock { $0 }?.value
        }
    }
}
