import Foundation
import Synchronization

/// A ``MessageBus`` inside one process: the stub to test your own code against.
///
/// It keeps the contract of the ZeroMQ bus (the same contract tests run against both): topics
/// match by prefix, subscribers see only what is published after they subscribe, a full
/// subscriber queue drops the newest events, requests to an endpoint with no server fail with
/// `noResponder` at once, unanswered ones with `timeout`, and requests the server cannot read
/// are answered by the bus with a typed error.
///
/// **Joining takes a moment on ZeroMQ.** There a new subscription takes effect only once its
/// connection is up and the publisher has heard of it (the "slow joiner"): events published
/// meanwhile are not delivered. Here a subscription takes effect at once, unless `joinDelay`
/// says otherwise: give it a few milliseconds to find code that relies on events published
/// right after it subscribed (the contract tests do). `OnboardingClient.intents()` copes with
/// both.
///
/// Thread safety: all state sits behind one mutex; every method may be called from any task.
public final class InProcessBus: MessageBus {
    private struct Subscriber {
        var topics: [String]
        var continuation: AsyncStream<Message>.Continuation?
        var handler: (@Sendable ([RawEvent]) -> Void)?
    }

    private struct Server {
        var id: UInt64
        var limits: MessageLimits
        var continuation: AsyncStream<IncomingRequest>.Continuation?
        var handler: (@Sendable ([RawRequest]) -> Void)?
    }

    private struct State {
        var nextID: UInt64 = 0
        var publishers: Set<Endpoint> = []
        var subscribers: [Endpoint: [UInt64: Subscriber]] = [:]
        var servers: [Endpoint: Server] = [:]
        var statistics = BusStatistics()
        /// Turns for requests to endpoints that list replicas.
        var nextReplica = 0

        mutating func makeID() -> UInt64 {
            nextID += 1
            return nextID
        }

        /// The server a request to `endpoint` goes to: for a list, the next bound replica in turn
        /// (as ZeroMQ's DEALER takes its connected peers in turn).
        mutating func server(for endpoint: Endpoint) -> Server? {
            guard endpoint.isList else { return servers[endpoint] }
            let bound = endpoint.replicas.compactMap { servers[$0] }
            guard !bound.isEmpty else { return nil }
            nextReplica &+= 1
            return bound[nextReplica % bound.count]
        }
    }

    private let state = Mutex(State())
    /// Where loop handlers run, as on the ZeroMQ bus's I/O thread.
    private let loop: LoopThread

    /// The name this bus signs the errors it answers with.
    public let source: String

    /// How long a new subscription takes to take effect (see the type's notes); zero: at once.
    public let joinDelay: Duration

    /// - Parameters:
    ///   - source: the name this bus signs the errors it answers with.
    ///   - joinDelay: how long after ``subscribe(to:topics:limits:)`` returns its subscription
    ///     (or ``subscribe(to:topics:limits:onLoop:)``'s) starts receiving events, as on
    ///     ZeroMQ; zero (the default) for at once.
    public init(source: String = "bus", joinDelay: Duration = .zero) {
        self.source = source
        self.joinDelay = joinDelay
        self.loop = LoopThread(name: "inproc-\(source)")
    }

    public var statistics: BusStatistics {
        state.withLock { $0.statistics }
    }

    // MARK: Events

    public func publisher(at endpoint: Endpoint) async throws -> any EventPublisher {
        guard !endpoint.isList else { throw ServiceError.cannotBindList(endpoint) }
        try state.withLock { state in
            guard state.publishers.insert(endpoint).inserted else {
                throw ServiceError(.addressInUse, "A publisher is already bound at \(endpoint).")
            }
        }
        return Publisher(bus: self, endpoint: endpoint)
    }

    public func subscribe(to endpoints: [Endpoint], topics: [String], limits: MessageLimits) async throws -> AsyncStream<Message> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: Message.self, bufferingPolicy: .bufferingOldest(limits.queueLimit))
        let leave = join(endpoints, Subscriber(topics: topics, continuation: continuation))
        continuation.onTermination = { _ in leave() }
        return stream
    }

    /// Adds `subscriber` at `endpoints` after ``joinDelay`` (at once when it is zero).
    ///
    /// - Returns: what removes it again, also before it has joined.
    private func join(_ endpoints: [Endpoint], _ subscriber: Subscriber) -> @Sendable () -> Void {
        let id = state.withLock { $0.makeID() }
        let endpoints = endpoints.flatMap(\.replicas)
        let ended = Flag()
        let join: @Sendable () -> Void = { [weak self] in
            self?.state.withLock { state in
                guard !ended.isSet else { return }
                for endpoint in endpoints { state.subscribers[endpoint, default: [:]][id] = subscriber }
            }
        }
        if joinDelay == .zero {
            join()
        } else {
            let delay = joinDelay
            Task {
                try? await Task.sleep(for: delay)
                join()
            }
        }
        return { [weak self] in
            ended.set()
            self?.state.withLock { state in
                for endpoint in endpoints { state.subscribers[endpoint]?[id] = nil }
            }
        }
    }

    /// Set once a subscription has ended, so that a delayed join does not revive it.
    private final class Flag: Sendable {
        private let value = Atomic(false)
        var isSet: Bool { value.load(ordering: .acquiring) }
        func set() { value.store(true, ordering: .releasing) }
    }

    fileprivate func deliver(_ outgoing: OutgoingMessage, from endpoint: Endpoint) throws {
        guard let topic = outgoing.topic else {
            throw ServiceError(.invalidMessage, "An event needs a topic.")
        }
        let receivers = try state.withLock { state in
            guard state.publishers.contains(endpoint) else {
                throw ServiceError(.closed, "The publisher at \(endpoint) is closed.")
            }
            return (state.subscribers[endpoint] ?? [:]).values.filter { subscriber in
                subscriber.topics.contains { topic.matchesTopicPrefix($0) }
            }
        }
        guard !receivers.isEmpty else { return }
        let raw = RawEvent(topic: topic, body: outgoing.body, attachment: outgoing.attachment)
        for receiver in receivers {
            if let handler = receiver.handler { loop.submit { handler([raw]) } }
        }
        let streams = receivers.compactMap(\.continuation)
        guard !streams.isEmpty else { return }
        guard let message = try? Message(topic: topic, body: outgoing.body, attachment: outgoing.attachment) else {
            state.withLock { $0.statistics.unreadableEvents += streams.count }
            return
        }
        var dropped = 0
        for stream in streams {
            if case .dropped = stream.yield(message) { dropped += 1 }
        }
        if dropped > 0 {
            state.withLock { $0.statistics.droppedEvents += dropped }
        }
    }

    fileprivate func unbindPublisher(_ endpoint: Endpoint) {
        _ = state.withLock { $0.publishers.remove(endpoint) }
    }

    private final class Publisher: EventPublisher {
        let bus: InProcessBus
        let endpoint: Endpoint
        private let closed = Atomic(false)

        init(bus: InProcessBus, endpoint: Endpoint) {
            self.bus = bus
            self.endpoint = endpoint
        }

        func publish(_ message: OutgoingMessage) throws {
            guard !closed.load(ordering: .acquiring) else {
                throw ServiceError(.closed, "The publisher at \(endpoint) is closed.")
            }
            try bus.deliver(message, from: endpoint)
        }

        func close() {
            if !closed.exchange(true, ordering: .acquiringAndReleasing) {
                bus.unbindPublisher(endpoint)
            }
        }

        deinit { close() }
    }

    // MARK: Requests

    public func serve(at endpoint: Endpoint, limits: MessageLimits) async throws -> AsyncStream<IncomingRequest> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: IncomingRequest.self, bufferingPolicy: .bufferingOldest(limits.queueLimit))
        guard !endpoint.isList else { throw ServiceError.cannotBindList(endpoint) }
        let id = try state.withLock { state in
            guard state.servers[endpoint] == nil else {
                throw ServiceError(.addressInUse, "A server is already bound at \(endpoint).")
            }
            let id = state.makeID()
            state.servers[endpoint] = Server(id: id, limits: limits, continuation: continuation)
            return id
        }
        continuation.onTermination = { [weak self] _ in
            self?.state.withLock { state in
                if state.servers[endpoint]?.id == id { state.servers[endpoint] = nil }
            }
        }
        return stream
    }

    public func request(_ outgoing: OutgoingMessage, to endpoint: Endpoint, timeout: Duration) async throws -> Message {
        guard let server = state.withLock({ $0.server(for: endpoint) }) else {
            throw ServiceError(.noResponder, "Nothing answers at \(endpoint). Is the service running?")
        }
        let pending = ReplyWaiter()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Message, any Error>) in
                pending.install(continuation)
                let timer = Task {
                    try? await Task.sleep(for: timeout)
                    pending.resume(throwing: ServiceError(.timeout, "No reply from \(endpoint) within \(timeout)."))
                }
                pending.onFinish { timer.cancel() }
                self.dispatch(outgoing, to: server, pending: pending)
            }
        } onCancel: {
            pending.resume(throwing: CancellationError())
        }
    }

    // MARK: The hot path

    /// Binds a server whose requests `handler` answers on this bus's loop thread, one request
    /// per call (see ``MessageBus/serve(at:limits:onLoop:)``).
    public func serve(
        at endpoint: Endpoint, limits: MessageLimits, onLoop handler: @escaping @Sendable ([RawRequest]) -> Void
    ) async throws -> any BusLoopRegistration {
        guard !endpoint.isList else { throw ServiceError.cannotBindList(endpoint) }
        let id = try state.withLock { state in
            guard state.servers[endpoint] == nil else {
                throw ServiceError(.addressInUse, "A server is already bound at \(endpoint).")
            }
            let id = state.makeID()
            state.servers[endpoint] = Server(id: id, limits: limits, handler: handler)
            return id
        }
        return Registration { [weak self] in
            self?.state.withLock { state in
                if state.servers[endpoint]?.id == id { state.servers[endpoint] = nil }
            }
        }
    }

    /// Subscribes with a handler on this bus's loop thread, one event per call (see
    /// ``MessageBus/subscribe(to:topics:limits:onLoop:)``).
    public func subscribe(
        to endpoints: [Endpoint], topics: [String], limits: MessageLimits,
        onLoop handler: @escaping @Sendable ([RawEvent]) -> Void
    ) async throws -> any BusLoopRegistration {
        // Joins after `joinDelay`, as a stream subscription does (the slow joiner).
        Registration(onClose: join(endpoints, Subscriber(topics: topics, handler: handler)))
    }

    /// Runs `job` on this bus's loop thread (see ``MessageBus/perform(onLoop:)``).
    @discardableResult
    public func perform(onLoop job: @escaping @Sendable () -> Void) -> Bool {
        loop.submit(job)
        return true
    }

    /// Sends a request and hands the outcome to `callback` on this bus's loop thread (see
    /// ``MessageBus/request(_:to:timeout:onLoop:)``).
    public func request(
        _ message: OutgoingMessage, to endpoint: Endpoint, timeout: Duration,
        onLoop callback: @escaping @Sendable (Result<Message, ServiceError>) -> Void
    ) {
        let loop = self.loop
        Task {
            let result: Result<Message, ServiceError>
            do {
                result = .success(try await request(message, to: endpoint, timeout: timeout))
            } catch {
                result = .failure((error as? ServiceError) ?? ServiceError(.internalError, "\(error)"))
            }
            loop.submit { callback(result) }
        }
    }

    private final class Registration: BusLoopRegistration {
        private let onClose: Mutex<(@Sendable () -> Void)?>

        init(onClose: @escaping @Sendable () -> Void) {
            self.onClose = Mutex(onClose)
        }

        func close() {
            let action = onClose.withLock { action in
                defer { action = nil }
                return action
            }
            action?()
        }

        deinit { close() }
    }

    private func dispatch(_ outgoing: OutgoingMessage, to server: Server, pending: ReplyWaiter) {
        let source = self.source
        let answer: @Sendable (OutgoingMessage) -> Void = { [weak self] reply in
            do {
                let message = try Message(body: reply.body, attachment: reply.attachment)
                if !pending.resume(returning: message) {
                    self?.state.withLock { $0.statistics.lateReplies += 1 }
                }
            } catch {
                pending.resume(throwing: error)
            }
        }
        if let violation = server.limits.violation(
            envelopeBytes: outgoing.body.count, attachmentBytes: outgoing.attachment?.count, extraFrames: 0)
        {
            state.withLock { $0.statistics.rejectedRequests += 1 }
            answer(Message.errorReply(violation, refusing: outgoing.body, limits: server.limits, source: source))
            return
        }
        if let handler = server.handler {
            let raw = RawRequest(body: outgoing.body, attachment: outgoing.attachment, responder: answer)
            loop.submit { handler([raw]) }
            return
        }
        guard let continuation = server.continuation else { return }
        let message: Message
        do {
            message = try Message(body: outgoing.body, attachment: outgoing.attachment)
        } catch {
            state.withLock { $0.statistics.rejectedRequests += 1 }
            answer(Message.errorReply(error, refusing: outgoing.body, limits: server.limits, source: source))
            return
        }
        let request = IncomingRequest(message: message, responder: answer)
        if case .dropped = continuation.yield(request) {
            state.withLock { $0.statistics.overloadedRequests += 1 }
            request.fail(ServiceError(.overloaded, "The service has too many requests in flight; try again shortly."), source: source)
        }
    }
}

/// A caller's wait for a reply, resumed exactly once by whichever comes first: the reply, a
/// failure (timeout, shutdown) or cancellation of the calling task.
///
/// For bus implementations. Threading: any thread; state sits behind a mutex and the
/// continuation is resumed outside it. A result that arrives before ``install(_:)`` is kept and
/// delivered when the continuation is installed.
///
/// Why ours: three parties race to end one wait (a reply from the I/O thread, a timeout or
/// shutdown from the bus, the caller's cancellation) and the first must win wherever it runs,
/// even before the caller has suspended; a continuation alone cannot take an early result, and
/// an `AsyncStream` per call costs an allocation and a task hop on the hot path.
public final class ReplyWaiter: Sendable {
    private struct State {
        var continuation: CheckedContinuation<Message, any Error>?
        var early: Result<Message, any Error>?
        var finished = false
        var onFinish: [@Sendable () -> Void] = []
    }

    private let state = Mutex(State())

    public init() {}

    public func install(_ continuation: CheckedContinuation<Message, any Error>) {
        let early: Result<Message, any Error>? = state.withLock { state in
            if let early = state.early { return early }
            state.continuation = continuation
            return nil
        }
        if let early { continuation.resume(with: early) }
    }

    /// Whether a result has been delivered (or kept for delivery).
    public var isFinished: Bool {
        state.withLock { $0.finished }
    }

    /// Runs `action` once the waiter finishes (at once if it already has).
    public func onFinish(_ action: @escaping @Sendable () -> Void) {
        let runNow = state.withLock { state in
            if state.finished { return true }
            state.onFinish.append(action)
            return false
        }
        if runNow { action() }
    }

    /// Delivers `result` unless another one came first.
    ///
    /// - Returns: `false` when the waiter had already finished.
    @discardableResult
    public func finish(_ result: Result<Message, any Error>) -> Bool {
        let (won, continuation, actions) = state.withLock { state -> (Bool, CheckedContinuation<Message, any Error>?, [@Sendable () -> Void]) in
            guard !state.finished else { return (false, nil, []) }
            state.finished = true
            let actions = state.onFinish
            state.onFinish = []
            if let continuation = state.continuation {
                state.continuation = nil
                return (true, continuation, actions)
            }
            state.early = result
            return (true, nil, actions)
        }
        continuation?.resume(with: result)
        for action in actions { action() }
        return won
    }

    @discardableResult
    public func resume(returning message: Message) -> Bool { finish(.success(message)) }

    @discardableResult
    public func resume(throwing error: any Error) -> Bool { finish(.failure(error)) }
}
