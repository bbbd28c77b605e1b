import CZeroMQ
import Foundation
import Messaging

/// CURVE on every socket that crosses a process boundary, and the ZAP handler that admits
/// clients by their public key (RFC 27). Without ``ZeroMQBus/Configuration/keys`` nothing here
/// runs and the sockets are plain.
extension IOLoop {
    /// Where libzmq asks a context's ZAP handler.
    static let zapEndpoint = "inproc://zeromq.zap.01"

    /// Whether `endpoint` crosses a process boundary (only those are encrypted: `inproc://`
    /// never leaves the process).
    static func isSecured(_ endpoint: Endpoint) -> Bool {
        !endpoint.rawValue.hasPrefix("inproc://")
    }

    /// Binds the ZAP handler's socket, before any server socket exists. Called once, at start.
    func startZAPHandler() throws(ServiceError) -> Socket? {
        guard let keys = configuration.keys else { return nil }
        admitted = keys.clients
        keysStamp = keys.directory.flatMap(Self.modificationTime)
        return try openSocket(ZMQ_REP) { socket throws(ServiceError) in
            guard zmq_bind(socket.handle, Self.zapEndpoint) == 0 else {
                throw ServiceError(.internalError, "Cannot start the ZAP handler: \(zmqErrorText(zmq_errno())).")
            }
        }
    }

    /// The ZAP domain of a publisher: the handler checks its subscribers against
    /// ``BusKeys/mayFollow``.
    static let followDomain = "follow:"
    /// The ZAP domain of a request server: every known key may connect (each request's rights
    /// are checked by the service, which knows the request).
    static let callDomain = "call:"

    /// Makes `socket` (a ROUTER or PUB about to bind `endpoint`) a CURVE server with this
    /// process's key pair; its clients are checked by the ZAP handler.
    func secureServer(_ socket: Socket, at endpoint: Endpoint, publisher: Bool) throws(ServiceError) {
        guard let keys = configuration.keys, Self.isSecured(endpoint) else { return }
        if let zapFailure { throw zapFailure }
        try socket.set(ZMQ_CURVE_SERVER, Int32(1))
        try socket.set(ZMQ_CURVE_SECRETKEY, text: keys.own.secretKey.z85)
        try socket.set(ZMQ_ZAP_DOMAIN, text: (publisher ? Self.followDomain : Self.callDomain) + endpoint.rawValue)
    }

    /// Makes the next connection of `socket` (a DEALER or SUB) a CURVE client of the server at
    /// `endpoint`, whose public key must be known: a process without that server's secret key
    /// cannot complete the handshake.
    func secureClient(_ socket: Socket, to endpoint: Endpoint) throws(ServiceError) {
        guard let keys = configuration.keys, Self.isSecured(endpoint) else { return }
        guard let serverKey = keys.serverKey(for: endpoint) else {
            throw ServiceError(
                .invalidEndpoint,
                "No CURVE public key is known for the server at \(endpoint): \(source) connects only to servers "
                    + "whose key it has. Check the endpoint settings and the keys directory.")
        }
        try socket.set(ZMQ_CURVE_SERVERKEY, text: serverKey.z85)
        try socket.set(ZMQ_CURVE_PUBLICKEY, text: keys.own.publicKey.z85)
        try socket.set(ZMQ_CURVE_SECRETKEY, text: keys.own.secretKey.z85)
    }

    /// Answers every waiting ZAP request: admitted when the client's public key is known, with
    /// its identity as the user id; refused otherwise, logged once per address and key.
    /// Returns whether the socket may have more to read.
    func drainZAP(_ socket: Socket) -> Bool {
        guard let keys = configuration.keys else { return false }
        for _ in 0..<Self.receiveBudget {
            switch socket.receive(into: &frames, scratch: scratch) {
            case .empty: return false
            case .failed(let code):
                logger.warning("Receiving a ZAP request failed", metadata: ["error": "\(zmqErrorText(code))"])
                return true
            case .message:
                let request = frames
                // [version, request id, domain, address, routing id, mechanism, credentials...]
                guard request.count >= 6 else { continue }
                let version = request[0], requestID = request[1]
                let domain = String(decoding: request[2], as: UTF8.self)
                let address = String(decoding: request[3], as: UTF8.self)
                let mechanism = String(decoding: request[5], as: UTF8.self)
                let key = request.count >= 7 ? CurveKey(bytes: request[6]) : nil
                refreshAdmittedKeys()
                var identity = key.flatMap { admitted[$0] }
                if let known = identity, domain.hasPrefix(Self.followDomain),
                    !keys.mayFollow(known, Endpoint(String(domain.dropFirst(Self.followDomain.count))))
                {
                    identity = nil
                    refused(address: address, key: key, domain: domain, why: "the key of \(known) may not follow this publisher")
                } else if identity == nil {
                    refused(
                        address: address, key: key, domain: domain,
                        why: key == nil ? "it offered no CURVE key (\(mechanism))" : "its key is not in the keys directory")
                } else if let known = identity, domain.hasPrefix(Self.followDomain) {
                    // A slow subscriber's log line names the keys that follow from its host.
                    if followers.count > 1_000 { followers.removeAll() }
                    followers[domain, default: [:]][address, default: []].insert(known)
                }
                let reply: [Data] = [
                    version, requestID, Data((identity == nil ? "400" : "200").utf8),
                    Data((identity == nil ? "unknown key" : "OK").utf8), Data((identity ?? "").utf8), Data(),
                ]
                for (index, frame) in reply.enumerated() {
                    _ = socket.send(frame, more: index < reply.count - 1)
                }
                // A send may take the notification of the next request: ask the socket again
                // before the loop waits.
                touched(.zap)
            }
        }
        return true
    }

    /// Reads the keys directory's public keys again when the directory has changed since they
    /// were read: a key added or removed there (a replacement during a rollover) is admitted or
    /// refused from the next handshake on, without a restart. A directory that cannot be read
    /// keeps the keys read before, and says so.
    private func refreshAdmittedKeys() {
        guard let directory = configuration.keys?.directory, let stamp = Self.modificationTime(directory) else { return }
        if let keysStamp, keysStamp.tv_sec == stamp.tv_sec, keysStamp.tv_nsec == stamp.tv_nsec { return }
        do {
            let clients = try BusKeys.clients(in: directory)
            let (added, removed) = (Set(clients.keys).subtracting(admitted.keys).count, Set(admitted.keys).subtracting(clients.keys).count)
            admitted = clients
            keysStamp = stamp
            logger.notice("The keys directory changed: \(added) key(s) added, \(removed) removed", metadata: ["directory": "\(directory)"])
        } catch {
            logger.error("The keys directory changed but cannot be read (\(error)); the keys read before still hold")
        }
    }

    /// When `path` last changed (`st_mtim`), or `nil` when it cannot be looked at.
    static func modificationTime(_ path: String) -> timespec? {
        var status = stat()
        guard stat(path, &status) == 0 else { return nil }
        return status.st_mtim
    }

    /// Logs a refused client once per address and key, and counts every refusal.
    private func refused(address: String, key: CurveKey?, domain: String, why: String) {
        queue.count { $0.refusedHandshakes += 1 }
        let fingerprint = key?.fingerprint ?? "none"
        guard refusedPeers.insert("\(address) \(fingerprint) \(domain)").inserted else { return }
        if refusedPeers.count > 10_000 { refusedPeers.removeAll() }
        let endpoint = domain.drop { $0 != ":" }.dropFirst()
        logger.warning(
            "Refused a connection to \(endpoint) from \(address) (key \(fingerprint)): \(why)",
            metadata: ["address": "\(address)", "key": "\(fingerprint)"])
    }
}
