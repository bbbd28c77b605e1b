import Foundation

// The hot path: handlers that run on the bus's own thread.
//
// A bus has one thread of its own (the ZeroMQ bus's I/O thread; the in-process bus's loop
// thread). A handler registered with ``MessageBus/serve(at:limits:onLoop:)`` or
// ``MessageBus/subscribe(to:topics:limits:onLoop:)`` is called on that thread with everything
// that arrived together, as raw frames, so that a service can read each message once, decide,
// commit the whole batch in one transaction, and only then answer: replies and events it sends
// during the call leave when the call returns, with no hand-off to another thread.
//
// A loop handler must not wait for anything but local work (SQLite, the CPU): while it runs, the
// bus reads and sends nothing. Work that waits (a call to another service) goes to a task, and
// its result comes back to the loop as a message or through ``BusLoopRegistration``'s owner.

/// A request as it arrived, not yet read, with the means to answer it once.
///
/// The bus has checked only the frames' sizes against the endpoint's limits; reading the JSON
/// (see ``Message/init(topic:body:attachment:)``) is the handler's job, so that it reads each
/// message once, in the form it needs.
public struct RawRequest: Sendable {
    /// The JSON envelope.
    public let body: Data
    /// The binary frame after the envelope, if there was one.
    public let attachment: Data?
    /// The name of the caller's key, as the bus authenticated it (see ``Message/caller``).
    public let caller: String?
    /// When the bus took the request off the wire.
    public let received: ContinuousClock.Instant
    /// Told of the reply, once its type is known (see ``ReplyObserver``).
    public var observer: (any ReplyObserver)?
    private let responder: @Sendable (OutgoingMessage) -> Void

    public init(
        body: Data, attachment: Data?, caller: String? = nil, received: ContinuousClock.Instant = .now,
        responder: @escaping @Sendable (OutgoingMessage) -> Void
    ) {
        self.body = body
        self.attachment = attachment
        self.caller = caller
        self.received = received
        self.responder = responder
    }

    /// Sends `reply` to the caller. Only the first reply to a request is delivered.
    ///
    /// Called on the bus's thread, the reply leaves when the handler returns.
    public func reply(_ reply: OutgoingMessage) {
        observer?.replied(reply, received: received)
        responder(reply)
    }

    /// The same request once its envelope has been read.
    public func incoming(_ message: Message) -> IncomingRequest {
        var message = message
        message.caller = caller
        var request = IncomingRequest(message: message, received: received, responder: responder)
        request.observer = observer
        return request
    }
}

/// Learns how each request was answered, and how long after it arrived: what a service's
/// metrics count and time. Called on the thread that replies (the bus's own, on the hot path),
/// so it must not wait for anything.
public protocol ReplyObserver: Sendable {
    func replied(_ reply: OutgoingMessage, received: ContinuousClock.Instant)
}

/// An event as it arrived, not yet read.
public struct RawEvent: Sendable {
    public let topic: String
    /// The JSON envelope.
    public let body: Data
    public let attachment: Data?

    public init(topic: String, body: Data, attachment: Data? = nil) {
        self.topic = topic
        self.body = body
        self.attachment = attachment
    }
}

/// A loop handler's place on the bus: a bound server or a live subscription.
public protocol BusLoopRegistration: Sendable {
    /// Unbinds the server (replies already given are still sent) or ends the subscription.
    /// Calling it again does nothing.
    func close()
}

/// Runs the loop handlers of an ``InProcessBus`` on one thread of its own, as the ZeroMQ bus's
/// I/O thread runs its own: jobs run in the order they were submitted; a job submitted from the
/// loop thread runs after the current one. The thread ends once the last reference is gone and
/// the queue is empty.
///
/// Threading: ``submit(_:)`` from any thread; jobs run on the loop thread only.
///
/// Why ours: a serial `DispatchQueue` may run successive jobs on different threads, and the
/// contract, like the ZeroMQ bus's I/O thread, is one thread for the bus's life
/// (`BusLoopContractTests`); NIO's one-thread pool would bring NIO into the interface module
/// that every user's tests link.
final class LoopThread: Sendable {
    private let queue = JobQueue()

    init(name: String) {
        let queue = self.queue
        let thread = Thread {
            while let jobs = queue.waitAndTake() {
                for job in jobs { job() }
            }
        }
        thread.name = name
        thread.start()
    }

    deinit {
        queue.stop()
    }

    func submit(_ job: @escaping @Sendable () -> Void) {
        queue.append(job)
    }
}

/// Jobs behind a condition variable.
//
// @unchecked Sendable: `jobs` and `stopped` are only touched with `condition` locked.
private final class JobQueue: @unchecked Sendable {
    private let condition = NSCondition()
    private var jobs: [@Sendable () -> Void] = []
    private var stopped = false

    func append(_ job: @escaping @Sendable () -> Void) {
        condition.lock()
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    func stop() {
        condition.lock()
        stopped = true
        condition.signal()
        condition.unlock()
    }

    /// Waits until jobs are queued and takes them all; `nil` once stopped with none left.
    func waitAndTake() -> [@Sendable () -> Void]? {
        condition.lock()
        defer { condition.unlock() }
        while jobs.isEmpty {
            if stopped { return nil }
            condition.wait()
        }
        defer { jobs = [] }
        return jobs
    }
}
