/// Wakes one waiting task, or its next wait: a wake-up with nobody waiting is kept (one at
/// most), so none is lost between a check and a wait. An `AsyncStream` that keeps its newest
/// element, and a waiter that races it against a timeout.
///
/// Thread safety: ``wake()`` from any thread or task; one task holds the ``Waiter``.
struct WakeSignal: Sendable {
    private let wakeUps = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))

    func wake() { wakeUps.continuation.yield() }

    /// The waiting side, for the one task that waits.
    func makeWaiter() -> Waiter {
        Waiter(wakeUps: wakeUps.stream.makeAsyncIterator(), wake: wakeUps.continuation)
    }

    struct Waiter {
        fileprivate var wakeUps: AsyncStream<Void>.Iterator
        fileprivate let wake: AsyncStream<Void>.Continuation

        /// Returns at the next wake-up (at once if one is pending), after `timeout` when given,
        /// or when the task is cancelled.
        mutating func wait(timeout: Duration?) async {
            await withTaskGroup(of: Void.self) { group in
                if let timeout {
                    group.addTask { [wake] in
                        if (try? await Task.sleep(for: timeout)) != nil { wake.yield() }
                    }
                }
                _ = await wakeUps.next()
                group.cancelAll()
            }
        }
    }
}
