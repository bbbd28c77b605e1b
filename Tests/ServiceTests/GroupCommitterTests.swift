import FuzzKit
import ServiceRuntime
import Synchronization
import Testing

@Suite("Group commit: whatever queued while a transaction ran goes into the next")
struct GroupCommitterTests {
    /// A commit that records each batch and, for the first one, waits until the test opens it.
    final class Store: Sendable {
        let batches = Mutex<[[Int]]>([])
        let (opened, open) = AsyncStream.makeStream(of: Void.self)
        let (entered, enter) = AsyncStream.makeStream(of: Void.self)

        func commit(_ jobs: [Int]) async -> [String] {
            let first = batches.withLock { batches in
                batches.append(jobs)
                return batches.count == 1
            }
            if first {
                enter.finish()
                for await _ in opened {}
            }
            return jobs.map { "done \($0)" }
        }
    }

    @Test("a job alone commits at once; jobs that arrive meanwhile commit together next, in order, each with its outcome")
    func batchesWhatQueued() async throws {
        let store = Store()
        let committer = GroupCommitter<Int, String>(maxBatch: 4) { await store.commit($0) }
        let first = Task { await committer.submit(0) }
        for await _ in store.entered {}  // the first transaction runs, and waits
        let later = (1...6).map { job in Task { await committer.submit(job) } }
        // Every later job waits: nothing else commits while the first is held.
        let deadline = ContinuousClock.now + .seconds(10)
        while committer.waitingCount < 6, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(1)) }
        #expect(committer.waitingCount == 6 && store.batches.withLock { $0.count } == 1)
        store.open.finish()
        #expect(await first.value == "done 0")
        for (index, task) in later.enumerated() { #expect(await task.value == "done \(index + 1)") }
        let batches = store.batches.withLock { $0 }
        #expect(batches.first == [0])
        #expect(batches.dropFirst().map(\.count) == [4, 2], "the six that waited: at most four per transaction")
        #expect(batches.dropFirst().flatMap { $0 }.sorted() == Array(1...6))
        #expect(await committer.submit(7) == "done 7", "idle again: the next job starts a transaction of its own")
        #expect(store.batches.withLock { $0.last } == [7])
    }
}

@Suite("Group commit under random interleavings")
struct GroupCommitterInterleavingTests {
    @Test("whatever the timing: every job is committed once, with its own outcome, in batches that keep submission order", arguments: 0..<20)
    func anyInterleaving(seed: Int) async {
        var generator = FuzzRandom(seed: UInt64(seed))
        let maxBatch = Int.random(in: 1...5, using: &generator)
        let delays = (0..<40).map { _ in Int.random(in: 0...3, using: &generator) }
        let batches = Mutex<[[Int]]>([])
        let committer = GroupCommitter<Int, Int>(maxBatch: maxBatch) { jobs in
            batches.withLock { $0.append(jobs) }
            for _ in 0..<(jobs.first.map { delays[$0] } ?? 0) { await Task.yield() }
            return jobs.map { $0 * 10 }
        }
        let outcomes = await withTaskGroup(of: (Int, Int).self) { group in
            for job in delays.indices {
                group.addTask {
                    for _ in 0..<delays[job] { await Task.yield() }
                    return (job, await committer.submit(job))
                }
            }
            return await group.reduce(into: [:]) { $0[$1.0] = $1.1 }
        }
        #expect(outcomes.count == delays.count && outcomes.allSatisfy { $0.value == $0.key * 10 }, "each caller gets its own outcome")
        let committed = batches.withLock { $0 }
        #expect(committed.flatMap { $0 }.sorted() == Array(delays.indices), "every job committed exactly once")
        #expect(committed.allSatisfy { !$0.isEmpty && $0.count <= maxBatch }, "no batch empty or above the limit")
        #expect(committer.waitingCount == 0)
    }
}
