import CZeroMQ
import Foundation
import Messaging
import ZeroMQMessaging

/// A thin layer over libzmq for the load generator: no queues, no tasks, no copies beyond
/// libzmq's own. Every socket is created, used and closed by one thread.

struct ZMQError: Error, CustomStringConvertible {
    var what: String
    var code: Int32
    var description: String { "\(what): \(String(cString: zmq_strerror(code)))" }
}

/// A libzmq context (thread-safe), with one I/O thread of its own.
final class ZMQContext: @unchecked Sendable {
    // @unchecked Sendable: libzmq contexts are thread-safe; the pointer never changes.
    let handle: UnsafeMutableRawPointer

    init() {
        guard let handle = zmq_ctx_new() else { preconditionFailure("zmq_ctx_new failed: out of file descriptors?") }
        self.handle = handle
    }

    /// Waits until every socket of the context is closed (they all have LINGER 0).
    func terminate() {
        while zmq_ctx_term(handle) != 0, zmq_errno() == EINTR {}
    }
}

/// One socket. Not thread-safe: only the thread that made it uses it.
struct ZMQSocket {
    let handle: UnsafeMutableRawPointer

    init(_ context: ZMQContext, type: Int32) throws(ZMQError) {
        guard let handle = zmq_socket(context.handle, type) else { throw ZMQError(what: "zmq_socket", code: zmq_errno()) }
        self.handle = handle
        set(ZMQ_LINGER, 0)
    }

    func set(_ option: Int32, _ value: Int32) {
        var value = value
        _ = zmq_setsockopt(handle, option, &value, MemoryLayout<Int32>.size)
    }

    /// Connects to `endpoint`, to each of its replicas when it lists several; with `keys`, as a
    /// CURVE client of the server whose key they name (as the services' bus does).
    func connect(_ endpoint: String, keys: BusKeys?) throws(ZMQError) {
        for replica in Endpoint(endpoint).replicas {
            try connectOne(replica.rawValue, keys: keys)
        }
    }

    private func connectOne(_ endpoint: String, keys: BusKeys?) throws(ZMQError) {
        if let keys, !endpoint.hasPrefix("inproc://") {
            guard let server = keys.serverKey(for: Endpoint(endpoint)) else {
                throw ZMQError(what: "no CURVE public key is known for \(endpoint)", code: EINVAL)
            }
            for (option, key) in [(ZMQ_CURVE_SERVERKEY, server), (ZMQ_CURVE_PUBLICKEY, keys.own.publicKey), (ZMQ_CURVE_SECRETKEY, keys.own.secretKey)] {
                var text = Array(key.z85.utf8)
                guard zmq_setsockopt(handle, option, &text, text.count) == 0 else {
                    throw ZMQError(what: "setting CURVE keys for \(endpoint)", code: zmq_errno())
                }
            }
        }
        guard zmq_connect(handle, endpoint) == 0 else { throw ZMQError(what: "zmq_connect \(endpoint)", code: zmq_errno()) }
    }

    func subscribe(_ prefix: String) {
        var bytes = Array(prefix.utf8)
        _ = zmq_setsockopt(handle, ZMQ_SUBSCRIBE, &bytes, bytes.count)
    }

    /// Sends one frame, blocking while the socket's queue is full; `false` on an error.
    @discardableResult
    func send(_ bytes: UnsafeRawBufferPointer, more: Bool) -> Bool {
        while true {
            if zmq_send(handle, bytes.baseAddress, bytes.count, more ? ZMQ_SNDMORE : 0) >= 0 { return true }
            if zmq_errno() != EINTR { return false }
        }
    }

    @discardableResult
    func send(_ bytes: [UInt8], more: Bool) -> Bool {
        bytes.withUnsafeBytes { send($0, more: more) }
    }

    /// Sends a DEALER request: [own routing frame (8 bytes), empty delimiter, envelope].
    @discardableResult
    func sendRequest(tag: UInt64, body: UnsafeRawBufferPointer) -> Bool {
        var tag = tag.littleEndian
        let routed = withUnsafeBytes(of: &tag) { send($0, more: true) }
        return routed && send(UnsafeRawBufferPointer(start: nil, count: 0), more: true) && send(body, more: false)
    }

    func close() {
        _ = zmq_close(handle)
    }
}

/// Receives multipart messages into reused `zmq_msg_t`s and hands out their frames in place.
///
/// Keeps the first ``capacity`` frames of a message; further frames are received into one spare
/// message and dropped (counted in ``frameCount`` only).
final class MultipartReceiver {
    static let capacity = 4
    /// `capacity` kept frames and one spare for the rest, each initialised once and reused
    /// (`zmq_msg_recv` releases what a message held before).
    private let messages: UnsafeMutablePointer<zmq_msg_t>
    /// How many frames the last message had (0 after a failed receive).
    private(set) var frameCount = 0

    init() {
        messages = .allocate(capacity: Self.capacity + 1)
        for index in 0...Self.capacity { zmq_msg_init(messages + index) }
    }

    deinit {
        for index in 0...Self.capacity { zmq_msg_close(messages + index) }
        messages.deallocate()
    }

    enum Outcome { case message, empty, failed(Int32) }

    /// Receives one whole message. `wait: false` returns `.empty` at once when none is queued;
    /// `wait: true` blocks up to the socket's `ZMQ_RCVTIMEO`. `afterFirstFrame` runs as soon as
    /// the first frame is in (for an arrival timestamp).
    func receive(from socket: ZMQSocket, wait: Bool, afterFirstFrame: () -> Void = {}) -> Outcome {
        frameCount = 0
        var more = true
        while more {
            let first = frameCount == 0
            let target = messages + min(frameCount, Self.capacity)
            if zmq_msg_recv(target, socket.handle, first && !wait ? ZMQ_DONTWAIT : 0) < 0 {
                let code = zmq_errno()
                if code == EINTR { continue }
                if first { return code == EAGAIN ? .empty : .failed(code) }
                frameCount = 0
                return .failed(code)
            }
            if first { afterFirstFrame() }
            more = zmq_msg_more(target) != 0
            frameCount += 1
        }
        return .message
    }

    /// The bytes of frame `index` of the last message (empty when it has fewer frames), valid
    /// until the next receive.
    func frame(_ index: Int) -> UnsafeRawBufferPointer {
        guard index < min(frameCount, Self.capacity) else { return UnsafeRawBufferPointer(start: nil, count: 0) }
        let message = messages + index
        return UnsafeRawBufferPointer(start: zmq_msg_data(message), count: zmq_msg_size(message))
    }
}
