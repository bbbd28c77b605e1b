import CZeroMQ
import Foundation
import ZeroMQMessaging
import Histogram
import Synchronization

/// What a reply says, as far as the benchmark cares.
enum ReplyReading: Equatable {
    case success(uid: UUIDKey?, sessionToken: [UInt8]?)
    case error(code: String)
    case unreadable

    static func read(_ body: UnsafeRawBufferPointer, wantUID: Bool, wantToken: Bool) -> ReplyReading {
        guard let type = WireScan.stringValue(quotedKey: typeKey, in: body) else { return .unreadable }
        if WireScan.equals(type, "error") {
            let code = WireScan.stringValue(quotedKey: codeKey, in: body).map { String(decoding: $0, as: UTF8.self) }
            return .error(code: code ?? "unreadable error")
        }
        var uid: UUIDKey?
        if wantUID {
            guard let text = WireScan.stringValue(quotedKey: uidKey, in: body), let parsed = UUIDKey(parsing: text) else {
                return .unreadable
            }
            uid = parsed
        }
        var token: [UInt8]?
        if wantToken {
            guard let text = WireScan.stringValue(quotedKey: tokenKey, in: body) else { return .unreadable }
            token = Array(text)
        }
        return .success(uid: uid, sessionToken: token)
    }

    private static let typeKey = Array("\"type\"".utf8)
    private static let codeKey = Array("\"code\"".utf8)
    private static let uidKey = Array("\"uid\"".utf8)
    private static let tokenKey = Array("\"sessionToken\"".utf8)
}

/// The timed, open-loop sender of one step: a thread of its own with a DEALER socket (in a
/// libzmq context of its own) to the service under test.
///
/// Request `i` is due at `start + i × interval`; the thread sleeps until then (`clock_nanosleep`
/// on an absolute deadline, timer slack 1 µs), sends, and never waits for an answer before the
/// next one, so a slow system cannot slow the schedule down (no coordinated omission). Above
/// 5,000/s it sleeps at least ``batchWindow`` at a time and sends whatever has come due together
/// (each still timed from its own scheduled send): one wake-up per request would take the
/// generator a third of a core at 20,000/s, from the services it measures. Between
/// sends it drains whatever replies have come (`ZMQ_DONTWAIT`). Each request's bytes were built
/// before the run; only its number is written into them.
///
/// Thread safety: the configuration is immutable; the results are written only by the sender
/// thread and read by the coordinator after ``waitUntilFinished()`` (the semaphore orders them);
/// the progress counters are atomics.
final class TimedSender: @unchecked Sendable {
    struct Configuration: Sendable {
        var endpoint: String
        var firstNumber: UInt64
        var count: Int
        /// Nanoseconds between scheduled sends.
        var interval: Double
        /// Keep each reply's uid (sign-in: the intent's topic names the uid, which only the
        /// reply tells).
        var recordUIDs: Bool
        var health: MessageTemplate
        var keys: BusKeys?
    }

    enum ReplyState: UInt8 { case none, success, error }

    let configuration: Configuration
    private var templates: [MessageTemplate]

    // Results (sender thread only until finished).
    private(set) var start: UInt64 = 0
    private(set) var lastSend: UInt64 = 0
    private(set) var lag = Histogram<UInt64>(highestTrackableValue: 3_600_000_000_000, numberOfSignificantValueDigits: .three)
    private(set) var uids: [UUIDKey]
    private(set) var replies: [ReplyState]
    private(set) var errors: [String: Int] = [:]
    private(set) var unreadableReplies = 0
    private(set) var failure: String?

    // Progress, read by the coordinator while the step runs.
    let sent = Atomic<Int>(0)
    let replied = Atomic<Int>(0)
    let errorReplies = Atomic<Int>(0)
    let doneSending = Atomic<Bool>(false)
    private let stopDraining = Atomic<Bool>(false)

    private let ready = DispatchSemaphore(value: 0)
    private let go = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    private let context = ZMQContext()

    /// - Parameter templates: one template for every request, or one per request. They are
    ///   copied here, before the run, so that writing numbers into them never copies at send time.
    init(_ configuration: Configuration, templates: [MessageTemplate]) {
        precondition(templates.count == 1 || templates.count == configuration.count)
        self.configuration = configuration
        self.templates = templates.map { template in
            MessageTemplate(bytes: template.bytes.withUnsafeBufferPointer { Array($0) }, slots: template.slots)
        }
        uids = configuration.recordUIDs ? [UUIDKey](repeating: .none, count: configuration.count) : []
        replies = [ReplyState](repeating: .none, count: configuration.count)
    }

    /// Starts the thread, which connects and makes one `health` round trip; returns when that is
    /// done (or failed: see ``failure``).
    func prepare() {
        let thread = Thread { [self] in
            run()
            finished.signal()
        }
        thread.name = "bench-sender"
        thread.start()
        ready.wait()
    }

    /// Starts the timed sends (after ``prepare()``).
    func begin() {
        go.signal()
    }

    /// Stops waiting for replies that have not come.
    func stopWaitingForReplies() {
        stopDraining.store(true, ordering: .relaxed)
    }

    func waitUntilFinished() {
        finished.wait()
        context.terminate()
    }

    func scheduled(_ index: Int) -> UInt64 {
        start &+ UInt64(Double(index) * configuration.interval)
    }

    private func run() {
        let socket: ZMQSocket
        do {
            socket = try ZMQSocket(context, type: ZMQ_DEALER)
        } catch {
            failure = "\(error)"
            ready.signal()
            return
        }
        defer { socket.close() }
        do {
            socket.set(ZMQ_SNDHWM, 0)
            // Only to replicas that are connected (a standby orchestrator never is), as the bus does.
            socket.set(ZMQ_IMMEDIATE, 1)
            socket.set(ZMQ_RCVHWM, 0)
            try socket.connect(configuration.endpoint, keys: configuration.keys)
        } catch {
            failure = "\(error)"
            ready.signal()
            return
        }
        let receiver = MultipartReceiver()

        // The first round trip sets up the connection, outside the timed window. Its send waits
        // for a connected replica, up to the same 10 s.
        var health = configuration.health
        health.fill(0)
        socket.set(ZMQ_SNDTIMEO, 10_000)
        health.bytes.withUnsafeBytes { _ = socket.sendRequest(tag: Self.healthTag, body: $0) }
        socket.set(ZMQ_SNDTIMEO, -1)
        let healthDeadline = MonotonicClock.now() + 10_000_000_000
        var healthy = false
        while !healthy, MonotonicClock.now() < healthDeadline {
            wait(socket, milliseconds: 100)
            while case .message = receiver.receive(from: socket, wait: false) {
                if tag(of: receiver) == Self.healthTag { healthy = true }
            }
        }
        guard healthy else {
            failure = "no answer to health from \(configuration.endpoint) within 10 s"
            ready.signal()
            return
        }
        ready.signal()
        go.wait()

        MonotonicClock.tightenTimerSlack()
        let count = configuration.count
        let shared = templates.count == 1
        let window = configuration.interval < 200_000 ? Self.batchWindow : 0
        start = MonotonicClock.now()
        for index in 0..<count {
            let due = scheduled(index)
            drainReplies(socket, receiver)
            let before = MonotonicClock.now()
            if before < due { MonotonicClock.sleep(until: max(due, before + window)) }
            let now = MonotonicClock.now()
            lag.record(now > due ? now - due : 0)
            let slot = shared ? 0 : index
            templates[slot].fill(configuration.firstNumber + UInt64(index))
            let delivered = templates[slot].bytes.withUnsafeBytes { socket.sendRequest(tag: UInt64(index), body: $0) }
            if !delivered {
                failure = "sending request \(index) failed: \(ZMQError(what: "zmq_send", code: zmq_errno()))"
                break
            }
            sent.store(index + 1, ordering: .relaxed)
        }
        lastSend = MonotonicClock.now()
        doneSending.store(true, ordering: .releasing)
        let total = sent.load(ordering: .relaxed)
        while replied.load(ordering: .relaxed) < total, !stopDraining.load(ordering: .relaxed) {
            wait(socket, milliseconds: 10)
            drainReplies(socket, receiver)
        }
    }

    private static let healthTag = UInt64.max

    /// The shortest sleep above 5,000 requests/s, in nanoseconds.
    static let batchWindow: UInt64 = 250_000

    private func wait(_ socket: ZMQSocket, milliseconds: Int) {
        var item = zmq_pollitem_t(socket: socket.handle, fd: 0, events: Int16(ZMQ_POLLIN), revents: 0)
        _ = zmq_poll(&item, 1, milliseconds)
    }

    private func tag(of receiver: MultipartReceiver) -> UInt64? {
        let frame = receiver.frame(0)
        guard frame.count == 8 else { return nil }
        return frame.loadUnaligned(as: UInt64.self).littleEndian
    }

    private func drainReplies(_ socket: ZMQSocket, _ receiver: MultipartReceiver) {
        while case .message = receiver.receive(from: socket, wait: false) {
            guard receiver.frameCount == 3, let tag = tag(of: receiver), tag < UInt64(replies.count),
                replies[Int(tag)] == .none
            else {
                unreadableReplies += 1
                continue
            }
            let index = Int(tag)
            switch ReplyReading.read(receiver.frame(2), wantUID: configuration.recordUIDs, wantToken: false) {
            case .success(let uid, _):
                replies[index] = .success
                if let uid { uids[index] = uid }
            case .error(let code):
                replies[index] = .error
                errors[code, default: 0] += 1
                errorReplies.add(1, ordering: .relaxed)
            case .unreadable:
                replies[index] = .error
                errors["unreadableReply", default: 0] += 1
                errorReplies.add(1, ordering: .relaxed)
            }
            replied.add(1, ordering: .relaxed)
        }
    }
}
