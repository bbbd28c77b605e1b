import CZeroMQ
import Foundation
import Messaging

/// Thin helpers over a raw libzmq socket handle.
///
/// Threading: I/O thread only. A `Socket` value is just the handle; whoever holds it must be the
/// socket's owning thread.
struct Socket {
    let handle: UnsafeMutableRawPointer

    enum SendResult {
        case sent
        /// `EAGAIN`: no peer can take the message now.
        case wouldBlock
        case failed(Int32)
    }

    enum ReceiveResult {
        case message
        case empty
        case failed(Int32)
    }

    /// The file descriptor libzmq signals when the socket's mailbox has something to process
    /// (`ZMQ_FD`): readable does not mean a message is waiting; ask ``events()``.
    func notificationFD() -> Int32 {
        var fd: Int32 = -1
        var size = MemoryLayout<Int32>.size
        _ = zmq_getsockopt(handle, ZMQ_FD, &fd, &size)
        return fd
    }

    /// `ZMQ_EVENTS`: whether a message can be received (`ZMQ_POLLIN`) or sent (`ZMQ_POLLOUT`) now.
    /// Processes the socket's pending commands, which resets ``notificationFD()``.
    func events() -> Int32 {
        var events: Int32 = 0
        var size = MemoryLayout<Int32>.size
        guard zmq_getsockopt(handle, ZMQ_EVENTS, &events, &size) == 0 else { return 0 }
        return events
    }

    /// Sets an integer option.
    ///
    /// - Throws: ``ServiceError`` with `internalError`, naming the option and libzmq's reason.
    func set(_ option: Int32, _ value: Int32) throws(ServiceError) {
        var value = value
        if zmq_setsockopt(handle, option, &value, MemoryLayout<Int32>.size) != 0 {
            throw optionError(option, zmq_errno())
        }
    }

    /// Sets a 64-bit integer option (such as `ZMQ_MAXMSGSIZE`).
    func set(_ option: Int32, _ value: Int64) throws(ServiceError) {
        var value = value
        if zmq_setsockopt(handle, option, &value, MemoryLayout<Int64>.size) != 0 {
            throw optionError(option, zmq_errno())
        }
    }

    /// Sets a text option (a Z85 key, a ZAP domain).
    func set(_ option: Int32, text: String) throws(ServiceError) {
        var text = text
        let rc = text.withUTF8 { bytes in zmq_setsockopt(handle, option, bytes.baseAddress, bytes.count) }
        if rc != 0 { throw optionError(option, zmq_errno()) }
    }

    /// Subscribes a SUB socket to the topics starting with `prefix`.
    func subscribe(_ prefix: String) throws(ServiceError) {
        var prefix = prefix
        let rc = prefix.withUTF8 { bytes in
            zmq_setsockopt(handle, ZMQ_SUBSCRIBE, bytes.baseAddress, bytes.count)
        }
        if rc != 0 { throw optionError(ZMQ_SUBSCRIBE, zmq_errno()) }
    }

    func bind(_ endpoint: Endpoint) throws(ServiceError) {
        guard !endpoint.isList else { throw ServiceError.cannotBindList(endpoint) }
        if zmq_bind(handle, endpoint.rawValue) != 0 {
            throw endpointError(zmq_errno(), endpoint: endpoint, binding: true)
        }
    }

    func connect(_ endpoint: Endpoint) throws(ServiceError) {
        if zmq_connect(handle, endpoint.rawValue) != 0 {
            throw endpointError(zmq_errno(), endpoint: endpoint, binding: false)
        }
    }

    private func optionError(_ option: Int32, _ code: Int32) -> ServiceError {
        ServiceError(
            .internalError, "Cannot set \(socketOptionName(option)) on a ZeroMQ socket: \(zmqErrorText(code)).")
    }

    /// Sends one frame without blocking.
    func send(_ data: Data, more: Bool) -> SendResult {
        let flags = ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)
        let rc = data.withUnsafeBytes { zmq_send(handle, $0.baseAddress, $0.count, flags) }
        return rc >= 0 ? .sent : Self.failure()
    }

    func send(_ text: String, more: Bool) -> SendResult {
        var text = text
        let flags = ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)
        let rc = text.withUTF8 { zmq_send(handle, $0.baseAddress, $0.count, flags) }
        return rc >= 0 ? .sent : Self.failure()
    }

    func send(_ id: UInt64, more: Bool) -> SendResult {
        let flags = ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)
        let rc = withUnsafeBytes(of: id.littleEndian) { zmq_send(handle, $0.baseAddress, $0.count, flags) }
        return rc >= 0 ? .sent : Self.failure()
    }

    /// Sends the envelope frame and the attachment frame, if any, as the last parts of a message
    /// whose first parts were sent already. Later parts of a message never block.
    func sendBody(_ message: OutgoingMessage) -> SendResult {
        guard let attachment = message.attachment else { return send(message.body, more: false) }
        let first = send(message.body, more: true)
        guard case .sent = first else { return first }
        return send(attachment, more: false)
    }

    /// Receives one whole message into `frames` without blocking, reusing `scratch`.
    ///
    /// Returns `.empty` on `EAGAIN`. Parts of a multipart message arrive together, so once the
    /// first part is in, the rest are too.
    func receive(into frames: inout [Data], scratch: UnsafeMutablePointer<zmq_msg_t>) -> ReceiveResult {
        var caller: String?
        return receive(into: &frames, scratch: scratch, caller: &caller, readCaller: false)
    }

    /// ``receive(into:scratch:)``, also reading the `User-Id` the ZAP handler gave the sender's
    /// connection (the name of its CURVE key) when `readCaller` is set.
    func receive(
        into frames: inout [Data], scratch: UnsafeMutablePointer<zmq_msg_t>, caller: inout String?, readCaller: Bool
    ) -> ReceiveResult {
        frames.removeAll(keepingCapacity: true)
        if readCaller { caller = nil }
        while true {
            if zmq_msg_recv(scratch, handle, ZMQ_DONTWAIT) < 0 {
                let code = zmq_errno()
                if code == EINTR { continue }
                if code == EAGAIN, frames.isEmpty { return .empty }
                return .failed(code)
            }
            let size = zmq_msg_size(scratch)
            // A ROUTER makes the first frame (the sender's routing id) itself, without the
            // connection's properties: they come with the frames that crossed the wire.
            if readCaller, caller == nil, !frames.isEmpty {
                caller = zmq_msg_gets(scratch, "User-Id").map { String(cString: $0) }.flatMap { $0.isEmpty ? nil : $0 }
            }
            frames.append(size == 0 ? Data() : Data(bytes: zmq_msg_data(scratch), count: size))
            if zmq_msg_more(scratch) == 0 { return .message }
        }
    }

    /// Sets `ZMQ_LINGER` to `linger` milliseconds, then closes the socket (always, even when
    /// setting the linger failed; that failure is thrown afterwards for the caller to log).
    ///
    /// With a linger above 0, messages already queued (replies, events) keep being sent for up
    /// to that long in libzmq's own threads, and `zmq_ctx_term` waits for them as long.
    func close(linger: Int32) throws(ServiceError) {
        var failure: ServiceError?
        do { try set(ZMQ_LINGER, linger) } catch { failure = error }
        zmq_close(handle)
        if let failure { throw failure }
    }

    private static func failure() -> SendResult {
        let code = zmq_errno()
        return code == EAGAIN ? .wouldBlock : .failed(code)
    }
}

func zmqErrorText(_ code: Int32) -> String {
    String(cString: zmq_strerror(code))
}

/// The name of a socket option this bus sets, for error messages.
func socketOptionName(_ option: Int32) -> String {
    switch option {
    case ZMQ_LINGER: "ZMQ_LINGER"
    case ZMQ_MAXMSGSIZE: "ZMQ_MAXMSGSIZE"
    case ZMQ_ROUTER_MANDATORY: "ZMQ_ROUTER_MANDATORY"
    case ZMQ_SNDHWM: "ZMQ_SNDHWM"
    case ZMQ_RCVHWM: "ZMQ_RCVHWM"
    case ZMQ_IMMEDIATE: "ZMQ_IMMEDIATE"
    case ZMQ_SUBSCRIBE: "ZMQ_SUBSCRIBE"
    case ZMQ_CURVE_SERVER: "ZMQ_CURVE_SERVER"
    case ZMQ_CURVE_SECRETKEY: "ZMQ_CURVE_SECRETKEY"
    case ZMQ_CURVE_PUBLICKEY: "ZMQ_CURVE_PUBLICKEY"
    case ZMQ_CURVE_SERVERKEY: "ZMQ_CURVE_SERVERKEY"
    case ZMQ_ZAP_DOMAIN: "ZMQ_ZAP_DOMAIN"
    default: "socket option \(option)"
    }
}

/// The ``ServiceError`` for a failed `zmq_bind` or `zmq_connect`.
func endpointError(_ code: Int32, endpoint: Endpoint, binding: Bool) -> ServiceError {
    let verb = binding ? "bind" : "connect to"
    switch code {
    case EADDRINUSE:
        return ServiceError(
            .addressInUse,
            "Something is already bound at \(endpoint). Stop the other process or choose another port.")
    case EINVAL, EPROTONOSUPPORT, EADDRNOTAVAIL, ENODEV, ENOENT, ENOCOMPATPROTO_:
        return ServiceError(
            .invalidEndpoint,
            "Cannot \(verb) \(endpoint) (\(zmqErrorText(code))). Use tcp://HOST:PORT with an address of "
                + "this machine, ipc://PATH or inproc://NAME.")
    default:
        return ServiceError(.internalError, "Cannot \(verb) \(endpoint): \(zmqErrorText(code)).")
    }
}

/// `ENOCOMPATPROTO` is an arithmetic macro that Swift does not import.
private let ENOCOMPATPROTO_: Int32 = 156_384_712 + 52
