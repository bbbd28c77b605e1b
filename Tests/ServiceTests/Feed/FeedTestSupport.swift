import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime
import Synchronization
import Testing

/// A value that changes while a test runs, and a way to wait until it satisfies a condition
/// (failing with `timeout` instead of hanging).
final class Observed<Value: Sendable>: Sendable {
    private struct Waiter {
        var predicate: @Sendable (Value) -> Bool
        var continuation: CheckedContinuation<Value, any Error>
    }

    private struct State {
        var value: Value
        var waiters: [UInt64: Waiter] = [:]
        var lastID: UInt64 = 0
        var expired: Set<UInt64> = []
    }

    private let state: Mutex<State>

    init(_ value: Value) {
        state = Mutex(State(value: value))
    }

    var value: Value { state.withLock { $0.value } }

    func update(_ change: (inout Value) -> Void) {
        let ready = state.withLock { state -> [(CheckedContinuation<Value, any Error>, Value)] in
            change(&state.value)
            let value = state.value
            let ready = state.waiters.filter { $0.value.predicate(value) }
            for id in ready.keys { state.waiters[id] = nil }
            return ready.values.map { ($0.continuation, value) }
        }
        for (continuation, value) in ready { continuation.resume(returning: value) }
    }

    /// Waits until `predicate` holds for the value (at once if it already does).
    @discardableResult
    func wait(
        timeout: Duration = .seconds(30), until predicate: @escaping @Sendable (Value) -> Bool
    ) async throws -> Value {
        let id = state.withLock { state in
            state.lastID += 1
            return state.lastID
        }
        let timer = Task {
            guard (try? await Task.sleep(for: timeout)) != nil else { return }
            let waiter = self.state.withLock { state -> Waiter? in
                state.expired.insert(id)
                defer { state.waiters[id] = nil }
                return state.waiters[id]
            }
            waiter?.continuation.resume(throwing: ServiceError(.timeout, "The condition did not hold within \(timeout)."))
        }
        defer { timer.cancel() }
        return try await withCheckedThrowingContinuation { continuation in
            let now = state.withLock { state -> Result<Value, any Error>? in
                if predicate(state.value) { return .success(state.value) }
                if state.expired.contains(id) {
                    return .failure(ServiceError(.timeout, "The condition did not hold within \(timeout)."))
                }
                state.waiters[id] = Waiter(predicate: predicate, continuation: continuation)
                return nil
            }
            if let now { continuation.resume(with: now) }
        }
    }
}

/// A ``MessageBus`` that passes everything to an ``InProcessBus`` and counts how requests end.
final class ObservedBus: MessageBus {
    struct Requests: Sendable {
        var succeeded = 0
        var failed = 0
    }

    let inner: InProcessBus
    let requests = Observed(Requests())

    init(_ inner: InProcessBus = InProcessBus()) {
        self.inner = inner
    }

    var statistics: BusStatistics { inner.statistics }

    func publisher(at endpoint: Endpoint) async throws -> any EventPublisher {
        try await inner.publisher(at: endpoint)
    }

    func subscribe(to endpoints: [Endpoint], topics: [String], limits: MessageLimits) async throws -> AsyncStream<Message> {
        try await inner.subscribe(to: endpoints, topics: topics, limits: limits)
    }

    func serve(at endpoint: Endpoint, limits: MessageLimits) async throws -> AsyncStream<IncomingRequest> {
        try await inner.serve(at: endpoint, limits: limits)
    }

    func serve(
        at endpoint: Endpoint, limits: MessageLimits, onLoop handler: @escaping @Sendable ([RawRequest]) -> Void
    ) async throws -> any BusLoopRegistration {
        try await inner.serve(at: endpoint, limits: limits, onLoop: handler)
    }

    func subscribe(
        to endpoints: [Endpoint], topics: [String], limits: MessageLimits,
        onLoop handler: @escaping @Sendable ([RawEvent]) -> Void
    ) async throws -> any BusLoopRegistration {
        try await inner.subscribe(to: endpoints, topics: topics, limits: limits, onLoop: handler)
    }

    func perform(onLoop job: @escaping @Sendable () -> Void) -> Bool {
        inner.perform(onLoop: job)
    }

    func request(
        _ message: OutgoingMessage, to endpoint: Endpoint, timeout: Duration,
        onLoop callback: @escaping @Sendable (Result<Message, ServiceError>) -> Void
    ) {
        inner.request(message, to: endpoint, timeout: timeout) { [requests] result in
            let succeeded = if case .success(let reply) = result { reply.serviceError == nil } else { false }
            requests.update { succeeded ? ($0.succeeded += 1) : ($0.failed += 1) }
            callback(result)
        }
    }

    func request(_ message: OutgoingMessage, to endpoint: Endpoint, timeout: Duration) async throws -> Message {
        do {
            let reply = try await inner.request(message, to: endpoint, timeout: timeout)
            requests.update { reply.serviceError == nil ? ($0.succeeded += 1) : ($0.failed += 1) }
            return reply
        } catch {
            requests.update { $0.failed += 1 }
            throw error
        }
    }
}

/// A publisher with an outbox, as auth and profile have: SQLite records every event, the bus
/// carries it live, and `events.after` serves the record.
struct OutboxPublisher {
    static let events: Endpoint = "inproc://feed-events"
    static let rpc: Endpoint = "inproc://feed-rpc"

    let bus: any MessageBus
    let writer: any DatabaseWriter
    let publisher: any EventPublisher
    /// Records and publishes.
    let outbox: Outbox
    /// Records without publishing: a live message that got lost.
    let silentOutbox: Outbox

    /// Opens a fresh outbox database in `directory` and binds the publisher.
    static func make(bus: any MessageBus, directory: String) async throws -> OutboxPublisher {
        let writer = try ServiceDatabase.open(path: "\(directory)/outbox.sqlite")
        var migrator = DatabaseMigrator()
        Outbox.registerMigration(in: &migrator)
        try migrator.migrate(writer)
        let publisher = try await bus.publisher(at: events)
        return OutboxPublisher(
            bus: bus, writer: writer, publisher: publisher,
            outbox: Outbox(source: "publisher", publisher: publisher),
            silentOutbox: Outbox(source: "publisher", publisher: SilentPublisher(endpoint: events)))
    }

    /// The same publisher with new outboxes, as after a restart: they read the numbering from
    /// the store again.
    func restarted() -> OutboxPublisher {
        OutboxPublisher(
            bus: bus, writer: writer, publisher: publisher,
            outbox: Outbox(source: "publisher", publisher: publisher),
            silentOutbox: Outbox(source: "publisher", publisher: SilentPublisher(endpoint: Self.events)))
    }

    /// Records one event on `topic` (published live unless `live` is false).
    ///
    /// - Returns: its sequence number.
    @discardableResult
    func append(_ topic: String = SignedOut.type, live: Bool = true) async throws -> UInt64 {
        let outbox = live ? self.outbox : silentOutbox
        return try await writer.write { db in
            try outbox.append(SignedOut(uid: "someone"), uid: "someone", topic: topic, in: db)
        }
    }

    /// Publishes recorded event `sequence` live again, as a duplicate.
    func republish(_ sequence: UInt64) async throws {
        let page = try await writer.read { db in try Outbox.events(after: sequence - 1, limit: 1, in: db) }
        let event = try #require(page.events.first)
        try publisher.publish(OutgoingMessage(topic: event.topic, body: Data(event.envelope.utf8)))
    }

    /// Answers `events.after` at ``rpc`` for the length of `body`.
    func serving<Result: Sendable>(serviceToken: String? = nil, _ body: () async throws -> Result) async throws -> Result {
        var dispatcher = RequestDispatcher(source: "publisher", sessions: nil, serviceToken: serviceToken, logger: quietLogger)
        dispatcher.onEventsAfter(database: writer)
        let server = RequestServer(bus: bus, endpoint: Self.rpc, dispatcher: dispatcher, logger: quietLogger)
        return try await withRunningService(server, on: bus, answeringAt: Self.rpc, body)
    }
}

/// Publishes nothing.
struct SilentPublisher: EventPublisher {
    let endpoint: Endpoint
    func publish(_ message: OutgoingMessage) throws {}
    func close() {}
}

/// What a feed handed to its handler; it can be told to fail the first few batches.
final class FeedRecorder: Sendable {
    struct Batch: Sendable, Equatable, CustomStringConvertible {
        var sequences: [UInt64]
        var through: UInt64
        var description: String { "\(sequences) through \(through)" }
    }

    struct HandlerFailure: Error {}

    /// Every call, failed ones included.
    let calls = Observed<[Batch]>([])
    private let failuresLeft: Mutex<Int>

    init(failFirst failures: Int = 0) {
        failuresLeft = Mutex(failures)
    }

    func handle(_ batch: [Message], through: UInt64) throws {
        let call = Batch(sequences: batch.map(\.header.sequence), through: through)
        let fail = failuresLeft.withLock { left in
            defer { left = max(0, left - 1) }
            return left > 0
        }
        calls.update { $0.append(call) }
        if fail { throw HandlerFailure() }
    }

    /// Waits until a call has covered `sequence`.
    func waitUntilHandled(through sequence: UInt64) async throws {
        try await calls.wait { $0.last.map { $0.through >= sequence } ?? false }
    }

    /// The sequences handed over, in order (successful calls only when no call failed).
    var delivered: [UInt64] { calls.value.flatMap(\.sequences) }
}

/// How a feed hands over live events: from its task only, or on the bus's thread as well.
enum FeedMode: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case task
    case loop
    var testDescription: String { rawValue }
}

/// Runs `feed` from `cursor` in a task for the length of `body`, then cancels it and waits.
@discardableResult
func withFeed<Result: Sendable>(
    _ feed: EventFeed, after cursor: UInt64 = 0, recorder: FeedRecorder, mode: FeedMode = .task,
    _ body: () async throws -> Result
) async throws -> Result {
    let onLoop: EventFeed.LoopHandler?
    if mode == .loop {
        onLoop = { @Sendable batch, through in try recorder.handle(batch, through: through) }
    } else {
        onLoop = nil
    }
    let task = Task {
        await feed.run(after: cursor, onLoop: onLoop) { batch, through in try recorder.handle(batch, through: through) }
    }
    do {
        let result = try await body()
        task.cancel()
        await task.value
        return result
    } catch {
        task.cancel()
        await task.value
        throw error
    }
}

/// A feed on `bus` following an ``OutboxPublisher``, with short waits for tests.
func makeFeed(
    bus: any MessageBus, topics: [String] = [""], idleCheck: Duration = .seconds(60),
    reorderWait: Duration = .milliseconds(20), logger: Logger = quietLogger
) -> EventFeed {
    EventFeed(
        bus: bus, events: OutboxPublisher.events, replay: OutboxPublisher.rpc, topics: topics, source: "test",
        serviceToken: nil, idleCheck: idleCheck, reorderWait: reorderWait, callTimeout: .seconds(2),
        retry: RetryPolicy(initial: .milliseconds(5), maximum: .milliseconds(40)), logger: logger)
}
