import Synchronization

/// A clock that moves only when a test says so, for testing time-based code without waiting.
///
/// `onSleep` is called whenever a task starts sleeping on it, so a test can wait for that event
/// instead of polling.
final class ManualClock: Clock, Sendable {
    struct Instant: InstantProtocol {
        var offset: Duration
        func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        func duration(to other: Instant) -> Duration { other.offset - offset }
        static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }
    }

    private struct Sleeper {
        var deadline: Instant
        var continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now = Instant(offset: .zero)
        var nextID = 0
        var sleepers: [Int: Sleeper] = [:]
    }

    private let state = Mutex(State())
    private let onSleep: @Sendable () -> Void

    init(onSleep: @escaping @Sendable () -> Void = {}) { self.onSleep = onSleep }

    var now: Instant { state.withLock { $0.now } }
    var minimumResolution: Duration { .zero }

    func sleep(until deadline: Instant, tolerance: Duration?) async throws {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let resumeNow = state.withLock { state -> Bool in
                    if deadline <= state.now || Task.isCancelled { return true }
                    state.sleepers[id] = Sleeper(deadline: deadline, continuation: continuation)
                    return false
                }
                if resumeNow {
                    if Task.isCancelled { continuation.resume(throwing: CancellationError()) } else { continuation.resume() }
                } else {
                    onSleep()
                }
            }
        } onCancel: {
            let sleeper = state.withLock { $0.sleepers.removeValue(forKey: id) }
            sleeper?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Moves time forward and wakes every sleeper whose deadline has come.
    func advance(by duration: Duration) {
        wake { $0.now.advanced(by: duration) }
    }

    /// Whether some task is sleeping on this clock.
    var hasSleepers: Bool { state.withLock { !$0.sleepers.isEmpty } }

    /// Moves time forward to the earliest deadline anyone sleeps until, and wakes every sleeper
    /// whose deadline has come. Returns false, and leaves time alone, if nobody sleeps.
    @discardableResult
    func advanceToNextDeadline() -> Bool {
        wake { state in state.sleepers.values.map(\.deadline).min().map { max($0, state.now) } }
    }

    /// Sets the time to `newNow(state)`, if any, and wakes every sleeper whose deadline has come.
    @discardableResult
    private func wake(_ newNow: (State) -> Instant?) -> Bool {
        let due = state.withLock { state -> [Sleeper]? in
            guard let now = newNow(state) else { return nil }
            state.now = now
            let due = state.sleepers.filter { $0.value.deadline <= now }
            for id in due.keys { state.sleepers[id] = nil }
            return Array(due.values)
        }
        guard let due else { return false }
        for sleeper in due { sleeper.continuation.resume() }
        return true
    }
}
