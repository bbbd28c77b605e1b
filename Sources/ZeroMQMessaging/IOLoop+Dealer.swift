import CZeroMQ
import Foundation
import Messaging

/// The requesting side: one DEALER per endpoint, the requests waiting for their replies and
/// their deadlines, and handing each reply (or failure) to whoever waits for it.
extension IOLoop {
    struct Dealer {
        var socket: Socket
        /// Requests waiting for the socket to become writable (no peer connected yet), oldest first.
        var backlog: [UInt64] = []
        /// Requests sent or queued here that are still waiting for their reply.
        var waiting = 0
        /// After a request was given up on (timed out, cancelled), its reply may still come: the
        /// socket is read until then, so that it is counted as late.
        var lateUntil: UInt64 = 0
        /// Why the last CURVE handshake with the server failed, until one succeeds.
        var handshakeFailure: String?

        /// Whether the loop watches the socket: only while a reply is expected. Every socket in
        /// the set costs each turn of the loop a look at its mailbox (two system calls), and a
        /// service's requesting sockets are idle on most turns.
        func polled(now: UInt64) -> Bool { waiting > 0 || !backlog.isEmpty || lateUntil > now }
    }

    struct Pending {
        var endpoint: Endpoint
        var timeout: Duration
        var waiter: ReplySink
        var deadline: UInt64
        /// While queued: the message, and when to give up with `noResponder`.
        var unsent: OutgoingMessage?
        var sendBy: UInt64 = .max
    }

    func startRequest(_ request: OutgoingRequest) {
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
                try setHeartbeats(socket)
                watch(socket, as: .dealer(endpoint), events: Self.handshakeEvents)
                // Replicas: one socket connected to each, which takes its connected peers in
                // turn. Each connection takes the server key set just before it.
                for replica in endpoint.replicas {
                    try secureClient(socket, to: replica)
                    try socket.connect(replica)
                }
            }
        } catch {
            dropMonitor(.dealer(endpoint))
            finish(.failure(error))
            return nil
        }
        dealers[endpoint] = Dealer(socket: socket)
        pollDirty = true
        return socket
    }

    /// ZMTP heartbeats on a connecting socket (see ``ZeroMQBus/Configuration/heartbeatInterval``).
    func setHeartbeats(_ socket: Socket) throws(ServiceError) {
        try socket.set(ZMQ_HEARTBEAT_IVL, Int32(clamping: configuration.heartbeatInterval.clampedNanoseconds / 1_000_000))
        try socket.set(ZMQ_HEARTBEAT_TIMEOUT, Int32(clamping: configuration.heartbeatTimeout.clampedNanoseconds / 1_000_000))
    }

    /// Sends [request id, empty, JSON, attachment?].
    private func send(_ message: OutgoingMessage, id: UInt64, on socket: Socket) -> Socket.SendResult {
        let first = socket.send(id, more: true)
        guard case .sent = first else { return first }
        let delimiter = socket.send(Data(), more: true)
        guard case .sent = delimiter else { return delimiter }
        return socket.sendBody(message)
    }

    func flushBacklog(_ endpoint: Endpoint, now: UInt64) {
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
    func untrack(_ id: UInt64, givenUp: Bool) -> Pending? {
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
    func drainDealer(_ endpoint: Endpoint) -> Bool {
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
    func expireDeadlines(now: UInt64) -> Bool {
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
                    .failure(ServiceError(.noResponder, noResponderMessage(entry.endpoint))))
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

    /// Hands `result` to a caller's waiter, or runs a loop caller's callback here. Returns `false`
    /// when the waiter had already finished (a late reply).
    func deliver(_ result: Result<Message, any Error>, to sink: ReplySink) -> Bool {
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

extension IOLoop {
    /// Why a request found nobody to take it.
    func noResponderMessage(_ endpoint: Endpoint) -> String {
        guard let why = dealers[endpoint]?.handshakeFailure else {
            return "Nothing answers at \(endpoint). Is the service running?"
        }
        return "Nothing answers at \(endpoint): the CURVE handshake with it failed: \(why)"
    }
}
