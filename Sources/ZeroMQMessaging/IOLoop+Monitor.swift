import CZeroMQ
import Foundation
import Messaging

/// libzmq's socket monitors, for what the socket API does not show about connections:
///
/// - **Subscribers that do not read.** A publisher learns each subscriber's connection
///   (`ZMQ_EVENT_ACCEPTED` carries its descriptor) and once a second asks the kernel how much
///   waits unsent in that connection's send queue. A subscriber that stops reading fills it (on
///   loopback about 4 MiB) and keeps it full, while a reading one empties it within
///   milliseconds; two checks in a row at ``ZeroMQBus/Configuration/slowSubscriberBytes`` or more
///   name it in the log and count it in ``BusStatistics/slowSubscribers``. libzmq then drops
///   events for it alone once ``ZeroMQBus/Configuration/publishHighWaterMark`` are queued, so
///   what it costs is bounded and nobody else waits for it.
/// - **Failed CURVE handshakes**, logged once per endpoint and counted: a server that cannot
///   prove the key this side knows for it (a squatter on the port) in
///   ``BusStatistics/failedHandshakes``, logged once per endpoint until a handshake with it
///   succeeds; a client whose handshake breaks CURVE's protocol before the ZAP handler sees its
///   key (it has another key for this server) in ``BusStatistics/refusedHandshakes``, logged
///   once per endpoint and reason for the life of the process.
///
/// The descriptors belong to libzmq: they are only looked at (`ioctl(SIOCOUTQNSD)`,
/// `getpeername`), never read, written or closed. One that libzmq closed before its
/// `ZMQ_EVENT_DISCONNECTED` arrived reads as -1 and is forgotten.
extension IOLoop {
    /// A socket whose connections a monitor watches.
    enum Watched: Hashable {
        case publisher(UInt64)
        case server(UInt64)
        case subscriber(UInt64)
        case dealer(Endpoint)
    }

    /// One subscriber's connection to a publisher.
    struct SubscriberConnection {
        var address: String
        /// Consecutive checks that found at least `slowSubscriberBytes` in its send queue.
        var fullChecks = 0
        var slow = false
    }

    static let handshakeFailed =
        ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
    static let handshakeEvents = handshakeFailed | ZMQ_EVENT_HANDSHAKE_SUCCEEDED
    /// What a server side watches: a refusal by the ZAP handler is logged and counted there, and
    /// a connection closed before its greeting (a port probe, a health check) is no handshake.
    static let handshakeBroken = ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
    static let connectionEvents = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED

    /// How often a publisher's subscriber connections are looked at.
    static let subscriberCheckInterval: UInt64 = 1_000_000_000

    /// Starts a monitor of `events` on `socket`; handshake events only when the bus has keys.
    /// A monitor that cannot start is logged: the socket works without it, unwatched.
    func watch(_ socket: Socket, as watched: Watched, events: Int32) {
        let events = configuration.keys == nil ? events & ~Self.handshakeEvents : events
        guard events != 0 else { return }
        monitorCount += 1
        let name = "inproc://zeromq.monitor.\(monitorCount)"
        do throws(ServiceError) {
            guard zmq_socket_monitor(socket.handle, name, events) == 0 else {
                throw ServiceError(.internalError, "Cannot monitor a ZeroMQ socket: \(zmqErrorText(zmq_errno())).")
            }
            let pair = try openSocket(ZMQ_PAIR) { pair throws(ServiceError) in
                guard zmq_connect(pair.handle, name) == 0 else {
                    throw ServiceError(.internalError, "Cannot read a ZeroMQ socket monitor: \(zmqErrorText(zmq_errno())).")
                }
            }
            monitors[watched] = pair
            pollDirty = true
        } catch {
            zmq_socket_monitor(socket.handle, nil, 0)
            logger.warning("\(error.message) Slow subscribers and failed handshakes of this socket will not be shown.")
        }
    }

    /// Stops the monitor of `socket`, if it has one; call before closing the socket.
    func unwatch(_ socket: Socket, as watched: Watched) {
        guard let pair = monitors.removeValue(forKey: watched) else { return }
        zmq_socket_monitor(socket.handle, nil, 0)
        close(pair, linger: 0, what: "socket monitor")
        pollDirty = true
    }

    /// Closes the reading end of a monitor whose socket failed to open (and is closed already).
    func dropMonitor(_ watched: Watched) {
        guard let pair = monitors.removeValue(forKey: watched) else { return }
        close(pair, linger: 0, what: "socket monitor")
        pollDirty = true
    }

    /// Reads what a monitor reported. Returns whether it may have more.
    func drainMonitor(_ watched: Watched) -> Bool {
        guard let pair = monitors[watched] else { return false }
        for _ in 0..<Self.receiveBudget {
            switch pair.receive(into: &frames, scratch: scratch) {
            case .empty: return false
            case .failed(let code):
                logger.warning("Reading a socket monitor failed", metadata: ["error": "\(zmqErrorText(code))"])
                return true
            case .message:
                // [event (2 bytes) and value (4 bytes), in the machine's order; endpoint]
                guard frames.count == 2, frames[0].count == 6 else { continue }
                let event = Int32(frames[0].withUnsafeBytes { $0.loadUnaligned(as: UInt16.self) })
                let value = frames[0].withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 2, as: UInt32.self) }
                monitored(event, value: value, endpoint: String(decoding: frames[1], as: UTF8.self), on: watched)
            }
        }
        return true
    }

    private func monitored(_ event: Int32, value: UInt32, endpoint: String, on watched: Watched) {
        switch (event, watched) {
        case (ZMQ_EVENT_ACCEPTED, .publisher(let id)):
            // A descriptor is reused once closed, maybe by another publisher's connection whose
            // closing was not read yet: it now belongs to this one only.
            let fd = Int32(bitPattern: value)
            for other in Array(publishers.keys) { forget(fd, of: other, why: nil) }
            publishers[id]?.connections[fd] = SubscriberConnection(address: Self.peerAddress(fd))
            if nextSubscriberCheck == .max { nextSubscriberCheck = monotonicNanoseconds() + Self.subscriberCheckInterval }
        case (ZMQ_EVENT_DISCONNECTED, .publisher(let id)):
            forget(Int32(bitPattern: value), of: id, why: "disconnected")
        case (ZMQ_EVENT_HANDSHAKE_SUCCEEDED, _):
            if case .dealer(let endpoint) = watched { dealers[endpoint]?.handshakeFailure = nil }
            failedEndpoints.remove(endpoint)
        case (_, _) where event & Self.handshakeFailed != 0:
            handshakeFailed(event, value: value, endpoint: endpoint, on: watched)
        default:
            break
        }
    }

    // MARK: Subscribers that do not read

    /// Looks at every subscriber connection of every publisher, when a check is due.
    func checkSubscribers(now: UInt64) {
        guard now >= nextSubscriberCheck else { return }
        nextSubscriberCheck = .max
        for id in Array(publishers.keys) {
            guard var publisher = publishers[id] else { continue }
            var closed: [Int32] = []
            for (fd, var connection) in publisher.connections {
                let queued = onboarding_send_queue_bytes(fd)
                guard queued >= 0 else {
                    closed.append(fd)
                    continue
                }
                connection.fullChecks = queued >= configuration.slowSubscriberBytes ? connection.fullChecks + 1 : 0
                if connection.fullChecks >= 2, !connection.slow {
                    connection.slow = true
                    queue.count { $0.slowSubscribers += 1 }
                    let who = connection.address + followerKeys(publisher.endpoint, connection.address)
                    let what =
                        "is not reading the events of \(publisher.endpoint): \(queued / 1024) KiB wait in its connection. "
                        + "Events for it are dropped once \(configuration.publishHighWaterMark) are queued; it recovers "
                        + "them with events.after when it reads again."
                    logger.warning(
                        "The subscriber at \(who) \(what)",
                        metadata: ["subscriber": "\(connection.address)", "endpoint": "\(publisher.endpoint)"])
                } else if connection.slow, connection.fullChecks == 0 {
                    connection.slow = false
                    queue.count { $0.slowSubscribers -= 1 }
                    logger.notice(
                        "The subscriber at \(connection.address) reads the events of \(publisher.endpoint) again",
                        metadata: ["subscriber": "\(connection.address)", "endpoint": "\(publisher.endpoint)"])
                }
                publisher.connections[fd] = connection
            }
            publishers[id] = publisher
            for fd in closed { forget(fd, of: id, why: "closed") }
            if publishers[id]?.connections.isEmpty == false { nextSubscriberCheck = now + Self.subscriberCheckInterval }
        }
    }

    /// Forgets a subscriber connection (closed, or its descriptor taken by a new one).
    private func forget(_ fd: Int32, of publisher: UInt64, why: String?) {
        guard let connection = publishers[publisher]?.connections.removeValue(forKey: fd), connection.slow else { return }
        queue.count { $0.slowSubscribers -= 1 }
        if let why, let endpoint = publishers[publisher]?.endpoint {
            logger.notice("The subscriber at \(connection.address) that was not reading \(endpoint) has \(why)")
        }
    }

    /// Forgets every connection of a publisher that is closing.
    func forgetConnections(of publisher: UInt64) {
        for fd in publishers[publisher]?.connections.keys.map({ $0 }) ?? [] { forget(fd, of: publisher, why: nil) }
    }

    /// The keys the ZAP handler admitted from `address`'s host to follow `endpoint`, for a log
    /// line (a handshake names the peer's host, not its port: several names when several
    /// programs on that host follow).
    private func followerKeys(_ endpoint: Endpoint, _ address: String) -> String {
        let host = address.hasPrefix("[") ? String(address.dropFirst().prefix { $0 != "]" }) : String(address.prefix { $0 != ":" })
        guard let names = followers[Self.followDomain + endpoint.rawValue]?[host], !names.isEmpty else { return "" }
        return " (key \(names.sorted().joined(separator: " or ")))"
    }

    /// "host:port" of the peer of the connected socket `fd`; "a local process" for `ipc://`.
    static func peerAddress(_ fd: Int32) -> String {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
        var port = [CChar](repeating: 0, count: Int(NI_MAXSERV))
        let named = withUnsafeMutablePointer(to: &storage) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                getpeername(fd, address, &length) == 0 && address.pointee.sa_family != sa_family_t(AF_UNIX)
                    && getnameinfo(
                        address, length, &host, socklen_t(host.count), &port, socklen_t(port.count),
                        NI_NUMERICHOST | NI_NUMERICSERV) == 0
            }
        }
        guard named else { return "a local process" }
        let hostText = String(nulTerminated: host), portText = String(nulTerminated: port)
        return hostText.contains(":") ? "[\(hostText)]:\(portText)" : "\(hostText):\(portText)"
    }

    // MARK: Failed handshakes

    private func handshakeFailed(_ event: Int32, value: UInt32, endpoint: String, on watched: Watched) {
        let why: String
        switch watched {
        case .publisher, .server:
            queue.count { $0.refusedHandshakes += 1 }
            why = Self.handshakeReason(event, value: value, client: false)
            guard failedEndpoints.insert(endpoint + why).inserted else { return }
            logger.warning("A client failed the CURVE handshake at \(endpoint): \(why)", metadata: ["endpoint": "\(endpoint)"])
        case .subscriber, .dealer:
            queue.count { $0.failedHandshakes += 1 }
            why = Self.handshakeReason(event, value: value, client: true)
            if case .dealer(let dealer) = watched { dealers[dealer]?.handshakeFailure = why }
            guard failedEndpoints.insert(endpoint).inserted else { return }
            logger.warning(
                "The CURVE handshake with \(endpoint) failed: \(why) Nothing is sent to it; it is tried again.",
                metadata: ["endpoint": "\(endpoint)"])
        }
        if failedEndpoints.count > 10_000 { failedEndpoints.removeAll() }
    }

    /// What a failed handshake means, for the side that saw it.
    static func handshakeReason(_ event: Int32, value: UInt32, client: Bool) -> String {
        switch event {
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
            return "the server refused this process's key (ZAP status \(value)): it is not in the server's keys directory."
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL where Int32(bitPattern: value) == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return "the peer does not use CURVE (is ONBOARDING_CURVE the same on both sides?)."
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL where Int32(bitPattern: value) == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            return client
                ? "the server does not hold the secret key of the public key known for it: a squatter on the port, or a server whose key was replaced."
                : "the client's handshake does not open with this server's key: it has another public key for this server."
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return "a ZMTP protocol error (0x\(String(value, radix: 16)))."
        default:
            // Seen by callers only (servers watch protocol failures alone).
            return "the server closed the connection during the handshake: it does not hold the secret key of the public key known for it (a squatter on the port, or a server whose key was replaced), or it does not admit this process's key."
        }
    }
}
