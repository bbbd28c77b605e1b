import CZeroMQ
import Foundation
import Logging
import Messaging

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
    enum PollTarget: Hashable {
        case wake
        case subscriber(UInt64)
        case server(UInt64)
        case dealer(Endpoint)
        case zap
        case monitor(Watched)
    }

    let context: UnsafeMutableRawPointer
    let queue: CommandQueue
    let logger: Logger
    let source: String
    let configuration: ZeroMQBus.Configuration

    var publishers: [UInt64: Publisher] = [:]
    var subscribers: [UInt64: Subscriber] = [:]
    var servers: [UInt64: Server] = [:]
    var dealers: [Endpoint: Dealer] = [:]
    /// Requests waiting for their reply; add and remove them with `track` and `untrack`.
    var pending: [UInt64: Pending] = [:]
    /// Dealers whose `lateUntil` is set, to unset when it passes.
    var lateDealers = 0
    var deadlines = DeadlineHeap()

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
    var pollDirty = true
    private var stopping = false
    /// Servers whose stream has ended, kept open (unpolled) until `closeAt` so that the replies
    /// already on the socket reach their callers before the connections go down.
    var retiring: [(socket: Socket, endpoint: Endpoint, closeAt: UInt64)] = []

    /// The ZAP handler's socket, when the bus has keys (see `IOLoop+Security.swift`).
    var zap: Socket?
    /// Why the ZAP handler could not start: then no server may bind, since without it CURVE
    /// would admit any client.
    var zapFailure: ServiceError?
    /// Refused peers already logged ("address fingerprint").
    var refusedPeers: Set<String> = []
    /// The client keys the ZAP handler admits: ``BusKeys/clients``, read again when the keys
    /// directory changes (its modification time, as of `keysStamp`).
    var admitted: [CurveKey: String] = [:]
    var keysStamp: timespec?
    /// The names of the keys admitted to follow a publisher (its ZAP domain), by the host they
    /// came from: a slow subscriber's log line names them.
    var followers: [String: [String: Set<String>]] = [:]

    /// The sockets' monitors, by the socket they watch (see `IOLoop+Monitor.swift`).
    var monitors: [Watched: Socket] = [:]
    var monitorCount: UInt64 = 0
    /// When the publishers' subscriber connections are next looked at; `.max` while none has any.
    var nextSubscriberCheck: UInt64 = .max
    /// Endpoints whose failed handshake was logged (until one succeeds).
    var failedEndpoints: Set<String> = []
    /// Callers (their routing ids) whose dropped replies were logged.
    var slowCallers: Set<Data> = []

    /// Reused for every received frame.
    let scratch: UnsafeMutablePointer<zmq_msg_t>
    var frames: [Data] = []

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
        do {
            zap = try startZAPHandler()
        } catch {
            zapFailure = error
            logger.error("\(error.message) No server of this bus will start.")
        }
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
                case .zap: more = zap.map(drainZAP) ?? false
                case .monitor(let watched): more = drainMonitor(watched)
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
            checkSubscribers(now: after)
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
        if let zap { add(zap, fd: zap.notificationFD(), events: ZMQ_POLLIN, .zap) }
        for (watched, monitor) in monitors { add(monitor, fd: monitor.notificationFD(), events: ZMQ_POLLIN, .monitor(watched)) }
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
    func touched(_ target: PollTarget) {
        if let index = pollIndex[target] { pollCheck[index] = true }
    }

    /// Milliseconds until the nearest deadline, or -1 (wait for an event) when there is none.
    /// Computed before every wait, so without building arrays or applying key paths.
    private func pollTimeout(now: UInt64) -> Int {
        var next = min(deadlines.first?.time ?? .max, nextSubscriberCheck)
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
            forgetConnections(of: id)
            if let publisher = publishers.removeValue(forKey: id) {
                unwatch(publisher.socket, as: .publisher(id))
                close(publisher.socket, linger: Self.flushLinger, what: "publisher at \(publisher.endpoint)")
            }
        case .subscribe(let id, let endpoints, let topics, let limits, let sink, let done):
            subscribe(id: id, endpoints: endpoints, topics: topics, limits: limits, sink: sink, done: done)
        case .closeSubscriber(let id):
            if let subscriber = subscribers.removeValue(forKey: id) {
                unwatch(subscriber.socket, as: .subscriber(id))
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
                unwatch(server.socket, as: .server(id))
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

    /// Runs a loop handler, then sends what it queued (replies, events) before anything else.
    func runOnLoop(_ handler: () -> Void) {
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

    /// How long a closed server or publisher keeps sending what is already queued (replies,
    /// events), in milliseconds. Short, because `zmq_ctx_term` at shutdown waits as long.
    /// Requesting and subscribing sockets close with 0: nothing they queue is worth waiting for.
    static let flushLinger: Int32 = 200

    /// Creates a socket of `type` with linger 0, runs `configure` on it, and closes it again when
    /// that throws.
    func openSocket(
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
    func close(_ socket: Socket, linger: Int32, what: String) {
        do {
            try socket.close(linger: linger)
        } catch {
            logger.error("Closing a ZeroMQ \(what): \(error.message)", metadata: ["error": "\(error)"])
        }
    }
}
