import CoreMetrics
import Foundation
import Messaging
import OnboardingAPI

/// An ``EventPublisher`` that counts what it publishes, by event type
/// (``MetricDefinition/eventsPublished``). Route intents, whose topic names the person, count
/// as `route.intent`.
///
/// Thread safety: immutable; the counters are atomic. Nothing is locked or made per event.
public struct CountingPublisher: EventPublisher {
    private let publisher: any EventPublisher
    private let byTopic: [String: Counter]
    private let intents: Counter
    private let other: Counter

    /// - Parameter types: the event types this publisher publishes (their topics are their types).
    public init(_ publisher: any EventPublisher, types: [any APIEvent.Type], factory: any MetricsFactory = MetricsSystem.factory) {
        func counter(_ type: String) -> Counter {
            Counter(label: MetricDefinition.eventsPublished.name, dimensions: [("type", type)], factory: factory)
        }
        self.publisher = publisher
        byTopic = Dictionary(uniqueKeysWithValues: types.map { ($0.type, counter($0.type)) })
        intents = counter(RouteIntent.type)
        other = counter("other")
    }

    public var endpoint: Endpoint { publisher.endpoint }

    public func publish(_ message: OutgoingMessage) throws {
        try publisher.publish(message)
        guard let topic = message.topic else { return }
        (byTopic[topic] ?? (topic.hasPrefix(Topics.routePrefix) ? intents : other)).increment()
    }

    public func close() {
        publisher.close()
    }
}

/// The hot path's write transactions and batch sizes (``MetricDefinition/transactions``,
/// ``MetricDefinition/transactionDuration``, ``MetricDefinition/batchSize``), one set per
/// process, made from the process's metrics factory when first used.
public enum StoreFigures {
    static let committed = Counter(label: MetricDefinition.transactions.name, dimensions: [("result", "commit")])
    static let rolledBack = Counter(label: MetricDefinition.transactions.name, dimensions: [("result", "rollback")])
    static let duration = CoreMetrics.Timer(label: MetricDefinition.transactionDuration.name)
    static let requestBatches = Recorder(label: MetricDefinition.batchSize.name, dimensions: [("kind", "requests")])
    static let eventBatches = Recorder(label: MetricDefinition.batchSize.name, dimensions: [("kind", "events")])

    /// Counts a write transaction that began at `started`: committed, or rolled back.
    public static func transaction(committed: Bool, since started: ContinuousClock.Instant) {
        (committed ? Self.committed : rolledBack).increment()
        duration.recordNanoseconds(started.duration(to: .now).nanoseconds)
    }

    /// Records how many requests one transaction handled together.
    public static func requestBatch(_ size: Int) { requestBatches.record(size) }

    /// Records how many events one transaction handled together.
    public static func eventBatch(_ size: Int) { eventBatches.record(size) }

    static let checkpointed = Counter(label: MetricDefinition.walCheckpoints.name, dimensions: [("result", "ok")])
    static let checkpointFailed = Counter(label: MetricDefinition.walCheckpoints.name, dimensions: [("result", "failed")])
    static let walBytes = Gauge(label: MetricDefinition.walBytes.name)

    /// Counts a checkpoint of the write-ahead log, which held `bytes` when it succeeded.
    static func checkpoint(succeeded bytes: Int?) {
        guard let bytes else { return checkpointFailed.increment() }
        checkpointed.increment()
        walBytes.record(bytes)
    }
}

/// The outbox's size, age and retention, as the retention loop last found them
/// (``MetricDefinition/outboxRows``, ``MetricDefinition/outboxOldest``,
/// ``MetricDefinition/outboxRetention``).
public struct OutboxShape: Sendable, Hashable {
    /// Events kept.
    public var rows: Int
    /// When the oldest kept event was committed (`nil`: none kept).
    public var oldest: Date?

    public init(rows: Int, oldest: Date?) {
        self.rows = rows
        self.oldest = oldest
    }
}

/// The gauges of ``OutboxShape``, one set per process.
enum OutboxFigures {
    static let rows = Gauge(label: MetricDefinition.outboxRows.name)
    static let oldest = Gauge(label: MetricDefinition.outboxOldest.name)
    static let retention = Gauge(label: MetricDefinition.outboxRetention.name)

    static func record(_ shape: OutboxShape, retention: Outbox.Retention, now: Date = Date()) {
        rows.record(shape.rows)
        oldest.record(shape.oldest.map { max(0, now.timeIntervalSince($0)) } ?? 0)
        let (seconds, attoseconds) = retention.maxAge.components
        Self.retention.record(Double(seconds) + Double(attoseconds) / 1e18)
    }
}
