import CZeroMQ
import Messaging

extension IOLoop {
    struct Subscriber {
        var socket: Socket
        var sink: SubscriberSink
    }

    func subscribe(
        id: UInt64, endpoints: [Endpoint], topics: [String], limits: MessageLimits,
        sink: SubscriberSink, done: CheckedContinuation<Void, any Error>
    ) {
        do {
            let socket = try openSocket(ZMQ_SUB) { socket throws(ServiceError) in
                try socket.set(ZMQ_MAXMSGSIZE, Int64(limits.transportCap))
                // Deep, in this process's own memory: a burst is read late, not dropped.
                try socket.set(ZMQ_RCVHWM, Int32(clamping: configuration.receiveHighWaterMark))
                for topic in topics { try socket.subscribe(topic) }
                try setHeartbeats(socket)
                watch(socket, as: .subscriber(id), events: Self.handshakeEvents)
                for endpoint in endpoints.flatMap(\.replicas) {
                    // Each connection takes the server key set just before it.
                    try secureClient(socket, to: endpoint)
                    try socket.connect(endpoint)
                }
            }
            subscribers[id] = Subscriber(socket: socket, sink: sink)
            pollDirty = true
            done.resume()
        } catch {
            dropMonitor(.subscriber(id))
            sink.finish()
            done.resume(throwing: error)
        }
    }

    /// Reads up to ``receiveBudget`` events (the loop asks the socket again for the rest).
    /// Returns whether the socket may have more to read: the budget ran out, or receiving failed.
    func drainSubscriber(_ id: UInt64) -> Bool {
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
}

/// Where a subscriber's events go: an async stream, or a handler on the I/O thread.
enum SubscriberSink: Sendable {
    case stream(AsyncStream<Message>.Continuation)
    case loop(@Sendable ([RawEvent]) -> Void)

    func finish() {
        if case .stream(let events) = self { events.finish() }
    }
}
