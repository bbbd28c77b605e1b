import CZeroMQ
import Foundation
import ZeroMQMessaging
import Synchronization

/// One route intent as it arrived: whose, which, and when (monotonic nanoseconds, read as soon
/// as its first frame was in).
struct Arrival: Sendable {
    var uid: UUIDKey
    var intent: ObservedIntent
    var time: UInt64
}

/// The route subscriber: a thread of its own with a SUB socket on `route.` (every person's
/// intents), in a libzmq context of its own. It timestamps each intent, reads its uid from the
/// topic and its intent and reason from the envelope, and keeps it for the coordinator, which
/// takes what has arrived whenever it likes.
final class IntentReceiver: Sendable {
    private struct State {
        var arrivals: [Arrival] = []
        var counts = [Int](repeating: 0, count: ObservedIntent.allCases.count)
        var unreadable = 0
        var failure: String?
    }

    private let state = Mutex(State())
    private let stopping = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)
    private let ready = DispatchSemaphore(value: 0)
    private let context = ZMQContext()
    let endpoint: String

    let keys: BusKeys?

    init(endpoint: String, keys: BusKeys?) {
        self.endpoint = endpoint
        self.keys = keys
    }

    /// Starts the thread and returns once its socket has connected and subscribed (which does
    /// not yet mean the subscription has reached the publisher: see ``BenchRun/waitForLiveRoutes``).
    func start() throws {
        let thread = Thread { [self] in
            run()
            finished.signal()
        }
        thread.name = "bench-routes"
        thread.start()
        ready.wait()
        if let failure = state.withLock({ $0.failure }) { throw BenchError(failure) }
    }

    func stop() {
        stopping.store(true, ordering: .relaxed)
        finished.wait()
        context.terminate()
    }

    /// Everything that arrived since the last call, oldest first.
    func take() -> [Arrival] {
        state.withLock { state in
            defer { state.arrivals = [] }
            return state.arrivals
        }
    }

    /// How many intents of each kind have arrived since the start (a cheap progress check).
    func count(_ intent: ObservedIntent) -> Int {
        state.withLock { $0.counts[Int(intent.rawValue)] }
    }

    var unreadable: Int { state.withLock { $0.unreadable } }

    private func run() {
        let socket: ZMQSocket
        do {
            socket = try ZMQSocket(context, type: ZMQ_SUB)
        } catch {
            state.withLock { $0.failure = "cannot subscribe to \(endpoint): \(error)" }
            ready.signal()
            return
        }
        do {
            // Never drop on our side; the publisher's own queue per subscriber still has its
            // high-water mark (libzmq's default 1,000), so this thread must keep up.
            socket.set(ZMQ_RCVHWM, 0)
            socket.set(ZMQ_RCVTIMEO, 100)
            socket.subscribe("route.")
            try socket.connect(endpoint, keys: keys)
        } catch {
            // Closed, or terminating the context in `stop` would wait for it forever.
            socket.close()
            state.withLock { $0.failure = "cannot subscribe to \(endpoint): \(error)" }
            ready.signal()
            return
        }
        ready.signal()
        defer { socket.close() }
        let receiver = MultipartReceiver()
        let prefix = Array("route.".utf8)
        var time: UInt64 = 0
        while !stopping.load(ordering: .relaxed) {
            switch receiver.receive(from: socket, wait: true, afterFirstFrame: { time = MonotonicClock.now() }) {
            case .empty:
                continue
            case .failed(let code):
                if code == EAGAIN || code == EINTR { continue }
                state.withLock { $0.failure = "receiving route intents failed: \(ZMQError(what: "zmq_msg_recv", code: code))" }
                return
            case .message:
                let topic = receiver.frame(0)
                let body = receiver.frame(1)
                guard receiver.frameCount == 2, topic.count > prefix.count, topic.starts(with: prefix),
                    let uid = UUIDKey(parsing: UnsafeRawBufferPointer(rebasing: topic[prefix.count...]))
                else {
                    state.withLock { $0.unreadable += 1 }
                    continue
                }
                let intent = ObservedIntent(
                    intent: WireScan.stringValue(quotedKey: Self.intentKey, in: body),
                    reason: WireScan.stringValue(quotedKey: Self.reasonKey, in: body))
                let arrival = Arrival(uid: uid, intent: intent, time: time)
                state.withLock { state in
                    state.arrivals.append(arrival)
                    state.counts[Int(intent.rawValue)] += 1
                }
            }
        }
    }

    private static let intentKey = Array("\"intent\"".utf8)
    private static let reasonKey = Array("\"reason\"".utf8)
}

struct BenchError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
