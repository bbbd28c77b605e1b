import CZeroMQ
import Foundation
import Logging
import Messaging
import Synchronization

/// The state and the `poll(2)` loop of one ``ZeroMQBus``'s I/O thread.
///
/// Threading: created on the caller's thread, then handed once to the dedicated I/O thread, which
/// is the only thread that touches it afterwards. It owns the libzmq context and every socket of
/// the bus for their whole lives. Async code reaches it only through ``CommandQueue``; results go
/// back through continuations. Nothing here may block except that `poll` itself.
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
        var sink: SubscriberSink
    }

    private struct Server {
        var socket: Socket
        var endpoint: Endpoint
        var limits: MessageLimits
        var sink: ServerSink
    }

    private struct Dealer {
        var socket: Socket
        /// Requests waiting for the socket to become writable (no peer connected yet), oldest first.
        var backlog: [UInt64] = []
        /// Requests sent or queued here that are still waiting for their reply.
        var waiting = 0
        /// After a request was given up on (timed out, cancelled), its reply may still come: the
        /// socket is read until then, so that it is counted as late.
        var lateUntil: UInt64 = 0

        /// Whether the loop watches the socket: only while a reply is expected. Every socket in
        /// the set costs each turn of the loop a look at its mailbox (two system calls), and a
        /// service's requesting sockets are idle on most turns.
        func polled(now: UInt64) -> Bool { waiting > 0 || !backlog.isEmpty || lateUntil > now }
    }

    private struct Pending {
        var endpoint: Endpoint
        var timeout: Duration
        var waiter: ReplySink
        var deadline: UInt64
        /// While queued: the message, and when to give up with `noResponder`.
        var unsent: OutgoingMessage?
        var sendBy: UInt64 = .max
    }

    private enum PollTarget: Hashable {
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
    /// Requests waiting for their reply; add and remove them with `track` and `untrack`.
    private var pending: [UInt64: Pending] = [:]
    /// Dealers whose `lateUntil` is set, to unset when it passes.
    private var lateDealers = 0
    private var deadlines = DeadlineHeap()

    /// What the loop waits on: the command queue's eventfd first, then each watched socket's
    /// ``Socket/notificationFD()``, in the order of `pollTargets`.
    private var pollFDs: [pollfd] = []
    private var pollTargets: [PollTarget] = []
    /// Per entry of `pollTargets`: the socket, and the events wanted of it (nil for the eventfd).
    private var pollSockets: [(socket: Socket, events: Int32)?] = []
    /// Per entry: whether to ask the socket for its events before the loop next waits.
    private var pollCheck: [Bool] = []
    /// Where each target is in `pollTargets`.
    private var pollIndex: [PollTarget: Int] = [:]
    private var pollDirty = true
    private var stopping = false
    /// Servers whose stream has ended, kept open (unpolled) until `closeAt` so that the replies
    /// already on the socket reach their callers before the connections go down.
    private var retiring: [(socket: Socket, endpoint: Endpoint, closeAt: UInt64)] = []

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

    /// The most messages read from one socket in one pass of the loop. A socket with more waiting
    /// is read again on the next pass, after the commands (replies among them) and every other
    /// socket have had their turn, so a flood on one socket cannot starve the rest.
    static let receiveBudget = 256

    func run() {
        queue.adoptLoopThread { [unowned self] command in perform(command) }
        // The loop waits with poll(2) on the sockets' notification descriptors itself instead of
        // calling zmq_poll, which asks every socket for its events (two system calls each) twice
        // per wake-up. Here a socket is asked only when its descriptor was signalled or after the
        // loop received from it or sent on it (either can consume the notification of a message
        // that is then waiting unannounced): libzmq's rule for ZMQ_FD.
        // Whether the previous pass called poll(2): a pass with a socket ready skips it when
        // the previous one did not, so the other descriptors are still looked at every other
        // pass under a flood, and a single message costs no extra system call.
        var polledLastPass = true
        while !stopping {
            if pollDirty { rebuildPollItems() }
            var ready: [(index: Int, events: Int32)] = []
            for index in pollCheck.indices where pollCheck[index] {
                pollCheck[index] = false
                guard let (socket, wanted) = pollSockets[index] else { continue }
                let events = socket.events() & wanted
                if events != 0 { ready.append((index, events)) }
            }
            var wake = false
            if !ready.isEmpty, polledLastPass {
                // Something is ready: the only other thing to look at is the command queue,
                // whose wake-up flag says as much as its eventfd would.
                wake = queue.wakePending
                polledLastPass = false
            } else {
                // Wait only when nothing is ready; otherwise just look.
                let timeout = ready.isEmpty ? pollTimeout(now: monotonicNanoseconds()) : 0
                let signalled = pollFDs.withUnsafeMutableBufferPointer { fds in
                    poll(fds.baseAddress, nfds_t(fds.count), Int32(clamping: timeout))
                }
                if signalled < 0, errno != EINTR {
                    logger.error("poll failed", metadata: ["error": "\(String(cString: strerror(errno)))"])
                }
                if signalled > 0 {
                    for index in pollFDs.indices where pollFDs[index].revents != 0 {
                        if index == 0 { wake = true } else { pollCheck[index] = true }
                    }
                }
                polledLastPass = true
            }
            // Sockets first, commands last: a command may close a socket, and targets are
            // looked up by id, so a socket closed here is simply skipped.
            for (index, events) in ready {
                // A socket read until it had nothing left (EAGAIN) has taken every notification
                // it had, and signals its descriptor for the next message; one left with more to
                // read, or sent on since (see `touched`), is asked again before the loop waits.
                let more: Bool
                switch pollTargets[index] {
                case .wake: more = false
                case .subscriber(let id): more = drainSubscriber(id)
                case .server(let id): more = drainServer(id)
                case .dealer(let endpoint):
                    var dealerMore = false
                    if events & ZMQ_POLLIN != 0 { dealerMore = drainDealer(endpoint) }
                    if events & ZMQ_POLLOUT != 0 {
                        flushBacklog(endpoint, now: monotonicNanoseconds())
                        dealerMore = true
                    }
                    more = dealerMore
                }
                if more { pollCheck[index] = true }
            }
            if wake {
                queue.carryOut(queue.takeCommands(), with: perform)
                flushLocalCommands()
            }
            // Anything submitted on this thread outside a loop handler (none today) goes out too.
            flushLocalCommands()
            let after = monotonicNanoseconds()
            expireDeadlines(now: after)
            retireServers(now: after)
        }
        tearDown()
    }

    private func rebuildPollItems() {
        pollFDs.removeAll(keepingCapacity: true)
        pollTargets.removeAll(keepingCapacity: true)
        pollSockets.removeAll(keepingCapacity: true)
        func add(_ socket: Socket?, fd: Int32, events: Int32, _ target: PollTarget) {
            pollFDs.append(pollfd(fd: fd, events: Int16(POLLIN), revents: 0))
            pollTargets.append(target)
            pollSockets.append(socket.map { ($0, events) })
        }
        add(nil, fd: queue.wakeFD, events: 0, .wake)
        for (id, subscriber) in subscribers {
            add(subscriber.socket, fd: subscriber.socket.notificationFD(), events: ZMQ_POLLIN, .subscriber(id))
        }
        for (id, server) in servers { add(server.socket, fd: server.socket.notificationFD(), events: ZMQ_POLLIN, .server(id)) }
        let now = monotonicNanoseconds()
        for (endpoint, dealer) in dealers where dealer.polled(now: now) {
            let events = dealer.backlog.isEmpty ? ZMQ_POLLIN : ZMQ_POLLIN | ZMQ_POLLOUT
            add(dealer.socket, fd: dealer.socket.notificationFD(), events: events, .dealer(endpoint))
        }
        // A socket new to the set may have messages already: ask each once.
        pollCheck = [Bool](repeating: true, count: pollTargets.count)
        pollIndex = Dictionary(uniqueKeysWithValues: zip(pollTargets, pollTargets.indices))
        pollDirty = false
    }

    /// Notes that the loop sent on a watched socket: it is asked for its events before the loop
    /// waits (the send may have consumed the notification of a message that arrived meanwhile).
    private func touched(_ target: PollTarget) {
        if let index = pollIndex[target] { pollCheck[index] = true }
    }

    /// Milliseconds until the nearest deadline, or -1 (wait for an event) when there is none.
    /// Computed before every wait, so without building arrays or applying key paths.
    private func pollTimeout(now: UInt64) -> Int {
        var next = deadlines.first?.time ?? .max
        for server in retiring where server.closeAt < next { next = server.closeAt }
        if next == .max { return -1 }
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
            if let publisher = publishers.removeValue(forKey: id) {
                close(publisher.socket, linger: Self.flushLinger, what: "publisher at \(publisher.endpoint)")
            }
        case .subscribe(let id, let endpoints, let topics, let limits, let sink, let done):
            subscribe(id: id, endpoints: endpoints, topics: topics, limits: limits, sink: sink, done: done)
        case .closeSubscriber(let id):
            if let subscriber = subscribers.removeValue(forKey: id) {
                close(subscriber.socket, linger: 0, what: "subscriber")
                subscriber.sink.finish()
                pollDirty = true
            }
        case .serve(let id, let endpoint, let limits, let sink, let done):
            serve(id: id, endpoint: endpoint, limits: limits, sink: sink, done: done)
        case .closeServer(let id):
            // Replies handed over before the stream ended were queued before this command, so
            // they are on the socket now. Closing it at once would cut the connections while
            // libzmq may still be writing them (zmq_close's linger covers the socket's queues,
            // not the last bytes in flight), so the socket stays open, unread, for a short
            // grace, and then closes with a linger as well.
            if let server = servers.removeValue(forKey: id) {
                server.sink.finish()
                retiring.append((server.socket, server.endpoint, monotonicNanoseconds() + Self.retireGrace))
                pollDirty = true
            }
        case .reply(let serverID, let route, let message):
            guard let server = servers[serverID] else {
                logger.debug("Reply dropped: the server is closed", metadata: ["server": "\(serverID)"])
                return
            }
            sendReply(on: server, route: route, message: message)
            touched(.server(serverID))
        case .request(let request):
            startRequest(request)
        case .cancelRequest(let id):
            // The caller's waiter is already resumed with CancellationError; forget the entry so
            // a reply that still comes counts as late.
            untrack(id, givenUp: true)
        case .run(let job):
            // What the job sends is flushed by the caller, behind what was already queued.
            job()
        case .shutdown:
            stopping = true
        }
    }

    /// How long a closed server or publisher keeps sending what is already queued (replies,
    /// events), in milliseconds. Short, because `zmq_ctx_term` at shutdown waits as long.
    /// Requesting and subscribing sockets close with 0: nothing they queue is worth waiting for.
    static let flushLinger: Int32 = 200

    /// How long the socket of a server whose stream ended stays open before it is closed.
    static let retireGrace: UInt64 = 100_000_000

    private func retireServers(now: UInt64) {
        guard retiring.contains(where: { $0.closeAt <= now }) else { return }
        for server in retiring where server.closeAt <= now {
            close(server.socket, linger: Self.flushLinger, what: "server at \(server.endpoint)")
        }
        retiring.removeAll { $0.closeAt <= now }
    }

    /// Creates a socket of `type` with linger 0, runs `configure` on it, and closes it again when
    /// that throws.
    private func openSocket(
        _ type: Int32, configure: (Socket) throws(ServiceError) -> Void
    ) throws(ServiceError) -> Socket {
        guard let handle = zmq_socket(context, type) else {
            throw ServiceError(.internalError, "Cannot create a ZeroMQ socket: \(zmqErrorText(zmq_errno())).")
        }
        let socket = Socket(handle: handle)
        do {
            try socket.set(ZMQ_LINGER, Int32(0))
            try configure(socket)
        } catch {
            close(socket, linger: 0, what: "socket that failed to open")
            throw error
        }
        return socket
    }

    /// Closes `socket` with `linger`; a failure to set the linger is logged, never silent.
    private func close(_ socket: Socket, linger: Int32, what: String) {
        do {
            try socket.close(linger: linger)
        } catch {
            logger.error("Closing a ZeroMQ \(what): \(error.message)", metadata: ["error": "\(error)"])
        }
    }

    // MARK: Events

    private func bindPublisher(id: UInt64, endpoint: Endpoint, done: CheckedContinuation<Void, any Error>) {
        do {
            let socket = try openSocket(ZMQ_PUB) { socket throws(ServiceError) in
                // Subscribers only send subscription messages (topic prefixes) to a PUB socket.
                try socket.set(ZMQ_MAXMSGSIZE, Int64(64 * 1024))
                try socket.set(ZMQ_SNDHWM, Int32(clamping: configuration.publishHighWaterMark))
                try socket.bind(endpoint)
            }
            publishers[id] = Publisher(socket: socket, endpoint: endpoint)
            done.resume()
        } catch {
            done.resume(throwing: error)
        }
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
        sink: SubscriberSink, done: CheckedContinuation<Void, any Error>
    ) {
        do {
            let socket = try openSocket(ZMQ_SUB) { socket throws(ServiceError) in
                try socket.set(ZMQ_MAXMSGSIZE, Int64(limits.transportCap))
                // As deep as the publisher's queue for us: a burst is read late, not dropped.
                try socket.set(ZMQ_RCVHWM, Int32(clamping: configuration.publishHighWaterMark))
                for topic in topics { try socket.subscribe(topic) }
                for endpoint in endpoints { try socket.connect(endpoint) }
            }
            subscribers[id] = Subscriber(socket: socket, sink: sink)
            pollDirty = true
            done.resume()
        } catch {
            sink.finish()
            done.resume(throwing: error)
        }
    }

    /// Reads up to ``receiveBudget`` events (the loop asks the socket again for the rest).
    /// Returns whether the socket may have more to read: the budget ran out, or receiving failed.
    private func drainSubscriber(_ id: UInt64) -> Bool {
        guard let subscriber = subscribers[id] else { return false }
        var batch: [RawEvent] = []
        defer {
            if case .loop(let handler) = subscriber.sink, !batch.isEmpty { runOnLoop { handler(batch) } }
        }
        for _ in 0..<Self.receiveBudget {
            switch subscriber.socket.receive(into: &frames, scratch: scratch) {
            case .empty: return false
            case .failed(let code):
                logger.warning("Receiving an event failed", metadata: ["error": "\(zmqErrorText(code))"])
                return true
            case .message:
                guard frames.count == 2 || frames.count == 3, let topic = String(validating: frames[0], as: UTF8.self)
                else {
                    queue.count { $0.unreadableEvents += 1 }
                    continue
                }
                switch subscriber.sink {
                case .loop:
                    batch.append(RawEvent(topic: topic, body: frames[1], attachment: frames.count == 3 ? frames[2] : nil))
                case .stream(let events):
                    guard let message = try? Message(topic: topic, body: frames[1], attachment: frames.count == 3 ? frames[2] : nil)
                    else {
                        queue.count { $0.unreadableEvents += 1 }
                        continue
                    }
                    if case .dropped = events.yield(message) {
                        queue.count { $0.droppedEvents += 1 }
                    }
                }
            }
        }
        return true
    }

    /// Hands `result` to a caller's waiter, or runs a loop caller's callback here. Returns `false`
    /// when the waiter had already finished (a late reply).
    private func deliver(_ result: Result<Message, any Error>, to sink: ReplySink) -> Bool {
        switch sink {
        case .waiter(let waiter):
            return waiter.finish(result)
        case .loop(let callback):
            let answer = result.mapError { error -> ServiceError in
                (error as? ServiceError) ?? ServiceError(.internalError, "\(error)")
            }
            runOnLoop { callback(answer) }
            return true
        }
    }

    private func finisher(_ sink: ReplySink) -> (Result<Message, any Error>) -> Void {
        { result in _ = self.deliver(result, to: sink) }
    }

    /// Runs a loop handler, then sends what it queued (replies, events) before anything else.
    private func runOnLoop(_ handler: () -> Void) {
        handler()
        flushLocalCommands()
    }

    /// Performs what this thread submitted, in submission order, including what those commands
    /// submit in turn (a job run with `perform(onLoop:)` queues its sends behind the ones before).
    private func flushLocalCommands() {
        while true {
            let commands = queue.takeLocalCommands()
            if commands.isEmpty { return }
            queue.carryOut(commands, with: perform)
        }
    }

    // MARK: Serving

    private func serve(
        id: UInt64, endpoint: Endpoint, limits: MessageLimits, sink: ServerSink, done: CheckedContinuation<Void, any Error>
    ) {
        // A server retiring at this endpoint gives way to the new one now.
        for server in retiring where server.endpoint == endpoint {
            close(server.socket, linger: Self.flushLinger, what: "server at \(server.endpoint)")
        }
        retiring.removeAll { $0.endpoint == endpoint }
        do {
            let socket = try openSocket(ZMQ_ROUTER) { socket throws(ServiceError) in
                try socket.set(ZMQ_MAXMSGSIZE, Int64(limits.transportCap))
                try socket.set(ZMQ_ROUTER_MANDATORY, Int32(1))
                try socket.set(ZMQ_SNDHWM, Int32(clamping: configuration.replyHighWaterMark))
                try socket.bind(endpoint)
            }
            servers[id] = Server(socket: socket, endpoint: endpoint, limits: limits, sink: sink)
            pollDirty = true
            done.resume()
        } catch {
            sink.finish()
            done.resume(throwing: error)
        }
    }

    /// Reads up to ``receiveBudget`` requests (the loop asks the socket again for the rest).
    /// Returns whether the socket may have more to read: the budget ran out, or receiving failed.
    private func drainServer(_ id: UInt64) -> Bool {
        guard let server = servers[id] else { return false }
        var batch: [RawRequest] = []
        defer {
            if case .loop(let handler) = server.sink, !batch.isEmpty { runOnLoop { handler(batch) } }
        }
        for _ in 0..<Self.receiveBudget {
            switch server.socket.receive(into: &frames, scratch: scratch) {
            case .empty: return false
            case .failed(let code):
                logger.warning("Receiving a request failed", metadata: ["error": "\(zmqErrorText(code))"])
                return true
            case .message:
                handleRequest(frames, on: server, serverID: id, batch: &batch)
            }
        }
        return true
    }

    /// `frames` is [peer identity, routing frames..., empty delimiter, JSON, attachment?].
    private func handleRequest(_ frames: [Data], on server: Server, serverID: UInt64, batch: inout [RawRequest]) {
        // A closure, not the key path `\.isEmpty`: applying a key path costs runtime lookups per
        // request (about 1 % of a loop thread's time at 1,000 sign-ins/s, `perf record`).
        guard frames.count > 1, let delimiter = frames[1...].firstIndex(where: { $0.isEmpty }) else {
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
            if case .loop = server.sink {
                // Read by the handler, once.
                let responder = Responder(queue: queue, serverID: serverID, route: route)
                batch.append(RawRequest(body: body, attachment: attachment) { reply in responder.send(reply) })
                return
            }
            message = try Message(body: body, attachment: attachment)
        } catch {
            queue.count { $0.rejectedRequests += 1 }
            sendReply(on: server, route: route, message: Message.errorReply(error, correlationId: nil, source: source))
            return
        }
        guard case .stream(let requests) = server.sink else { return }

        let responder = Responder(queue: queue, serverID: serverID, route: route)
        let request = IncomingRequest(message: message) { reply in responder.send(reply) }
        switch requests.yield(request) {
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
        let finish = finisher(request.waiter)
        let now = monotonicNanoseconds()
        guard let socket = dealer(for: request.endpoint, failing: finish) else { return }
        var entry = Pending(
            endpoint: request.endpoint, timeout: request.timeout, waiter: request.waiter, deadline: request.deadline)
        if dealers[request.endpoint]?.backlog.isEmpty ?? true {
            defer { touched(.dealer(request.endpoint)) }
            switch send(request.message, id: request.id, on: socket) {
            case .sent:
                track(request.id, entry)
                deadlines.push(time: entry.deadline, id: request.id)
                return
            case .wouldBlock:
                break
            case .failed(let code):
                finish(.failure(ServiceError(.internalError, "Cannot send to \(request.endpoint): \(zmqErrorText(code)).")))
                return
            }
        }
        // Not writable: no peer is connected (yet). Wait a short grace for one to appear.
        entry.unsent = request.message
        entry.sendBy = min(entry.deadline, now + configuration.connectGrace.clampedNanoseconds)
        track(request.id, entry)
        deadlines.push(time: entry.sendBy, id: request.id)
        if dealers[request.endpoint]!.backlog.isEmpty { pollDirty = true }
        dealers[request.endpoint]!.backlog.append(request.id)
    }

    /// The DEALER for `endpoint`, created and connected on first use.
    private func dealer(for endpoint: Endpoint, failing finish: (Result<Message, any Error>) -> Void) -> Socket? {
        if let dealer = dealers[endpoint] { return dealer.socket }
        let socket: Socket
        do {
            socket = try openSocket(ZMQ_DEALER) { socket throws(ServiceError) in
                try socket.set(ZMQ_IMMEDIATE, Int32(1))
                // Unlimited queues: with ZMQ_IMMEDIATE, EAGAIN then means "no peer", never "queue
                // full". Callers bound what is in flight, since each request is an awaiting task.
                try socket.set(ZMQ_SNDHWM, Int32(0))
                try socket.set(ZMQ_RCVHWM, Int32(0))
                try socket.set(ZMQ_MAXMSGSIZE, Int64(clamping: configuration.maxReplyFrameBytes))
                try socket.connect(endpoint)
            }
        } catch {
            finish(.failure(error))
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
            touched(.dealer(endpoint))
            if case .wouldBlock = result { break }
            sentCount += 1
            if case .failed(let code) = result {
                untrack(id, givenUp: false)
                finisher(entry.waiter)(
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

    /// Records a request that waits for its reply; its dealer is polled from now on.
    private func track(_ id: UInt64, _ entry: Pending) {
        pending[id] = entry
        guard var dealer = dealers[entry.endpoint] else { return }
        dealer.waiting += 1
        dealers[entry.endpoint] = dealer
        if dealer.waiting == 1 { pollDirty = true }
    }

    /// Forgets a request (answered, failed, given up on). `givenUp`: a reply may still come, so
    /// the dealer is read a while longer for it (see ``lateReplyWindow``).
    @discardableResult
    private func untrack(_ id: UInt64, givenUp: Bool) -> Pending? {
        guard let entry = pending.removeValue(forKey: id) else { return nil }
        guard var dealer = dealers[entry.endpoint] else { return entry }
        dealer.waiting -= 1
        if givenUp {
            if dealer.lateUntil == 0 { lateDealers += 1 }
            dealer.lateUntil = monotonicNanoseconds() + Self.lateReplyWindow
        }
        dealers[entry.endpoint] = dealer
        if dealer.waiting == 0 { pollDirty = true }
        return entry
    }

    /// How long a dealer is still read after a request on it was given up on, in nanoseconds.
    static let lateReplyWindow: UInt64 = 30_000_000_000

    /// Replies are [request id, empty, JSON, attachment?].
    /// Reads up to ``receiveBudget`` replies (the loop asks the socket again for the rest).
    /// Returns whether the socket may have more to read: the budget ran out, or receiving failed.
    private func drainDealer(_ endpoint: Endpoint) -> Bool {
        guard let dealer = dealers[endpoint] else { return false }
        // Replies for loop callers are handed over together, in one turn of the loop, so that
        // what they queue (a commit, say) is done once for all of them.
        var callbacks: [(callback: @Sendable (Result<Message, ServiceError>) -> Void, result: Result<Message, ServiceError>)] = []
        defer {
            if !callbacks.isEmpty {
                runOnLoop { for (callback, result) in callbacks { callback(result) } }
            }
        }
        for _ in 0..<Self.receiveBudget {
            switch dealer.socket.receive(into: &frames, scratch: scratch) {
            case .empty: return false
            case .failed(let code):
                logger.warning("Receiving a reply failed", metadata: ["error": "\(zmqErrorText(code))"])
                return true
            case .message:
                guard frames.count == 3 || frames.count == 4, frames[0].count == 8, frames[1].isEmpty else {
                    logger.debug("Unreadable reply dropped", metadata: ["endpoint": "\(endpoint)", "frames": "\(frames.count)"])
                    continue
                }
                let id = frames[0].withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(as: UInt64.self)) }
                guard let entry = untrack(id, givenUp: false) else {
                    queue.count { $0.lateReplies += 1 }
                    continue
                }
                let result = Result<Message, any Error> { try Message(body: frames[2], attachment: frames.count == 4 ? frames[3] : nil) }
                if case .loop(let callback) = entry.waiter {
                    callbacks.append((callback, result.mapError { ($0 as? ServiceError) ?? ServiceError(.internalError, "\($0)") }))
                    continue
                }
                if !deliver(result, to: entry.waiter) {
                    queue.count { $0.lateReplies += 1 }
                }
            }
        }
        return true
    }

    /// Fails the requests whose time is up. Returns whether it failed any (their callers may have
    /// sent something in turn).
    @discardableResult
    private func expireDeadlines(now: UInt64) -> Bool {
        var touchedDealers: Set<Endpoint> = []
        var expired = false
        while let next = deadlines.first, next.time <= now {
            deadlines.removeFirst()
            guard let entry = pending[next.id] else { continue }
            expired = true
            if entry.unsent != nil, entry.sendBy <= now {
                untrack(next.id, givenUp: false)
                touchedDealers.insert(entry.endpoint)
                finisher(entry.waiter)(
                    .failure(ServiceError(.noResponder, "Nothing answers at \(entry.endpoint). Is the service running?")))
            } else if entry.unsent == nil, entry.deadline <= now {
                untrack(next.id, givenUp: true)
                finisher(entry.waiter)(
                    .failure(ServiceError(.timeout, "No reply from \(entry.endpoint) within \(entry.timeout).")))
            }
        }
        for endpoint in touchedDealers {
            dealers[endpoint]?.backlog.removeAll { pending[$0] == nil }
            if dealers[endpoint]?.backlog.isEmpty == true { pollDirty = true }
        }
        if lateDealers > 0 {
            for (endpoint, dealer) in dealers where dealer.lateUntil != 0 && dealer.lateUntil <= now {
                dealers[endpoint]!.lateUntil = 0
                lateDealers -= 1
                pollDirty = true
            }
        }
        // Finished requests leave their deadlines behind; rebuild when those dominate.
        if deadlines.count > 1024, deadlines.count > 4 * pending.count {
            deadlines = DeadlineHeap(pending.map { id, entry in (entry.unsent == nil ? entry.deadline : entry.sendBy, id) })
        }
        return expired
    }

    // MARK: Shutdown

    private func tearDown() {
        for publisher in publishers.values {
            close(publisher.socket, linger: Self.flushLinger, what: "publisher at \(publisher.endpoint)")
        }
        for subscriber in subscribers.values { close(subscriber.socket, linger: 0, what: "subscriber") }
        for server in servers.values { close(server.socket, linger: Self.flushLinger, what: "server at \(server.endpoint)") }
        for server in retiring { close(server.socket, linger: Self.flushLinger, what: "server at \(server.endpoint)") }
        retiring = []
        for (endpoint, dealer) in dealers { close(dealer.socket, linger: 0, what: "requester for \(endpoint)") }
        let subscriberStreams = subscribers.values.map(\.sink)
        let serverStreams = servers.values.map(\.sink)
        let waiters = pending.values.map(\.waiter)
        publishers = [:]
        subscribers = [:]
        servers = [:]
        dealers = [:]
        pending = [:]
        for waiter in waiters {
            _ = deliver(.failure(ServiceError(.closed, "The bus was shut down before a reply came.")), to: waiter)
        }
        for stream in subscriberStreams { stream.finish() }
        for stream in serverStreams { stream.finish() }
        // Servers and publishers linger at most `flushLinger` to send what is queued; the rest
        // close with linger 0. So this returns within that bound.
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

/// Where a subscriber's events go: an async stream, or a handler on the I/O thread.
enum SubscriberSink: Sendable {
    case stream(AsyncStream<Message>.Continuation)
    case loop(@Sendable ([RawEvent]) -> Void)

    func finish() {
        if case .stream(let events) = self { events.finish() }
    }
}

/// Where a server's requests go: an async stream, or a handler on the I/O thread.
enum ServerSink: Sendable {
    case stream(AsyncStream<IncomingRequest>.Continuation)
    case loop(@Sendable ([RawRequest]) -> Void)

    func finish() {
        if case .stream(let requests) = self { requests.finish() }
    }
}

/// Who gets a request's reply: a waiting task, or a callback on the I/O thread.
enum ReplySink: Sendable {
    case waiter(ReplyWaiter)
    case loop(@Sendable (Result<Message, ServiceError>) -> Void)

    /// Whether a waiting task has already been answered (cancelled, for example).
    var isFinished: Bool {
        if case .waiter(let waiter) = self { return waiter.isFinished }
        return false
    }
}
