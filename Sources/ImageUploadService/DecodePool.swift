import Dispatch
import Foundation
import Messaging
import OnboardingAPI
import Synchronization

/// A fixed number of threads of its own for blocking work (decoding and re-encoding images), so
/// that such work never runs on, or blocks, Swift's cooperative thread pool.
///
/// At most ``threadCount`` jobs run at once; up to ``queueLimit`` more wait in order of arrival,
/// and a job beyond that is refused with `overloaded` rather than queued. Callers suspend (they
/// do not block a thread) until their job has run. A job that has started runs to the end even
/// when its caller is cancelled.
///
/// Threading: every method may be called from any thread or task. The threads start in `init`
/// and end after ``shutdown()`` (or when the pool is released), once the jobs already queued
/// have run.
///
/// Why ours: libvips and its codecs recurse on the thread's stack and need 8 MiB stacks; NIO's
/// `NIOThreadPool` starts threads with the platform's default stack (which depends on the
/// ulimit), and a full queue must refuse with `overloaded` rather than queue without bound.
final class DecodePool: Sendable {
    /// What the pool has done since it started.
    struct Statistics: Sendable, Hashable {
        /// Jobs running now.
        var running = 0
        /// The most jobs that ever ran at once (never more than ``DecodePool/threadCount``).
        var mostRunning = 0
        /// Jobs waiting for a thread now.
        var waiting = 0
        /// Jobs finished.
        var completed = 0
        /// Jobs refused because the queue was full.
        var refused = 0
    }

    private typealias Job = @Sendable () -> Void

    private struct Waiter {
        var condition: @Sendable (Statistics) -> Bool
        var continuation: CheckedContinuation<Void, Never>
    }

    private struct State {
        var jobs: [Job] = []
        var stopped = false
        var statistics = Statistics() {
            didSet { resumeSatisfiedWaiters() }
        }
        var waiters: [Waiter] = []

        mutating func resumeSatisfiedWaiters() {
            guard !waiters.isEmpty else { return }
            let statistics = self.statistics
            waiters.removeAll { waiter in
                guard waiter.condition(statistics) else { return false }
                waiter.continuation.resume()
                return true
            }
        }
    }

    /// What the pool's threads share with it (the threads hold this, not the pool, so the pool
    /// can go away and shut them down).
    private final class Shared: Sendable {
        let state = Mutex(State())
        /// One signal per queued job, and one per thread at shutdown.
        let wakeups = DispatchSemaphore(value: 0)
    }

    let threadCount: Int
    let queueLimit: Int
    private let shared = Shared()

    /// Starts `threads` threads named `<name>-<n>`.
    ///
    /// - Parameters:
    ///   - threads: at least 1.
    ///   - queueLimit: how many jobs may wait for a thread; at least 0.
    init(threads: Int, queueLimit: Int, name: String) {
        precondition(threads >= 1 && queueLimit >= 0)
        self.threadCount = threads
        self.queueLimit = queueLimit
        for index in 1...threads {
            let thread = Thread { [shared] in Self.work(shared) }
            thread.name = "\(name)-\(index)"
            // libvips and its codecs (libheif, libde265) recurse on the thread's stack.
            thread.stackSize = 8 << 20
            thread.start()
        }
    }

    deinit { shutdown() }

    var statistics: Statistics { shared.state.withLock { $0.statistics } }

    /// Suspends until the statistics satisfy `condition` (at once if they do now): for tests
    /// that wait for jobs to be queued or running rather than for time to pass.
    func waitUntil(_ condition: @escaping @Sendable (Statistics) -> Bool) async {
        await withCheckedContinuation { continuation in
            shared.state.withLock { state in
                state.waiters.append(Waiter(condition: condition, continuation: continuation))
                state.resumeSatisfiedWaiters()
            }
        }
    }

    /// Runs `work` on one of the pool's threads and returns its result.
    ///
    /// - Throws: ``ServiceError`` `overloaded` when ``queueLimit`` jobs are already waiting, or
    ///   `shuttingDown` after ``shutdown()``; `work` has not run then.
    func run<T: Sendable>(_ work: @escaping @Sendable () -> T) async throws(ServiceError) -> T {
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<T, ServiceError>, Never>) in
            let refusal: ServiceError? = shared.state.withLock { state in
                if state.stopped {
                    return ServiceError(.shuttingDown, "image-upload is stopping; try again in a moment.")
                }
                guard state.jobs.count < queueLimit else {
                    state.statistics.refused += 1
                    return ServiceError(
                        .overloaded, "image-upload has \(state.jobs.count) images waiting to be decoded; try again shortly.")
                }
                state.jobs.append { continuation.resume(returning: .success(work())) }
                state.statistics.waiting = state.jobs.count
                return nil
            }
            if let refusal {
                continuation.resume(returning: .failure(refusal))
            } else {
                shared.wakeups.signal()
            }
        }
        return try result.get()
    }

    /// Lets the threads end once the queued jobs have run; new jobs are refused with
    /// `shuttingDown`. Returns at once; calling it again does nothing.
    func shutdown() {
        let first = shared.state.withLock { state in
            defer { state.stopped = true }
            return !state.stopped
        }
        guard first else { return }
        for _ in 0..<threadCount { shared.wakeups.signal() }
    }

    /// A thread's life: take a job whenever one is signalled, until the pool stops and nothing is
    /// left to do.
    private static func work(_ shared: Shared) {
        while true {
            shared.wakeups.wait()
            let next: Job?? = shared.state.withLock { state in
                guard !state.jobs.isEmpty else { return state.stopped ? .none : .some(nil) }
                let job = state.jobs.removeFirst()
                state.statistics.waiting = state.jobs.count
                state.statistics.running += 1
                state.statistics.mostRunning = max(state.statistics.mostRunning, state.statistics.running)
                return job
            }
            guard let next else { return }
            guard let job = next else { continue }
            job()
            shared.state.withLock { state in
                state.statistics.running -= 1
                state.statistics.completed += 1
            }
        }
    }
}
