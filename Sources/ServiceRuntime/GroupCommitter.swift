import Synchronization

/// Batches work into as few transactions as the load needs: a job submitted while no
/// transaction runs starts one at once; jobs submitted while one runs wait, and all of them go
/// into the next one together (up to ``maxBatch``).
///
/// So at low load each job has its own transaction and waits for nobody, and at high load the
/// number of transactions stays at what the store can commit while each carries many jobs. The
/// SQLite services get the same effect from the bus's loop (a batch is what arrived together);
/// a store reached over the network, whose commit takes a round trip, uses this instead.
///
/// `commit` gets the jobs in submission order and returns one outcome per job, in the same
/// order. A submitted job is always carried out, even when its caller is cancelled meanwhile
/// (a transaction cannot take one job back out), and its caller gets its outcome.
///
/// Thread safety: any task may submit; one batch runs at a time.
public final class GroupCommitter<Job: Sendable, Outcome: Sendable>: Sendable {
    public typealias Commit = @Sendable ([Job]) async -> [Outcome]

    /// The most jobs one transaction carries.
    public let maxBatch: Int
    private let commit: Commit
    private let state = Mutex(State())

    private struct State {
        var waiting: [(job: Job, reply: CheckedContinuation<Outcome, Never>)] = []
        /// Whether a task is committing batches now; it takes every job that waits when it is done.
        var running = false
    }

    public init(maxBatch: Int = 1_000, commit: @escaping Commit) {
        precondition(maxBatch > 0, "maxBatch must be at least 1")
        self.maxBatch = maxBatch
        self.commit = commit
    }

    /// How many jobs wait for the next transaction.
    public var waitingCount: Int {
        state.withLock { $0.waiting.count }
    }

    /// Carries out `job` in the next transaction and returns its outcome.
    public func submit(_ job: Job) async -> Outcome {
        await withCheckedContinuation { reply in
            let start = state.withLock { state in
                state.waiting.append((job, reply))
                defer { state.running = true }
                return !state.running
            }
            if start { Task { await run() } }
        }
    }

    /// Commits batches until nothing waits.
    private func run() async {
        while true {
            let batch = state.withLock { state in
                let batch = Array(state.waiting.prefix(maxBatch))
                state.waiting.removeFirst(batch.count)
                if batch.isEmpty { state.running = false }
                return batch
            }
            if batch.isEmpty { return }
            let outcomes = await commit(batch.map(\.job))
            precondition(outcomes.count == batch.count, "a commit must return one outcome per job")
            for (entry, outcome) in zip(batch, outcomes) { entry.reply.resume(returning: outcome) }
        }
    }
}
