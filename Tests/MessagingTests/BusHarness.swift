import Foundation
import Logging
import Messaging
import Synchronization
import Testing
import ZeroMQMessaging

/// The buses the contract suite runs against.
enum BusKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case inProcess
    case zeroMQ
    /// ZeroMQ with CURVE: every socket encrypted, the server admitting the client's key.
    case zeroMQCurve

    var testDescription: String { rawValue }

    func makeHarness() -> Harness {
        switch self {
        case .inProcess:
            // With ZeroMQ's slow joiner: a subscription takes effect a moment after it returns,
            // so no test here can rely on what only the stub would deliver.
            let bus = InProcessBus(source: "bus", joinDelay: .milliseconds(20))
            return Harness(kind: self, server: bus, client: bus)
        case .zeroMQ, .zeroMQCurve:
            var logger = Logger(label: "test.zmq")
            logger.logLevel = .warning
            // Two buses, like two processes: one binds, the other connects. The client waits
            // longer for a connection than in production, so a machine loaded by the tests that
            // run beside these does not turn a slow connect into `noResponder`.
            var patient = ZeroMQBus.Configuration()
            patient.connectGrace = .seconds(3)
            var server = ZeroMQBus.Configuration()
            if self == .zeroMQCurve {
                let keys = TestKeys.shared
                server.keys = BusKeys(
                    identity: "server", own: keys.server, servers: [:], otherServers: keys.server.publicKey,
                    clients: [keys.client.publicKey: "client", keys.server.publicKey: "server"])
                patient.keys = BusKeys(
                    identity: "client", own: keys.client, servers: [:], otherServers: keys.server.publicKey, clients: [:])
            }
            return Harness(
                kind: self,
                server: ZeroMQBus(source: "bus", logger: logger, configuration: server),
                client: ZeroMQBus(source: "client", logger: logger, configuration: patient))
        }
    }
}

/// One server and one client key pair for the whole test run.
enum TestKeys {
    static let shared: (server: CurveKeyPair, client: CurveKeyPair) = {
        do {
            return (try CurveKeyPair.generate(), try CurveKeyPair.generate())
        } catch {
            fatalError("libzmq cannot make CURVE keys: \(error)")
        }
    }()
}

/// Runs `body` with a fresh pair of buses and tears them down afterwards, even when it throws.
func withHarness(_ kind: BusKind, _ body: (Harness) async throws -> Void) async throws {
    let harness = kind.makeHarness()
    do {
        try await body(harness)
    } catch {
        await harness.tearDown()
        throw error
    }
    await harness.tearDown()
}

/// A server side and a client side. For the in-process bus both are the same bus.
///
/// Threading: any task.
final class Harness: Sendable {
    let kind: BusKind
    /// Binds servers and publishers.
    let server: any MessageBus
    /// Sends requests and subscribes.
    let client: any MessageBus
    private let tasks = Mutex<[Task<Void, Never>]>([])

    init(kind: BusKind, server: any MessageBus, client: any MessageBus) {
        self.kind = kind
        self.server = server
        self.client = client
    }

    /// Binds a server at a fresh endpoint (retrying on `addressInUse`) and returns its requests.
    func bindServer(limits: MessageLimits = MessageLimits()) async throws -> (Endpoint, AsyncStream<IncomingRequest>) {
        try await bindRetrying { endpoint in try await self.server.serve(at: endpoint, limits: limits) }
    }

    /// Binds a server that runs `handler` for each request until `stop` is called on the task.
    func startServer(
        limits: MessageLimits = MessageLimits(), handler: @escaping @Sendable (IncomingRequest) async -> Void
    ) async throws -> (Endpoint, Task<Void, Never>) {
        let (endpoint, requests) = try await bindServer(limits: limits)
        let task = Task {
            for await request in requests { await handler(request) }
        }
        tasks.withLock { $0.append(task) }
        return (endpoint, task)
    }

    func bindPublisher() async throws -> any EventPublisher {
        try await bindRetrying { endpoint in try await self.server.publisher(at: endpoint) }.1
    }

    func tearDown() async {
        let tasks = self.tasks.withLock { $0 }
        for task in tasks { task.cancel() }
        for task in tasks { await task.value }
        for bus in [server, client] {
            if let bus = bus as? ZeroMQBus { await bus.shutdown() }
        }
    }
}

/// Fresh loopback endpoints: a random base per test run, then a counter.
enum Endpoints {
    // Below Linux's ephemeral range (32768 and up), where an outgoing connection could already
    // hold the port; 26000 and up belongs to the system tests.
    private static let next = Atomic<Int>(Int.random(in: 20_000..<25_000))

    static func fresh() -> Endpoint {
        let port = next.wrappingAdd(1, ordering: .relaxed).newValue
        return Endpoint("tcp://127.0.0.1:\(port)")
    }
}

/// Tries fresh endpoints until one is free.
func bindRetrying<T>(_ bind: (Endpoint) async throws -> T) async throws -> (Endpoint, T) {
    var attempts = 0
    while true {
        let endpoint = Endpoints.fresh()
        do {
            return (endpoint, try await bind(endpoint))
        } catch let error as ServiceError where error.code == .addressInUse && attempts < 20 {
            attempts += 1
        }
    }
}

// MARK: Messages

struct Echo: Codable, Sendable, Hashable {
    var text: String
    var number: Int = 0
}

func echoRequest(_ text: String, number: Int = 0, attachment: Data? = nil, version: Int = EnvelopeHeader.currentVersion)
    throws -> OutgoingMessage
{
    let header = EnvelopeHeader(version: version, type: "test.echo", source: "tests")
    return try OutgoingMessage(Envelope(header: header, payload: Echo(text: text, number: number)), attachment: attachment)
}

func event(_ topic: String, type: String = "test.event", text: String = "") throws -> OutgoingMessage {
    try OutgoingMessage(topic: topic, Envelope(header: EnvelopeHeader(type: type, source: "tests"), payload: Echo(text: text)))
}

/// Answers each request with its own payload and attachment.
let echoHandler: @Sendable (IncomingRequest) async -> Void = { request in
    do throws(ServiceError) {
        let payload = try request.message.payload(as: Echo.self)
        request.reply(type: "test.echoed", source: "server", payload: payload, attachment: request.message.attachment)
    } catch {
        request.fail(error, source: "server")
    }
}

/// The ``ServiceError`` that `body` throws, or `nil` (recording an issue) when it throws
/// something else or nothing.
func serviceError<T>(
    sourceLocation: SourceLocation = #_sourceLocation, _ body: () async throws -> T
) async -> ServiceError? {
    do {
        _ = try await body()
        Issue.record("Expected a ServiceError, but the call succeeded", sourceLocation: sourceLocation)
    } catch let error as ServiceError {
        return error
    } catch {
        Issue.record("Expected a ServiceError, got \(error)", sourceLocation: sourceLocation)
    }
    return nil
}

// MARK: Waiting for things

/// ZeroMQ's "slow joiner": a fresh subscriber misses what is published before its connection
/// is up. Publishes a probe on every publisher (topic `probeTopic`, which the subscription must
/// match) until the subscriber has received one from each, then returns; later probes still in
/// flight are recognisable by type ``probeType``.
func waitUntilJoined(
    _ events: inout AsyncStream<Message>.Iterator, publishers: [any EventPublisher], probeTopic: String
) async throws {
    let prober = Task {
        let deadline = ContinuousClock.now + .seconds(20)
        while !Task.isCancelled, ContinuousClock.now < deadline {
            for publisher in publishers {
                try? publisher.publish(event(probeTopic, type: probeType, text: publisher.endpoint.rawValue))
            }
            try? await Task.sleep(for: .milliseconds(10))
        }
    }
    defer { prober.cancel() }
    var unseen = Set(publishers.map(\.endpoint.rawValue))
    while !unseen.isEmpty {
        guard let message = await events.next() else {
            Issue.record("The subscription ended before every publisher was joined")
            return
        }
        if message.header.type == probeType {
            unseen.remove(try message.payload(as: Echo.self).text)
        }
    }
}

let probeType = "test.probe"

/// The next event that is not a probe.
func nextEvent(_ events: inout AsyncStream<Message>.Iterator) async -> Message? {
    while let message = await events.next() {
        if message.header.type != probeType { return message }
    }
    return nil
}

/// Waits (bounded) until `condition` holds, checking every few milliseconds.
func eventually(
    within limit: Duration = .seconds(5), sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: () -> Bool
) async {
    let deadline = ContinuousClock.now + limit
    while !condition() {
        if ContinuousClock.now > deadline {
            Issue.record("Condition not met within \(limit)", sourceLocation: sourceLocation)
            return
        }
        try? await Task.sleep(for: .milliseconds(5))
    }
}
