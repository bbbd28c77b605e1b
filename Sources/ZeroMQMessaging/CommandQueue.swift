import CZeroMQ
import Foundation
import Messaging
import Synchronization

/// Work handed from async code to the bus's I/O thread.
///
/// Commands carry only `Sendable` values: payload bytes, stream continuations and checked
/// continuations that the I/O thread resumes.
enum Command: Sendable {
    case bindPublisher(id: UInt64, endpoint: Endpoint, done: CheckedContinuation<Void, any Error>)
    case publish(id: UInt64, message: OutgoingMessage)
    case closePublisher(id: UInt64)
    case subscribe(
        id: UInt64, endpoints: [Endpoint], topics: [String], limits: MessageLimits,
        sink: SubscriberSink, done: CheckedContinuation<Void, any Error>)
    case closeSubscriber(id: UInt64)
    case serve(
        id: UInt64, endpoint: Endpoint, limits: MessageLimits, sink: ServerSink, done: CheckedContinuation<Void, any Error>)
    case closeServer(id: UInt64)
    case reply(serverID: UInt64, route: [Data], message: OutgoingMessage)
    case request(OutgoingRequest)
    case cancelRequest(id: UInt64)
    case run(@Sendable () -> Void)
    case shutdown
}

extension Command {
    /// A reply or an event: sent on a socket the I/O thread already has, touching nothing else
    /// of its state, so it may be carried out from inside a handler on that thread.
    var sendsAtOnce: Bool {
        switch self {
        case .publish, .reply: true
        default: false
        }
    }
}

/// A call waiting for its reply, as handed to the I/O thread.
struct OutgoingRequest: Sendable {
    var id: UInt64
    var endpoint: Endpoint
    var message: OutgoingMessage
    var timeout: Duration
    /// Monotonic nanoseconds (see ``monotonicNanoseconds()``).
    var deadline: UInt64
    var waiter: ReplySink
}

/// The mailbox between async callers and the I/O thread, plus the counters both sides read.
///
/// Threading: every method may be called from any thread and never blocks beyond a short mutex
/// hold, except ``takeCommands()`` and ``takeLocalCommands()``, which only the I/O thread calls.
/// Producers append under the mutex and write the eventfd only when no wake-up is already
/// pending, so a burst of commands costs one `write(2)`. Commands submitted on the I/O thread
/// itself (replies and events from a loop handler) wake nothing: a reply or an event with
/// nothing queued before it (commands the loop has taken and not yet carried out included) is
/// sent there and then, anything else is taken as soon as the handler returns.
///
/// Why ours: the I/O thread sleeps in `zmq_poll`, so it must be woken through a file descriptor
/// it polls (the eventfd); no library queue (AsyncChannel, NIO's) wakes a thread blocked in
/// libzmq.
final class CommandQueue: Sendable {
    private struct State {
        var commands: [Command] = []
        /// Commands submitted on the I/O thread, taken right after the handler that made them.
        var local: [Command] = []
        var wakePending = false
        var accepting = true
        var terminated = false
        var shutdownWaiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Mutex(State())
    private let nextID = Atomic<UInt64>(0)
    /// The I/O thread's `pthread_t` (0 until it starts).
    private let loopThread = Atomic<UInt>(0)
    /// Non-blocking eventfd the I/O thread polls next to its sockets. Closed in `deinit`, when no
    /// producer can be left to write to it.
    let wakeFD: Int32
    let statistics = Mutex(BusStatistics())

    init() {
        let fd = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
        precondition(fd >= 0, "eventfd failed: errno \(errno). The process is out of file descriptors.")
        wakeFD = fd
    }

    deinit {
        close(wakeFD)
    }

    func makeID() -> UInt64 {
        nextID.wrappingAdd(1, ordering: .relaxed).newValue
    }

    /// Carries out a reply or an event submitted on the I/O thread there and then (see `submit`).
    /// Set by the I/O thread before anything can run on it, and only ever read there.
    nonisolated(unsafe) private var sendNow: ((Command) -> Void)?
    /// How many batches of taken commands the I/O thread is carrying out (see `carryOut`).
    /// I/O thread only.
    nonisolated(unsafe) private var batchesUnderWay = 0

    /// I/O thread only, once, first: makes it the thread whose commands need no wake-up, and
    /// `send` what carries out its replies and events at once.
    func adoptLoopThread(send: @escaping (Command) -> Void) {
        sendNow = send
        loopThread.store(UInt(pthread_self()), ordering: .releasing)
    }

    /// Queues `command` for the I/O thread. Returns `false` once the bus is shutting down.
    @discardableResult
    func submit(_ command: Command) -> Bool {
        let onLoop = UInt(pthread_self()) == loopThread.load(ordering: .acquiring)
        let (accepted, wake, now) = state.withLock { state -> (Bool, Bool, Bool) in
            guard state.accepting else { return (false, false, false) }
            // On the I/O thread itself nothing needs waking, unless commands from other threads
            // are already waiting: then this one queues behind them, so that, for example, an
            // event committed later is never sent before one committed earlier. A reply or an
            // event with nothing queued before it goes out at once (an event from inside the
            // commit that recorded it, before the handler's own bookkeeping); while the loop
            // carries out commands it has taken, the rest of them came first, so it queues.
            if onLoop, state.commands.isEmpty {
                if state.local.isEmpty, batchesUnderWay == 0, command.sendsAtOnce { return (true, false, true) }
                state.local.append(command)
                return (true, false, false)
            }
            state.commands.append(command)
            if state.wakePending { return (true, false, false) }
            state.wakePending = true
            return (true, true, false)
        }
        if now, let sendNow { sendNow(command) }
        if wake { signal() }
        return accepted
    }

    /// Stops accepting commands, queues `.shutdown` (once) and resumes `waiter` when the I/O
    /// thread has finished.
    func requestShutdown(waiter: CheckedContinuation<Void, Never>?) {
        let (resumeNow, wake) = state.withLock { state -> (Bool, Bool) in
            if state.terminated { return (true, false) }
            if let waiter { state.shutdownWaiters.append(waiter) }
            guard state.accepting else { return (false, false) }
            state.accepting = false
            state.commands.append(.shutdown)
            let wake = !state.wakePending
            state.wakePending = true
            return (false, wake)
        }
        if wake { signal() }
        if resumeNow { waiter?.resume() }
    }

    /// I/O thread only: consumes the wake-up and takes every queued command.
    ///
    /// The eventfd is read before the queue is swapped, so a producer that finds `wakePending`
    /// still set has its command taken by this swap, and any later one writes the eventfd again.
    func takeCommands() -> [Command] {
        var counter: UInt64 = 0
        _ = read(wakeFD, &counter, MemoryLayout<UInt64>.size)
        return state.withLock { state in
            state.wakePending = false
            let commands = state.commands
            state.commands = []
            state.commands.reserveCapacity(commands.count)
            return commands
        }
    }

    /// Whether commands from other threads wait (their eventfd write is pending), as the
    /// eventfd would say, without a system call.
    var wakePending: Bool { state.withLock { $0.wakePending } }

    /// I/O thread only: carries out `commands` (taken with ``takeCommands()`` or
    /// ``takeLocalCommands()``) in order with `perform`. A reply or an event they submit queues
    /// behind the ones not yet carried out, which were submitted before it, instead of going
    /// out at once.
    func carryOut(_ commands: [Command], with perform: (Command) -> Void) {
        batchesUnderWay += 1
        defer { batchesUnderWay -= 1 }
        for command in commands { perform(command) }
    }

    /// I/O thread only: the commands it submitted itself since the last call.
    func takeLocalCommands() -> [Command] {
        state.withLock { state in
            defer { state.local = [] }
            return state.local
        }
    }

    /// I/O thread only, as its last act: wakes everyone waiting in `shutdown()`.
    func markTerminated() {
        sendNow = nil
        let waiters = state.withLock { state in
            state.terminated = true
            let waiters = state.shutdownWaiters
            state.shutdownWaiters = []
            return waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    func count(_ update: (inout BusStatistics) -> Void) {
        statistics.withLock { update(&$0) }
    }

    private func signal() {
        var one: UInt64 = 1
        // EAGAIN only when the counter would overflow, which means a wake-up is pending anyway.
        _ = write(wakeFD, &one, MemoryLayout<UInt64>.size)
    }
}

/// Nanoseconds on the monotonic clock; deadlines are computed by callers and checked by the
/// I/O thread on the same clock.
func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

extension Duration {
    /// Whole nanoseconds, clamped to zero and to about 100 years.
    var clampedNanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        if seconds < 0 { return 0 }
        if seconds > 3_000_000_000 { return 3_000_000_000 * 1_000_000_000 }
        return UInt64(seconds) * 1_000_000_000 + UInt64(max(0, attoseconds) / 1_000_000_000)
    }
}
