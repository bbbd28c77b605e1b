import Foundation
import Messaging
import Synchronization

/// Live events between the subscription and the feed, with a wait that can time out.
///
/// Bounded: when the feed falls behind, the newest events are dropped; the gap they leave is
/// fetched later. Thread safety: state behind a mutex; one task waits at a time.
///
/// Why ours: an `AsyncStream` with `.bufferingOldest` drops the newest events as this does, but
/// its wait cannot time out without a task per wait, and the feed must wake on a timer to
/// fetch a gap; this is one mutex and one continuation.
final class LiveMailbox: Sendable {
    enum Wake { case ready, timedOut, finished }

    private struct State {
        var messages: [Message] = []
        /// A wake-up with nothing queued, kept until the next wait.
        var woken = false
        var finished = false
        var waiter: (id: UInt64, continuation: CheckedContinuation<Wake, Never>)?
        var lastID: UInt64 = 0
        /// Waits with an id up to this one are over (timed out or cancelled), installed or not.
        var expiredThrough: UInt64 = 0
    }

    private let capacity: Int
    private let state = Mutex(State())

    init(capacity: Int) {
        self.capacity = max(1, capacity)
    }

    /// Queues a live event; drops it when the queue is full.
    func push(_ message: Message) {
        let waiter = state.withLock { state -> CheckedContinuation<Wake, Never>? in
            guard state.messages.count < capacity else { return nil }
            state.messages.append(message)
            return Self.takeWaiter(&state)
        }
        waiter?.resume(returning: .ready)
    }

    /// Wakes the waiting task (or the next one to wait) with `ready`, even with nothing queued.
    func wake() {
        let waiter = state.withLock { state -> CheckedContinuation<Wake, Never>? in
            guard let waiter = Self.takeWaiter(&state) else {
                state.woken = true
                return nil
            }
            return waiter
        }
        waiter?.resume(returning: .ready)
    }

    /// Whether no event is queued.
    var isEmpty: Bool {
        state.withLock { $0.messages.isEmpty }
    }

    /// The live stream has ended.
    func finish() {
        let waiter = state.withLock { state -> CheckedContinuation<Wake, Never>? in
            state.finished = true
            return Self.takeWaiter(&state)
        }
        waiter?.resume(returning: .finished)
    }

    /// Removes and returns up to `count` queued events, oldest first.
    func take(max count: Int) -> [Message] {
        state.withLock { state in
            let taken = Array(state.messages.prefix(count))
            state.messages.removeFirst(taken.count)
            return taken
        }
    }

    /// Waits until an event is queued (`ready`), the stream has ended and nothing is queued
    /// (`finished`), or `timeout` passes or the task is cancelled (`timedOut`).
    func wait(timeout: Duration) async -> Wake {
        let (now, id) = state.withLock { state -> (Wake?, UInt64) in
            if state.woken {
                state.woken = false
                return (.ready, 0)
            }
            if !state.messages.isEmpty { return (.ready, 0) }
            if state.finished { return (.finished, 0) }
            state.lastID += 1
            return (nil, state.lastID)
        }
        if let now { return now }
        let timer = Task {
            guard (try? await Task.sleep(for: timeout)) != nil else { return }
            self.expire(id)
        }
        defer { timer.cancel() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let now = state.withLock { state -> Wake? in
                    if state.woken {
                        state.woken = false
                        return .ready
                    }
                    if !state.messages.isEmpty { return .ready }
                    if state.finished { return .finished }
                    if state.expiredThrough >= id { return .timedOut }
                    state.waiter = (id, continuation)
                    return nil
                }
                if let now { continuation.resume(returning: now) }
            }
        } onCancel: {
            expire(id)
        }
    }

    private func expire(_ id: UInt64) {
        let waiter = state.withLock { state -> CheckedContinuation<Wake, Never>? in
            state.expiredThrough = max(state.expiredThrough, id)
            guard state.waiter?.id == id else { return nil }
            return Self.takeWaiter(&state)
        }
        waiter?.resume(returning: .timedOut)
    }

    private static func takeWaiter(_ state: inout State) -> CheckedContinuation<Wake, Never>? {
        defer { state.waiter = nil }
        return state.waiter?.continuation
    }
}
