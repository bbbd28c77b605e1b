import CZeroMQ
import Foundation
import Messaging
import Synchronization

/// The serving side: ROUTER sockets, the requests they read, the replies sent back through
/// ``Responder``, and the grace before a server whose stream ended is closed.
extension IOLoop {
    struct Server {
        var socket: Socket
        var endpoint: Endpoint
        var limits: MessageLimits
        var sink: ServerSink
    }

    /// How long the socket of a server whose stream ended stays open before it is closed.
    static let retireGrace: UInt64 = 100_000_000

    func retireServers(now: UInt64) {
        guard retiring.contains(where: { $0.closeAt <= now }) else { return }
        for server in retiring where server.closeAt <= now {
            close(server.socket, linger: Self.flushLinger, what: "server at \(server.endpoint)")
        }
        retiring.removeAll { $0.closeAt <= now }
    }

    func serve(
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
                try secureServer(socket, at: endpoint, publisher: false)
                watch(socket, as: .server(id), events: Self.handshakeBroken)
                try socket.bind(endpoint)
            }
            servers[id] = Server(socket: socket, endpoint: endpoint, limits: limits, sink: sink)

            pollDirty = true
            done.resume()
        } catch {
            dropMonitor(.server(id))
            sink.finish()
            done.resume(throwing: error)
        }
    }

    /// Reads up to ``receiveBudget`` requests (the loop asks the socket again for the rest).
    /// Returns whether the socket may have more to read: the budget ran out, or receiving failed.
    func drainServer(_ id: UInt64) -> Bool {
        guard let server = servers[id] else { return false }
        var batch: [RawRequest] = []
        defer {
            if case .loop(let handler) = server.sink, !batch.isEmpty { runOnLoop { handler(batch) } }
        }
        // Who sent each request: the name of its key, when the bus has keys.
        let readCaller = configuration.keys != nil
        var caller: String?
        for _ in 0..<Self.receiveBudget {
            switch server.socket.receive(into: &frames, scratch: scratch, caller: &caller, readCaller: readCaller) {
            case .empty: return false
            case .failed(let code):
                logger.warning("Receiving a request failed", metadata: ["error": "\(zmqErrorText(code))"])
                return true
            case .message:
                handleRequest(frames, caller: caller, on: server, serverID: id, batch: &batch)
            }
        }
        return true
    }

    /// `frames` is [peer identity, routing frames..., empty delimiter, JSON, attachment?].
    private func handleRequest(
        _ frames: [Data], caller: String?, on server: Server, serverID: UInt64, batch: inout [RawRequest]
    ) {
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

        var message: Message
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
                batch.append(RawRequest(body: body, attachment: attachment, caller: caller) { reply in responder.send(reply) })
                return
            }
            message = try Message(body: body, attachment: attachment)
            message.caller = caller
        } catch {
            queue.count { $0.rejectedRequests += 1 }
            sendReply(on: server, route: route, message: Message.errorReply(error, refusing: body, limits: server.limits, source: source))
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

    func sendReply(on server: Server, route: [Data], message: OutgoingMessage) {
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
            // Its queue holds `replyHighWaterMark` replies already: logged once per connection.
            queue.count { $0.droppedReplies += 1 }
            guard let peer = route.first, slowCallers.insert(peer).inserted else { return }
            if slowCallers.count > 10_000 { slowCallers.removeAll() }
            logger.warning(
                "Replies dropped: a caller of \(server.endpoint) is not reading its replies (\(configuration.replyHighWaterMark) are queued for it)",
                metadata: ["endpoint": "\(server.endpoint)"])
        case .failed(let code):
            logger.warning(
                "Sending a reply failed", metadata: ["endpoint": "\(server.endpoint)", "error": "\(zmqErrorText(code))"])
        }
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

/// Where a server's requests go: an async stream, or a handler on the I/O thread.
enum ServerSink: Sendable {
    case stream(AsyncStream<IncomingRequest>.Continuation)
    case loop(@Sendable ([RawRequest]) -> Void)

    func finish() {
        if case .stream(let requests) = self { requests.finish() }
    }
}
