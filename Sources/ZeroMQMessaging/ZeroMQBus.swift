import CZeroMQ
import Foundation
import Logging
import Messaging
import ServiceLifecycle
import Synchronization

/// A ``MessageBus`` over ZeroMQ: PUB/SUB for events, DEALER to ROUTER for requests.
///
/// Threading: every method may be called from any task and none blocks a thread. Each bus runs
/// one dedicated I/O thread (not a Swift concurrency task) that owns the libzmq context and every
/// socket of the bus for their whole lives and waits in `poll(2)` on their notification
/// descriptors. Methods hand it commands through a mutex-protected queue and wake it with an
/// eventfd; results come back through continuations. No zmq function is ever called from a Swift concurrency thread.
///
/// Wire formats:
/// - An event is [topic, JSON envelope, optional attachment]; subscriptions filter by topic prefix.
/// - A request as a server's ROUTER sees it is [peer identity, routing frames..., empty, JSON,
///   optional attachment]; the reply echoes every frame before the empty one. So a plain REQ
///   socket in any language can call a server, and this bus's DEALER puts an 8-byte request id
///   before the empty frame to match pipelined replies.
///
/// Requests to an endpoint where nothing is connected wait up to
/// ``Configuration/connectGrace`` for a peer, then fail with `noResponder`; requests that were
/// sent but not answered in time fail with `timeout`.
///
/// A request sent in the instant after a server unbinds, before this side has seen the
/// connection close, is lost with it and fails with `timeout`; later ones get `noResponder`.
///
/// Call ``shutdown()`` when done (or run the bus in a `ServiceGroup`): it closes every socket,
/// fails calls in flight with `closed`, finishes every stream and stops the thread. Dropping the
/// last reference to the bus shuts it down too, so keep it while its streams and publishers are
/// in use.
public final class ZeroMQBus: MessageBus, Service {
    /// Tuning for a bus; the defaults suit services on one network.
    public struct Configuration: Sendable {
        /// How long a request waits for a connection to a server before failing with `noResponder`
        /// (never longer than its own timeout).
        public var connectGrace: Duration = .milliseconds(300)
        /// The largest reply frame accepted (`ZMQ_MAXMSGSIZE` on the requesting side).
        public var maxReplyFrameBytes: Int = 64 * 1024 * 1024
        /// Replies a server queues for one caller that does not read them before dropping more
        /// (counted in ``BusStatistics/droppedReplies``). What a caller that stops reading costs
        /// its server is bounded by this many of that service's replies.
        public var replyHighWaterMark: Int = 10_000
        /// Events a publisher queues for one subscriber that does not read them before dropping
        /// more for it alone; a subscriber recovers what was dropped with `events.after`. What a
        /// subscriber that stops reading costs its publisher is bounded by this many events
        /// (ours are under 1 KiB) and its connection's kernel send buffer. libzmq's default,
        /// 1,000, drops within a burst of one group commit while the subscriber is reading.
        public var publishHighWaterMark: Int = 10_000
        /// Events a subscriber's socket holds from each publisher until this process reads them:
        /// its own memory, so deep enough that a burst is read late rather than dropped.
        public var receiveHighWaterMark: Int = 100_000
        /// How full a subscriber's connection may stay (bytes waiting in its kernel send
        /// queue, at two checks a second apart) before the publisher names it as not reading
        /// (``BusStatistics/slowSubscribers``). A reading subscriber empties it within
        /// milliseconds; one that stops reading keeps it full (about 4 MiB on loopback).
        public var slowSubscriberBytes: Int = 1024 * 1024
        /// How often a requesting or subscribing connection sends a ZMTP heartbeat, and how long
        /// it waits for the answer before dropping the connection (and reconnecting). A process
        /// that dies closes its connections at once; a host that vanishes does not, and without
        /// these its replica would keep being sent requests until TCP gave up, minutes later.
        public var heartbeatInterval: Duration = .seconds(1)
        public var heartbeatTimeout: Duration = .seconds(5)
        /// CURVE keys: with them, every `tcp://` and `ipc://` socket is encrypted, servers prove
        /// their identity and admit only known clients (see ``BusKeys``). `nil`: plain sockets.
        public var keys: BusKeys?

        public init() {}
    }

    /// The name this bus signs the error replies it makes itself.
    public let source: String
    private let logger: Logger
    private let queue: CommandQueue

    /// Starts the bus's I/O thread.
    public convenience init(source: String, logger: Logger) {
        self.init(source: source, logger: logger, configuration: Configuration())
    }

    /// Starts the bus's I/O thread.
    public init(source: String, logger: Logger, configuration: Configuration) {
        self.source = source
        self.logger = logger
        let queue = CommandQueue()
        self.queue = queue
        let loop = IOLoop(queue: queue, source: source, logger: logger, configuration: configuration)
        let thread = Thread { loop.run() }
        thread.name = "zmq-\(source)"
        thread.start()
    }

    deinit {
        queue.requestShutdown(waiter: nil)
    }

    public var statistics: BusStatistics {
        queue.statistics.withLock { $0 }
    }

    // MARK: Events

    public func publisher(at endpoint: Endpoint) async throws -> any EventPublisher {
        let id = queue.makeID()
        try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, any Error>) in
            if !queue.submit(.bindPublisher(id: id, endpoint: endpoint, done: done)) {
                done.resume(throwing: Self.closedError)
            }
        }
        return ZeroMQPublisher(id: id, endpoint: endpoint, queue: queue)
    }

    public func subscribe(to endpoints: [Endpoint], topics: [String], limits: MessageLimits) async throws -> AsyncStream<Message> {
        let id = queue.makeID()
        let (stream, events) = AsyncStream.makeStream(of: Message.self, bufferingPolicy: .bufferingOldest(limits.queueLimit))
        events.onTermination = { [queue] _ in queue.submit(.closeSubscriber(id: id)) }
        try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, any Error>) in
            let command = Command.subscribe(
                id: id, endpoints: endpoints, topics: topics, limits: limits, sink: .stream(events), done: done)
            if !queue.submit(command) {
                done.resume(throwing: Self.closedError)
            }
        }
        return stream
    }

    // MARK: Requests

    /// Binds a ROUTER at `endpoint` and returns the requests that arrive.
    ///
    /// The server is unbound when the stream ends: its consumer task is cancelled, or the stream
    /// and every iterator of it are dropped. What happens around that moment:
    ///
    /// - Replies given before the stream ended are sent: they were queued for the I/O thread
    ///   before the command that closes the socket, and the socket lingers up to 200 ms to
    ///   finish sending them.
    /// - A request that arrives after the consumer stopped calling `next()` but while the stream
    ///   is still alive is buffered in the stream, unanswered (up to ``MessageLimits/queueLimit``;
    ///   beyond that the bus answers `overloaded`). Whoever holds the stream can still take such
    ///   requests out and answer them (for example with an error while draining). Requests still
    ///   buffered when the stream ends can no longer be answered; their callers get `timeout`.
    /// - Replies given after the stream ended, and requests that reach the socket after it
    ///   ended but before it is closed, are dropped (logged at debug); those callers get
    ///   `timeout`. Later requests get `noResponder`.
    ///
    /// - Throws: ``ServiceError`` with `addressInUse`, `invalidEndpoint`, `internalError` (a
    ///   socket could not be created or configured) or `closed`.
    public func serve(at endpoint: Endpoint, limits: MessageLimits) async throws -> AsyncStream<IncomingRequest> {
        let id = queue.makeID()
        let (stream, requests) = AsyncStream.makeStream(
            of: IncomingRequest.self, bufferingPolicy: .bufferingOldest(limits.queueLimit))
        requests.onTermination = { [queue] _ in queue.submit(.closeServer(id: id)) }
        try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, any Error>) in
            if !queue.submit(.serve(id: id, endpoint: endpoint, limits: limits, sink: .stream(requests), done: done)) {
                done.resume(throwing: Self.closedError)
            }
        }
        return stream
    }

    // MARK: The hot path

    /// Binds a ROUTER at `endpoint` whose requests `handler` answers on the I/O thread (see
    /// ``MessageBus/serve(at:limits:onLoop:)``). ``BusLoopRegistration/close()`` unbinds it as the
    /// end of ``serve(at:limits:)``'s stream does: replies already given are still sent.
    public func serve(
        at endpoint: Endpoint, limits: MessageLimits, onLoop handler: @escaping @Sendable ([RawRequest]) -> Void
    ) async throws -> any BusLoopRegistration {
        let id = queue.makeID()
        try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, any Error>) in
            if !queue.submit(.serve(id: id, endpoint: endpoint, limits: limits, sink: .loop(handler), done: done)) {
                done.resume(throwing: Self.closedError)
            }
        }
        return LoopRegistration(queue: queue, close: .closeServer(id: id))
    }

    /// Subscribes with a handler on the I/O thread (see
    /// ``MessageBus/subscribe(to:topics:limits:onLoop:)``). Events that arrive while the handler
    /// runs wait in libzmq's queue (its high-water mark, then dropped as with any subscriber).
    public func subscribe(
        to endpoints: [Endpoint], topics: [String], limits: MessageLimits,
        onLoop handler: @escaping @Sendable ([RawEvent]) -> Void
    ) async throws -> any BusLoopRegistration {
        let id = queue.makeID()
        try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, any Error>) in
            let command = Command.subscribe(
                id: id, endpoints: endpoints, topics: topics, limits: limits, sink: .loop(handler), done: done)
            if !queue.submit(command) {
                done.resume(throwing: Self.closedError)
            }
        }
        return LoopRegistration(queue: queue, close: .closeSubscriber(id: id))
    }

    public func request(_ message: OutgoingMessage, to endpoint: Endpoint, timeout: Duration) async throws -> Message {
        try Task.checkCancellation()
        let id = queue.makeID()
        let waiter = ReplyWaiter()
        let request = OutgoingRequest(
            id: id, endpoint: endpoint, message: message, timeout: timeout,
            deadline: monotonicNanoseconds() &+ timeout.clampedNanoseconds, waiter: .waiter(waiter))
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Message, any Error>) in
                waiter.install(continuation)
                if !queue.submit(.request(request)) {
                    waiter.finish(.failure(Self.closedError))
                }
            }
        } onCancel: { [queue] in
            if waiter.finish(.failure(CancellationError())) {
                queue.submit(.cancelRequest(id: id))
            }
        }
    }

    /// Sends `message` to the server at `endpoint` and hands the reply, or the failure
    /// (`timeout`, `noResponder`, `closed`, ...), to `callback` on the I/O thread (see
    /// ``MessageBus/request(_:to:timeout:onLoop:)``).
    public func request(
        _ message: OutgoingMessage, to endpoint: Endpoint, timeout: Duration,
        onLoop callback: @escaping @Sendable (Result<Message, ServiceError>) -> Void
    ) {
        let request = OutgoingRequest(
            id: queue.makeID(), endpoint: endpoint, message: message, timeout: timeout,
            deadline: monotonicNanoseconds() &+ timeout.clampedNanoseconds, waiter: .loop(callback))
        if !queue.submit(.request(request)) {
            callback(.failure(Self.closedError))
        }
    }

    /// Runs `job` on the I/O thread (see ``MessageBus/perform(onLoop:)``).
    @discardableResult
    public func perform(onLoop job: @escaping @Sendable () -> Void) -> Bool {
        queue.submit(.run(job))
    }

    // MARK: Lifecycle

    /// Closes every socket, fails calls in flight with `closed`, finishes every stream and stops
    /// the I/O thread. Returns when all of that is done. Calling it again does nothing more.
    public func shutdown() async {
        await withCheckedContinuation { (waiter: CheckedContinuation<Void, Never>) in
            queue.requestShutdown(waiter: waiter)
        }
    }

    /// Waits for the service group's graceful shutdown, then shuts the bus down.
    public func run() async throws {
        try? await gracefulShutdown()
        await shutdown()
    }

    static let closedError = ServiceError(.closed, "The message bus has been shut down.")
}

/// A PUB socket bound by a ``ZeroMQBus``.
///
/// Threading: any thread. ``publish(_:)`` only queues the event for the bus's I/O thread.
final class ZeroMQPublisher: EventPublisher {
    let endpoint: Endpoint
    private let id: UInt64
    private let queue: CommandQueue
    private let closed = Atomic(false)

    init(id: UInt64, endpoint: Endpoint, queue: CommandQueue) {
        self.id = id
        self.endpoint = endpoint
        self.queue = queue
    }

    func publish(_ message: OutgoingMessage) throws {
        guard !closed.load(ordering: .acquiring) else {
            throw ServiceError(.closed, "The publisher at \(endpoint) is closed.")
        }
        guard message.topic != nil else {
            throw ServiceError(.invalidMessage, "An event needs a topic.")
        }
        guard queue.submit(.publish(id: id, message: message)) else {
            throw ZeroMQBus.closedError
        }
    }

    func close() {
        if !closed.exchange(true, ordering: .acquiringAndReleasing) {
            queue.submit(.closePublisher(id: id))
        }
    }

    deinit { close() }
}

/// A loop handler's server or subscription on a ``ZeroMQBus``; closes it once.
final class LoopRegistration: BusLoopRegistration {
    private let queue: CommandQueue
    private let command: Command
    private let closed = Atomic(false)

    init(queue: CommandQueue, close command: Command) {
        self.queue = queue
        self.command = command
    }

    func close() {
        if !closed.exchange(true, ordering: .acquiringAndReleasing) {
            queue.submit(command)
        }
    }

    deinit { close() }
}
