import Foundation
import Logging
import Messaging
import OnboardingAPI
import ServiceLifecycle
import ServiceRuntime
import Synchronization
import Testing

/// Held until the test lets it go.
struct Hold: APIRequest {
    typealias Response = Acknowledged
    static let type = "test.hold"
}

/// Answered at once.
struct Quick: APIRequest {
    typealias Response = Acknowledged
    static let type = "test.quick"
}

/// Holds handlers until released, and counts how many run at once.
final class Gate: Sendable {
    private struct State {
        var open = false
        var running = 0
        var most = 0
        var held: [CheckedContinuation<Void, Never>] = []
        var arrivals: [(count: Int, continuation: CheckedContinuation<Void, Never>)] = []
    }
    private let state = Mutex(State())

    var mostAtOnce: Int { state.withLock { $0.most } }

    func pass() async {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> [CheckedContinuation<Void, Never>]? in
                if state.open { return nil }
                state.running += 1
                state.most = max(state.most, state.running)
                state.held.append(continuation)
                let ready = state.arrivals.filter { $0.count <= state.running }.map(\.continuation)
                state.arrivals.removeAll { $0.count <= state.running }
                return ready
            }
            guard let ready else { return continuation.resume() }
            for waiter in ready { waiter.resume() }
        }
        state.withLock { $0.running = max(0, $0.running - 1) }
    }

    /// Lets every held handler go, and every later one straight through.
    func open() {
        state.withLock { $0.open = true }
        releaseAll()
    }

    /// Waits until `count` handlers are held.
    func waitUntilHolding(_ count: Int) async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Bool in
                if state.running >= count { return true }
                state.arrivals.append((count, continuation))
                return false
            }
            if now { continuation.resume() }
        }
    }

    func releaseAll() {
        let held = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            defer { state.held = [] }
            return state.held
        }
        for continuation in held { continuation.resume() }
    }
}

@Suite("Request server")
struct RequestServerTests {
    let bus = InProcessBus()
    let endpoint: Endpoint = "inproc://server-under-test"

    func server(gate: Gate, maxInFlight: Int, queueLimit: Int, maxAttachmentsInFlight: Int? = nil) -> RequestServer {
        var dispatcher = RequestDispatcher(source: "test-server", sessions: nil, serviceToken: nil, logger: quietLogger)
        dispatcher.on(Hold.self, access: .open, attachment: .optional) { _, _ in
            await gate.pass()
            return Acknowledged()
        }
        dispatcher.on(Quick.self, access: .open) { _, _ in Acknowledged() }
        return RequestServer(
            bus: bus, endpoint: endpoint, limits: MessageLimits(maxAttachmentBytes: 1024, queueLimit: queueLimit), dispatcher: dispatcher,
            logger: quietLogger, maxInFlight: maxInFlight, maxAttachmentsInFlight: maxAttachmentsInFlight)
    }

    func call<R: APIRequest>(_ request: R, attachment: Data? = nil) async -> ErrorCode? {
        do {
            _ = try await bus.call(request, to: endpoint, source: "test", attachment: attachment, timeout: .seconds(10))
            return nil
        } catch let error as ServiceError {
            return error.code
        } catch {
            return .internalError
        }
    }

    @Test("no more than maxInFlight handlers run at once; past the queue, callers are told overloaded")
    func backPressure() async throws {
        let gate = Gate()
        let group = ServiceGroup(services: [server(gate: gate, maxInFlight: 1, queueLimit: 1)], logger: quietLogger)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            try await bus.waitUntilAnswering(endpoint, source: "test")
            let outcomes = await withTaskGroup(of: ErrorCode?.self) { calls in
                calls.addTask { await call(Hold()) }
                await gate.waitUntilHolding(1)
                for _ in 0..<5 { calls.addTask { await call(Hold()) } }
                // One runs, one waits for a slot, one waits in the queue: the rest are refused at
                // once. Once three refusals are back, let everything through.
                var outcomes: [ErrorCode?] = []
                for await outcome in calls {
                    outcomes.append(outcome)
                    if outcomes.filter({ $0 == .overloaded }).count >= 3 { gate.open() }
                }
                return outcomes
            }
            #expect(gate.mostAtOnce == 1)
            #expect(outcomes.filter { $0 == .overloaded }.count >= 3, "\(outcomes)")
            #expect(outcomes.allSatisfy { $0 == nil || $0 == .overloaded }, "\(outcomes)")
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
        }
    }

    @Test("requests with a binary frame are held to their own limit; the others run beyond it", .timeLimit(.minutes(1)))
    func attachmentLimit() async throws {
        let gate = Gate()
        let group = ServiceGroup(
            services: [server(gate: gate, maxInFlight: 8, queueLimit: 1, maxAttachmentsInFlight: 1)], logger: quietLogger)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            try await bus.waitUntilAnswering(endpoint, source: "test")
            // Four without a frame run at once, though only one with a frame may.
            let light = await withTaskGroup(of: ErrorCode?.self) { calls in
                // One at a time: the queue holds one.
                for held in 1...4 {
                    calls.addTask { await call(Hold()) }
                    await gate.waitUntilHolding(held)
                }
                gate.releaseAll()
                return await calls.reduce(into: [ErrorCode?]()) { $0.append($1) }
            }
            #expect(light.allSatisfy { $0 == nil }, "\(light)")
            #expect(gate.mostAtOnce == 4)
            // With frames: one runs, one waits for its slot, one in the queue, the rest refused.
            let outcomes = await withTaskGroup(of: ErrorCode?.self) { calls in
                calls.addTask { await call(Hold(), attachment: Data([1])) }
                await gate.waitUntilHolding(1)
                for _ in 0..<5 { calls.addTask { await call(Hold(), attachment: Data([1])) } }
                var outcomes: [ErrorCode?] = []
                for await outcome in calls {
                    outcomes.append(outcome)
                    if outcomes.filter({ $0 == .overloaded }).count >= 3 { gate.open() }
                }
                return outcomes
            }
            #expect(outcomes.filter { $0 == .overloaded }.count >= 3, "\(outcomes)")
            #expect(outcomes.allSatisfy { $0 == nil || $0 == .overloaded }, "\(outcomes)")
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
        }
    }

    @Test("on graceful shutdown new requests get shuttingDown, those in flight get their replies, then the endpoint is gone")
    func draining() async throws {
        let gate = Gate()
        let group = ServiceGroup(services: [server(gate: gate, maxInFlight: 8, queueLimit: 64)], logger: quietLogger)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            try await bus.waitUntilAnswering(endpoint, source: "test")
            async let held = call(Hold())
            await gate.waitUntilHolding(1)
            await group.triggerGracefulShutdown()

            // Draining begins as the shutdown reaches the server; from then on: shuttingDown.
            var refused = false
            for _ in 0..<10_000 where !refused {
                refused = await call(Quick()) == .shuttingDown
            }
            #expect(refused, "a request during draining is refused with shuttingDown")

            gate.open()
            #expect(await held == nil, "the request in flight got its reply")
            try await tasks.waitForAll()
            #expect(await call(Quick()) == .noResponder, "once drained, the endpoint is unbound")
        }
    }

    @Test("services starting at once on one data directory agree on one service token, readable by the owner only")
    func serviceTokenFile() async throws {
        try await withTemporaryDirectory { directory in
            let tokens = try await withThrowingTaskGroup(of: String.self) { group in
                for _ in 0..<16 {
                    group.addTask { try ServiceTokenFile(directory: directory).readOrCreate() }
                }
                return try await group.reduce(into: Set<String>()) { $0.insert($1) }
            }
            #expect(tokens.count == 1)
            #expect(tokens.first?.count == 64)
            let file = ServiceTokenFile(directory: directory)
            let permissions = try FileManager.default.attributesOfItem(atPath: file.path)[.posixPermissions] as? Int
            #expect(permissions == 0o600)
            #expect(try file.readOrCreate() == tokens.first)
            let leftovers = try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasSuffix(".tmp") }
            #expect(leftovers.isEmpty)
        }
    }
}
