import CZeroMQ
import Messaging

/// When the loop stops: every socket and the context closed, and everyone still waiting told.
extension IOLoop {
    func tearDown() {
        for id in Array(publishers.keys) { forgetConnections(of: id) }
        // A monitor stops with the socket it watches; its reading end closes here.
        for monitor in monitors.values { close(monitor, linger: 0, what: "socket monitor") }
        monitors = [:]
        for publisher in publishers.values {
            close(publisher.socket, linger: Self.flushLinger, what: "publisher at \(publisher.endpoint)")
        }
        for subscriber in subscribers.values { close(subscriber.socket, linger: 0, what: "subscriber") }
        for server in servers.values { close(server.socket, linger: Self.flushLinger, what: "server at \(server.endpoint)") }
        for server in retiring { close(server.socket, linger: Self.flushLinger, what: "server at \(server.endpoint)") }
        retiring = []
        for (endpoint, dealer) in dealers { close(dealer.socket, linger: 0, what: "requester for \(endpoint)") }
        if let zap { close(zap, linger: 0, what: "ZAP handler") }
        zap = nil
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
