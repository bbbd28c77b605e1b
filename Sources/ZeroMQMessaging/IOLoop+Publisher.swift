import CZeroMQ
import Messaging

extension IOLoop {
    struct Publisher {
        var socket: Socket
        var endpoint: Endpoint
        /// Its subscribers' connections, by descriptor (see `IOLoop+Monitor.swift`).
        var connections: [Int32: SubscriberConnection] = [:]
    }

    func bindPublisher(id: UInt64, endpoint: Endpoint, done: CheckedContinuation<Void, any Error>) {
        do {
            let socket = try openSocket(ZMQ_PUB) { socket throws(ServiceError) in
                // Subscribers only send subscription messages (topic prefixes) to a PUB socket.
                try socket.set(ZMQ_MAXMSGSIZE, Int64(64 * 1024))
                try socket.set(ZMQ_SNDHWM, Int32(clamping: configuration.publishHighWaterMark))
                try secureServer(socket, at: endpoint, publisher: true)
                // Before binding: a subscriber that reconnects at once is seen too.
                watch(socket, as: .publisher(id), events: Self.connectionEvents | Self.handshakeBroken)
                try socket.bind(endpoint)
            }
            publishers[id] = Publisher(socket: socket, endpoint: endpoint)
            done.resume()
        } catch {
            dropMonitor(.publisher(id))
            done.resume(throwing: error)
        }
    }

    func publish(id: UInt64, message: OutgoingMessage) {
        guard let publisher = publishers[id], let topic = message.topic else { return }
        // A PUB socket never blocks: it drops for subscribers whose queue is full.
        guard case .sent = publisher.socket.send(topic, more: true) else { return }
        if case .failed(let code) = publisher.socket.sendBody(message) {
            logger.warning(
                "Publishing failed", metadata: ["endpoint": "\(publisher.endpoint)", "error": "\(zmqErrorText(code))"])
        }
    }
}
