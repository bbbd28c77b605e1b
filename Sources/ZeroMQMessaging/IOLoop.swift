import CZeroMQ
import Foundation
import Logging
import Messaging
import Synchronization

/// The state and the `zmq_poll` loop of one ``ZeroMQBus``'s I/O thread.
///
/// Threading: created on the caller's thread, then handed once to the dedicated I/O thread, which
/// is the only thread that touches it afterwards. It owns the libzmq context and every socket of
/// the bus for their whole lives. Async code reaches it only through ``CommandQueue``; results go
/// back through continuations. Nothing here may block except `zmq_poll` itself.
//
// @unchecked Sendable: it holds raw libzmq handles and mutable tables, which is safe because after
// the hand-over in `ZeroMQBus.init` only the I/O thread uses the instance (see above).
final class IOLoop: @unchecked Sendable {
    private struct Publisher {
        var socket: Socket
        var endpoint: Endpoint
    }

    private struct Subscriber {
        var socket: Socket
        var events: AsyncStream<Message>.Continuation
    }

    private struct Server {
        var socket: Socket
        var endpoint: Endpoint
        var limits: MessageLimits
        var requests: AsyncStream<IncomingRequest>.Continuation
    }

    private struct Dealer {
        var socket: Socket
        /// Requests waiting for the socket to become writable (no peer connected yet), oldest first.
        var backlog: [UInt64] = []
    }

    private struct Pending {
        var endpoint: Endpoint
        var timeout: Duration
        var waiter: ReplyWaiter
        var deadline: UInt64
        /// While queued: the message, and when to give up with `noResponder`.
        var unsent: OutgoingMessage?
        var sendBy: UInt64 = .max
    }

    private enum PollTarget {
        case wake
        case subscriber(UInt64)
        case server(UInt64)
        case dealer(Endpoint)
    }

    private let context: UnsafeMutableRawPointer
    private let queue: CommandQueue
    private let logger: Logger
    private let source: String
    private let configuration: ZeroMQBus.Configuration

    private var publishers: [UInt64: Publisher] = [:]
    private var subscribers: [UInt64: Subscriber] = [:]
    private var servers: [UInt64: Server] = [:]
    private var dealers: [Endpoint: Dealer] = [:]
    private var pending: [UInt64: Pending] = [:]
    private var deadlines = DeadlineHeap()

    private var pollItems: [zmq_pollitem_t] = []
    private var pollTargets: [PollTarget] = []
    private var pollDirty = true
    private var stopping = false

    /// Reused for every received frame.
    private let scratch: UnsafeMutablePointer<zmq_msg_t>
    private var frames: [Data] = []

    init(queue: CommandQueue, source: String, logger: Logger, configuration: ZeroMQBus.Configuration) {
        // zmq_ctx_new is thread-safe; it fails only when the process is out of file descriptors.
        guard let context = zmq_ctx_new() else {
            preconditionFailure("zmq_ctx_new failed: \(zmqErrorText(zmq_errno()))")
        }
        self.context = context
        self.queue = queue
        self.source = source
        self.logger = logger
        self.configuration = configuration
        scratch = .allocate(capacity: 1)
        zmq_msg_init(scratch)
    }

    deinit {
        zmq_msg_close(scratch)
        scratch.deallocate()
    }

    // MARK: The loop

    func run() {
        while !stopping {
            if pollDirty { rebuildPollItems() }
            let now = monotonicNanoseconds()
            let timeout = pollTimeout(now: now)
            let ready = pollItems.withUnsafeMutableBufferPointer { items in
                zmq_poll(items.baseAddress, Int32(items.count), timeout)
            }
            if ready < 0 {
                let code = zmq_errno()
                if code != EINTR { logger.error("zmq_poll failed", metadata: ["error": "\(zmqErrorText(code))"]) }
                continue
            }
            if ready > 0 {
                var wake = false
                // Sockets first, commands last: a command may close a socket, and targets are
                // looked up by id, so a socket closed here is simply skipped.
                for index in pollItems.indices where pollItems[index].revents != 0 {
                    let revents = Int32(pollItems[index].revents)
                    switch pollTargets[index] {
                    case .wake: wake = true
                    case .subscriber(let id): drainSubscriber(id)
                    case .server(let id): drainServer(id)
                    case .dealer(let endpoint):
                        if revents & ZMQ_POLLIN != 0 { drainDealer(endpoint) }
                        if revents & ZMQ_POLLOUT != 0 { flushBacklog(endpoint, now: monotonicNanoseconds()) }
                    }
                }
                if wake {
                    for command in queue.takeCommands() { perform(command) }
                }
            }
            expireDeadlines(now: monotonicNanoseconds())
        }
        tearDown()
    }

    private func rebuildPollItems() {
        pollItems.removeAll(keepingCapacity: true)
        pollTargets.removeAll(keepingCapacity: true)
        func add(_ socket: UnsafeMutableRawPointer?, fd: Int32 = 0, events: Int32, _ target: PollTarget) {
            pollItems.append(zmq_pollitem_t(socket: socket, fd: fd, events: Int16(events), revents: 0))
            pollTargets.append(target)
        }
        add(nil, fd: queue.wakeFD, events: ZMQ_POLLIN, .wake)
        for (id, subscriber) in subscribers { add(subscriber.socket.handle, events: ZMQ_POLLIN, .subscriber(id)) }
        for (id, server) in servers { add(server.socket.handle, events: ZMQ_POLLIN, .server(id)) }
        for (endpoint, dealer) in dealers {
            let events = dealer.backlog.isEmpty ? ZMQ_POLLIN : ZMQ_POLLIN | ZMQ_POLLOUT
            add(dealer.socket.handle, events: events, .dealer(endpoint))
        }
        pollDirty = false
    }

    /// Milliseconds until the nearest deadline, or -1 (wait for an event) when there is none.
    private func pollTimeout(now: UInt64) -> Int {
        guard let next = deadlines.first?.time else { return -1 }
        if next <= now { return 0 }
        return Int((next - now + 999_999) / 1_000_000)
    }

    // MARK: Commands

    private func perform(_ command: Command) {
        switch command {
        case .bindPublisher(let id, let endpoint, let done):
            bindPublisher(id: id, endpoint: endpoint, done: done)
        case .publish(let id, let message):
            publish(id: id, message: message)
        case .closePublisher(let id):
            publishers.removeValue(forKey: id)?.socket.close()
        case .subscribe(let id, let endpoints, let topics, let limits, let events, let done):
            subscribe(id: id, endpoints: endpoints, topics: topics, limits: limits, events: events, done: done)
        case .closeSubscriber(let id):
            if let subscriber = subscribers.removeValue(forKey: id) {
                subscriber.socket.close()
                subscriber.events.finish()
                pollDirty = true
            }
        case .serve(let id, let endpoint, let limits, let requests, let done):
            serve(id: id, endpoint: endpoint, limits: limits, requests: requests, done: done)
        case .closeServer(let id):
            if let server = servers.removeValue(forKey: id) {
                server.socket.close()
                server.requests.finish()
                pollDirty = true
            }
        case .reply(let serverID, let route, let message):
            guard let server = servers[serverID] else {
                logger.debug("Reply dropped: the server is closed", metadata: ["server": "\(serverID)"])
                return
            }
            sendReply(on: server, route: route, message: message)
        case .request(let request):
            startRequest(request)
        case .cancelRequest(let id):
            // The caller's waiter is already resumed with CancellationError; forget the entry so
            // a reply that still comes counts as late.
            pending.removeValue(forKey: id)
        case .shutdown:
            stopping = true
        }
    }

    private func makeSocket(_ type: Int32) -> Socket? {
        guard let handle = zmq_socket(context, type) else { return nil }
        let socket = Socket(handle: handle)
        socket.set(ZMQ_LINGER, Int32(0))
        return socket
    }

    private func socketCreationError() -> ServiceError {
        ServiceError(.internalError, "Cannot create a ZeroMQ socket: \(zmqErrorText(zmq_errno())).")
    }

    // MARK: Events

    private func bindPublisher(id: UInt64, endpoint: Endpoint, done: CheckedContinuation<Void, any Error>) {
        guard let socket = makeSocket(ZMQ_PUB) else { return done.resume(throwing: socketCreationError()) }
        // Subscribers only send subscription messages (topic prefixes) to a PUB socket.
        socket.set(ZMQ_MAXMSGSIZE, Int64(64 * 1024))
        if zmq_bind(socket.handle, endpoint.rawValue) != 0 {
            let error = endpointError(zmq_errno(), endpoint: endpoint, binding: true)
            socket.close()
            return done.resume(throwing: error)
        }
        publishers[id] = Publisher(socket: socket, endpoint: endpoint)
        done.resume()
    }

    private func publish(id: UInt64, message: OutgoingMessage) {
        guard let publisher = publishers[id], let topic = message.topic else { return }
        // A PUB socket never blocks: it drops for subscribers whose queue is full.
        guard case .sent = publisher.socket.send(topic, more: true) else { return }
        if case .failed(let code) = publisher.socket.sendBody(message) {
            logger.warning(
                "Publishing failed", metadata: ["endpoint": "\(publisher.endpoint)", "error": "\(zmqErrorText(code))"])
        }
    }

    private func subscribe(
        id: UInt64, endpoints: [Endpoint], topics: [String], limits: MessageLimits,
        events: AsyncStream<Message>.Continuation, done: CheckedContinuation<Void, any Error>
    ) {
        guard let socket = makeSocket(ZMQ_SUB) else {
            events.finish()
            return done.resume(throwing: socketCreationError())
        }
        socket.set(ZMQ_MAXMSGSIZE, Int64(limits.transportCap))
        for topic in topics { socket.subscribe(topic) }
        for endpoint in endpoints where zmq_connect(socket.handle, endpoint.rawValue) != 0 {
            let error = endpointError(zmq_errno(), endpoint: endpoint, binding: false)
            socket.close()
            events.finish()
            return done.resume(throwing: error)
        }
        subscribers[id] = Subscriber(socket: socket, events: events)
        pollDirty = true
        done.resume()
    }

    private func drainSubscriber(_ id: UInt64) {
        guard let subscriber = subscribers[id] else { return }
        while true {
            switch subscriber.socket.receive(into: &frames, scratch: scratch) {
            case .empty: return
            case .failed(let code):
                logger.warning("Receiving an event failed", metadata: ["error": "\(zmqErrorText(code))"])
                return
            case .message:
                guard frames.count == 2 || frames.count == 3,
                    let topic = String(validating: frames[0], as: UTF8.self),
                    let message = try? Message(topic: topic, body: frames[1], attachment: frames.count == 3 ? frames[2] : nil)
                else {
                    queue.count { $0.unreadableEvents += 1 }
                    continue
                }
                if case .dropped = subscriber.events.yield(message) {
                    queue.count { $0.droppedEvents += 1 }
                }
            }
        }
    }

    // MARK: Serving

    private func serve(
        id: UInt64, endpoint: Endpoint, limits: MessageLimits,
        requests: AsyncStream<IncomingRequest>.Continuation, done: CheckedContinuation<Void, any Error>
    ) {
        guard let socket = makeSocket(ZMQ_ROUTER) else {
            requests.finish()
            return done.resume(throwing: socketCreationError())
        }
        socket.set(ZMQ_MAXMSGSIZE, Int64(limits.transportCap))
        socket.set(ZMQ_ROUTER_MANDATORY, Int32(1))
        socket.set(ZMQ_SNDHWM, Int32(configuration.replyHighWaterMark))
        if zmq_bind(socket.handle, endpoint.rawValue) != 0 {
            let error = endpointError(zmq_errno(), endpoint: endpoint, binding: true)
            socket.close()
            requests.finish()
            return done.resume(throwing: error)
        }
        servers[id] = Server(socket: socket, endpoint: endpoint, limits: limits, requests: requests)
        pollDirty = true
        done.resume()
    }

    private func drainServer(_ id: UInt64) {
        guard let server = servers[id] else { return }
        while true {
            switch server.socket.receive(into: &frames, scratch: scratch) {
            case .empty: return
            case .failed(let code):
                logger.warning("Receiving a request failed", metadata: ["error": "\(zmqErrorText(code))"])
                return
            case .message:
                handleRequest(frames, on: server, serverID: id)
            }
        }
    }

    /// `frames` is [peer identity, routing frames..., empty delimiter, JSON, attachment?].
    private func handleRequest(_ frames: [Data], on server: Server, serverID: UInt64) {
        guard frames.count > 1, let delimiter = frames[1...].firstIndex(where: \.isEmpty) else {
            // No delimiter: answer as a plain DEALER would expect, [empty, error], and count it.
            queue.count { $0.rejectedRequests += 1 }
            let error = ServiceError(
                .invalidMessage,
                "A request is [empty delimiter frame, JSON envelope, optional binary frame]; the delimiter is missing.")
            sendReply(on: server, route: [frames[0]], message: Message.errorReply(error, correlationId: nil, source: source))
            return
        }
        let route = Array(frames[..<delimiter])
        let body = frames.index(after: delimiter) < frames.endIndex ? frames[delimiter + 1] : nil
        let attachment = delimiter + 2 < frames.endIndex ? frames[delimiter + 2] : nil
        let extraFrames = max(0, frames.count - (delimiter + 3))

        let message: Message
        do throws(ServiceError) {
            guard let body else {
                throw ServiceError(.invalidMessage, "The request has no JSON envelope frame after the empty delimiter.")
            }
            if let violation = server.limits.violation(
                envelopeBytes: body.count, attachmentBytes: attachment?.count, extraFrames: extraFrames)
            {
                throw violation
            }
            message = try Message(body: body, attachment: attachment)
        } catch {
            queue.count { $0.rejectedRequests += 1 }
            sendReply(on: server, route: route, message: Message.errorReply(error, correlationId: nil, source: source))
            return
        }

        let responder = Responder(queue: queue, serverID: serverID, route: route)
        let request = IncomingRequest(message: message) { reply in responder.send(reply) }
        switch server.requests.yield(request) {
        case .enqueued:
            break
        case .dropped:
            queue.count { $0.overloadedRequests += 1 }
            if responder.claim() {
                let error = ServiceError(.overloaded, "The service has too many requests in flight; try again shortly.")
                sendReply(on: server, route: route, message: message.errorReply(error, source: source))
            }
        case .terminated:
            logger.debug("Request dropped: the server stopped taking requests", metadata: ["endpoint": "\(server.endpoint)"])
        @unknown default:
            break
        }
    }

    private func sendReply(on server: Server, route: [Data], message: OutgoingMessage) {
        var result = Socket.SendResult.sent
        for frame in route {
            result = server.socket.send(frame, more: true)
            guard case .sent = result else { break }
        }
        if case .sent = result { result = server.socket.send(Data(), more: true) }
        if case .sent = result { result = server.socket.sendBody(message) }
        switch result {
        case .sent:
            break
        case .failed(let code) where code == EHOSTUNREACH:
            logger.debug("Reply dropped: the caller has gone", metadata: ["endpoint": "\(server.endpoint)"])
        case .wouldBlock:
            logger.warning(
                "Reply dropped: the caller is not reading its replies", metadata: ["endpoint": "\(server.endpoint)"])
        case .failed(let code):
            logger.warning(
                "Sending a reply failed", metadata: ["endpoint": "\(server.endpoint)", "error": "\(zmqErrorText(code))"])
        }
    }

    // MARK: Requests

    private func startRequest(_ request: OutgoingRequest) {
        guard !request.waiter.isFinished else { return }
        let now = monotonicNanoseconds()
        guard let socket = dealer(for: request.endpoint, failing: request.waiter) else { return }
        var entry = Pending(
            endpoint: request.endpoint, timeout: request.timeout, waiter: request.waiter, deadline: request.deadline)
        if dealers[request.endpoint]?.backlog.isEmpty ?? true {
            switch send(request.message, id: request.id, on: socket) {
            case .sent:
                pending[request.id] = entry
                deadlines.push(time: entry.deadline, id: request.id)
                return
            case .wouldBlock:
                break
            case .failed(let code):
                request.waiter.finish(
                    .failure(ServiceError(.internalError, "Cannot send to \(request.endpoint): \(zmqErrorText(code)).")))
                return
            }
        }
        // Not writable: no peer is connected (yet). Wait a short grace for one to appear.
        entry.unsent = request.message
        entry.sendBy = min(entry.deadline, now + configuration.connectGrace.clampedNanoseconds)
        pending[request.id] = entry
        deadlines.push(time: entry.sendBy, id: request.id)
        if dealers[request.endpoint]!.backlog.isEmpty { pollDirty = true }
        dealers[request.endpoint]!.backlog.append(request.id)
    }

    /// The DEALER for `endpoint`, created and connected on first use.
    private func dealer(for endpoint: Endpoint, failing waiter: ReplyWaiter) -> Socket? {
        if let dealer = dealers[endpoint] { return dealer.socket }
        guard let socket = makeSocket(ZMQ_DEALER) else {
            waiter.finish(.failure(socketCreationError()))
            return nil
        }
        socket.set(ZMQ_IMMEDIATE, Int32(1))
        // Unlimited queues: with ZMQ_IMMEDIATE, EAGAIN then means "no peer", never "queue full".
        // Callers bound what is in flight, since each request is an awaiting task.
        socket.set(ZMQ_SNDHWM, Int32(0))
        socket.set(ZMQ_RCVHWM, Int32(0))
        socket.set(ZMQ_MAXMSGSIZE, Int64(configuration.maxReplyFrameBytes))
        if zmq_connect(socket.handle, endpoint.rawValue) != 0 {
            let error = endpointError(zmq_errno(), endpoint: endpoint, binding: false)
            socket.close()
            waiter.finish(.failure(error))
            return nil
        }
        dealers[endpoint] = Dealer(socket: socket)
        pollDirty = true
        return socket
    }

    /// Sends [request id, empty, JSON, attachment?].
    private func send(_ message: OutgoingMessage, id: UInt64, on socket: Socket) -> Socket.SendResult {
        let first = socket.send(id, more: true)
        guard case .sent = first else { return first }
        let delimiter = socket.send(Data(), more: true)
        guard case .sent = delimiter else { return delimiter }
        return socket.sendBody(message)
    }

    private func flushBacklog(_ endpoint: Endpoint, now: UInt64) {
        guard let dealer = dealers[endpoint] else { return }
        var sentCount = 0
        for id in dealer.backlog {
            guard var entry = pending[id], let message = entry.unsent else {
                sentCount += 1
                continue
            }
            let result = send(message, id: id, on: dealer.socket)
            if case .wouldBlock = result { break }
            sentCount += 1
            if case .failed(let code) = result {
                pending[id] = nil
                entry.waiter.finish(
                    .failure(ServiceError(.internalError, "Cannot send to \(endpoint): \(zmqErrorText(code)).")))
                continue
            }
            entry.unsent = nil
            entry.sendBy = .max
            pending[id] = entry
            deadlines.push(time: entry.deadline, id: id)
        }
        dealers[endpoint]!.backlog.removeFirst(sentCount)
        if dealers[endpoint]!.backlog.isEmpty { pollDirty = true }
    }

    /// Replies are [request id, empty, JSON, attachment?].
    private func drainDealer(_ endpoint: Endpoint) {
        guard let dealer = dealers[endpoint] else { return }
        while true {
            switch dealer.socket.receive(into: &frames, scratch: scratch) {
            case .empty: return
            case .failed(let code):
                logger.warning("Receiving a reply failed", metadata: ["error": "\(zmqErrorText(code))"])
                return
            case .message:
                guard frames.count == 3 || frames.count == 4, frames[0].count == 8, frames[1].isEmpty else {
                    logger.debug("Unreadable reply dropped", metadata: ["endpoint": "\(endpoint)", "frames": "\(frames.count)"])
                    continue
                }
                let id = frames[0].withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(as: UInt64.self)) }
                guard let entry = pending.removeValue(forKey: id) else {
                    queue.count { $0.lateReplies += 1 }
                    continue
                }
                let result = Result<Message, any Error> { try Message(body: frames[2], attachment: frames.count == 4 ? frames[3] : nil) }
                if !entry.waiter.finish(result) {
                    queue.count { $0.lateReplies += 1 }
                }
            }
        }
    }

    private func expireDeadlines(now: UInt64) {
        var touchedDealers: Set<Endpoint> = []
        while let next = deadlines.first, next.time <= now {
            deadlines.removeFirst()
            guard let entry = pending[next.id] else { continue }
            if entry.unsent != nil, entry.sendBy <= now {
                pending[next.id] = nil
                touchedDealers.insert(entry.endpoint)
                entry.waiter.finish(
                    .failure(ServiceError(.noResponder, "Nothing answers at \(entry.endpoint). Is the service running?")))
            } else if entry.unsent == nil, entry.deadline <= now {
                pending[next.id] = nil
                entry.waiter.finish(
                    .failure(ServiceError(.timeout, "No reply from \(entry.endpoint) within \(entry.timeout).")))
            }
        }
        for endpoint in touchedDealers {
            dealers[endpoint]?.backlog.removeAll { pending[$0] == nil }
            if dealers[endpoint]?.backlog.isEmpty == true { pollDirty = true }
        }
        // Finished requests leave their deadlines behind; rebuild when those dominate.
        if deadlines.count > 1024, deadlines.count > 4 * pending.count {
            deadlines = DeadlineHeap(pending.map { id, entry in (entry.unsent == nil ? entry.deadline : entry.sendBy, id) })
        }
    }

    // MARK: Shutdown

    private func tearDown() {
        for publisher in publishers.values { publisher.socket.close() }
        for subscriber in subscribers.values { subscriber.socket.close() }
        for server in servers.values { server.socket.close() }
        for dealer in dealers.values { dealer.socket.close() }
        let subscriberStreams = subscribers.values.map(\.events)
        let serverStreams = servers.values.map(\.requests)
        let waiters = pending.values.map(\.waiter)
        publishers = [:]
        subscribers = [:]
        servers = [:]
        dealers = [:]
        pending = [:]
        for waiter in waiters {
            waiter.finish(.failure(ServiceError(.closed, "The bus was shut down before a reply came.")))
        }
        for stream in subscriberStreams { stream.finish() }
        for stream in serverStreams { stream.finish() }
        // Every socket is closed with linger 0, so this returns at once.
        while zmq_ctx_term(context) != 0, zmq_errno() == EINTR {}
        queue.markTerminated()
    }
}

/// Sends a server's reply to the I/O thread, at most once.
///
/// Threading: any thread; the claim is an atomic exchange.
final class Responder: Sendable {
    private let queue: CommandQueue
    private let serverID: UInt64
    private let route: [Data]
    private let replied = Atomic(false)

    init(queue: CommandQueue, serverID: UInt64, route: [Data]) {
        self.queue = queue
        self.serverID = serverID
        self.route = route
    }

    /// Returns `true` for the first caller only.
    func claim() -> Bool {
        !replied.exchange(true, ordering: .acquiringAndReleasing)
    }

    func send(_ reply: OutgoingMessage) {
        guard claim() else { return }
        queue.submit(.reply(serverID: serverID, route: route, message: reply))
    }
}

/// A binary min-heap of (deadline, request id). Entries of finished requests stay until they
/// surface and are skipped.
///
/// Threading: a value owned by ``IOLoop``, so used by the I/O thread only.
struct DeadlineHeap {
    private var items: [(time: UInt64, id: UInt64)] = []

    init() {}

    init(_ entries: [(UInt64, UInt64)]) {
        items = entries.map { (time: $0.0, id: $0.1) }
        for index in stride(from: items.count / 2 - 1, through: 0, by: -1) { siftDown(index) }
    }

    var count: Int { items.count }
    var first: (time: UInt64, id: UInt64)? { items.first }

    mutating func push(time: UInt64, id: UInt64) {
        items.append((time, id))
        var child = items.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard items[child].time < items[parent].time else { break }
            items.swapAt(child, parent)
            child = parent
        }
    }

    mutating func removeFirst() {
        let last = items.removeLast()
        guard !items.isEmpty else { return }
        items[0] = last
        siftDown(0)
    }

    private mutating func siftDown(_ start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < items.count, items[left].time < items[smallest].time { smallest = left }
            if right < items.count, items[right].time < items[smallest].time { smallest = right }
            if smallest == parent { return }
            items.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
