import Synchronization

/// Wakes one waiting task, or the next one to wait: a wake-up with nobody waiting is kept, so
/// none is lost between a check and a wait.
///
/// Thread safety: ``wake()`` from any thread or task; one task waits at a time.
final class WakeSignal: Sendable {
    private struct State {
        var pending = false
        var waiter: CheckedContinuation<Void, Never>?
    }
    private let state = Mutex(State())

    func wake() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard let waiter = state.waiter else {
                state.pending = true
                return nil
            }
            state.waiter = nil
            return waiter
        }
        waiter?.resume()
    }

    /// Returns at the next wake-up (at once if one is pending), after `timeout` when given, or
    /// when the task is cancelled.
    func wait(timeout: Duration?) async {
        await withTaskGroup(of: Void.self) { group in
            if let timeout {
                group.addTask {
                    guard (try? await Task.sleep(for: timeout)) != nil else { return }
                    self.wake()
                }
            }
            await withTaskCancellationHandler {
                await withCheckedContinuation { continuation in
                    let ready = state.withLock { state -> Bool in
                        if state.pending {
                            state.pending = false
                            return true
                        }
                        state.waiter = continuation
                        return false
                    }
                    if ready { continuation.resume() }
                }
            } onCancel: {
                self.wake()
            }
            group.cancelAll()
        }
    }
}
