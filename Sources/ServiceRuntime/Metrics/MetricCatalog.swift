import Messaging
import OnboardingAPI

/// Every metric the programs export, declared once: its name, kind, labels and meaning. The
/// Prometheus endpoint takes each one's help text from here, and the README's metrics table is
/// made from it (a test keeps the two equal).
///
/// Labels never carry a uid, a username or a token: only request and event types (from the set
/// a program registered), error codes, and fixed words.
public struct MetricDefinition: Sendable, Hashable {
    public enum Kind: String, Sendable {
        case counter, gauge, histogram
    }

    public let name: String
    public let kind: Kind
    public let labels: [String]
    /// Which programs export it.
    public let exportedBy: String
    public let help: String

    init(_ name: String, _ kind: Kind, labels: [String] = [], by exportedBy: String, _ help: String) {
        self.name = name
        self.kind = kind
        self.labels = labels
        self.exportedBy = exportedBy
        self.help = help
    }
}

extension MetricDefinition {
    // MARK: Requests (every service; the gateway has its own below)

    public static let requests = MetricDefinition(
        "onboarding_requests_total", .counter, labels: ["type", "outcome"], by: "auth, profile, image-upload, orchestrator",
        "Requests answered, by type and outcome (ok, or the error code of the reply).")
    public static let requestDuration = MetricDefinition(
        "onboarding_request_duration_seconds", .histogram, labels: ["type", "outcome"],
        by: "auth, profile, image-upload, orchestrator",
        "Time from a request's arrival on the bus to its reply, by type and outcome (ok or error).")

    // MARK: Events and storage

    public static let eventsPublished = MetricDefinition(
        "onboarding_events_published_total", .counter, labels: ["type"], by: "auth, profile, orchestrator",
        "Events committed to the outbox and published, by type (route intents as route.intent).")
    public static let transactions = MetricDefinition(
        "onboarding_db_transactions_total", .counter, labels: ["result"], by: "auth, profile, orchestrator",
        "Write transactions of a batch: requests on the bus's thread (SQLite), or the orchestrator's decisions; by result: commit or rollback.")
    public static let transactionDuration = MetricDefinition(
        "onboarding_db_transaction_duration_seconds", .histogram, by: "auth, profile, orchestrator",
        "Time one of those transactions took, from its start to its commit or rollback.")
    public static let batchSize = MetricDefinition(
        "onboarding_batch_size", .histogram, labels: ["kind"], by: "auth, profile, orchestrator",
        "Requests handled together in one transaction (kind=requests), or the orchestrator's inputs (kind=events: events, checks, profile answers).")
    public static let walCheckpoints = MetricDefinition(
        "onboarding_wal_checkpoints_total", .counter, labels: ["result"], by: "auth, profile, orchestrator (SQLite)",
        "Checkpoints of SQLite's write-ahead log (every 50 ms, off the hot path), by result: ok or failed.")
    public static let walBytes = MetricDefinition(
        "onboarding_wal_bytes", .gauge, by: "auth, profile, orchestrator (SQLite)",
        "What SQLite's write-ahead log held at the last checkpoint that worked, in bytes.")
    public static let outboxRows = MetricDefinition(
        "onboarding_outbox_rows", .gauge, by: "auth, profile, orchestrator",
        "Events kept in the outbox for events.after (pruned after the retention).")
    public static let outboxOldest = MetricDefinition(
        "onboarding_outbox_oldest_event_age_seconds", .gauge, by: "auth, profile, orchestrator",
        "Age of the oldest event still in the outbox (0 when empty).")
    public static let outboxRetention = MetricDefinition(
        "onboarding_outbox_retention_seconds", .gauge, by: "auth, profile, orchestrator",
        "How long events are kept for events.after (ONBOARDING_EVENT_RETENTION_HOURS).")

    // MARK: The orchestrator

    public static let feedLagEvents = MetricDefinition(
        "onboarding_feed_lag_events", .gauge, labels: ["publisher"], by: "orchestrator",
        "Events the publisher is known to have recorded that the orchestrator has not handled yet.")
    public static let feedLagSeconds = MetricDefinition(
        "onboarding_feed_lag_seconds", .gauge, labels: ["publisher"], by: "orchestrator",
        "While events wait: how long ago the last event handled was committed, an upper bound on the delay (0 when caught up).")
    public static let decisions = MetricDefinition(
        "onboarding_decisions_total", .counter, labels: ["intent", "reason"], by: "orchestrator",
        "Route intents decided and committed, by intent and reason.")
    public static let signInToIntent = MetricDefinition(
        "onboarding_sign_in_to_intent_seconds", .histogram, by: "orchestrator",
        "From auth's commit of a sign-in to the orchestrator's commit of its route intent (1 ms resolution).")
    public static let cleanUps = MetricDefinition(
        "onboarding_withdrawal_cleanups_total", .counter, labels: ["step", "outcome"], by: "orchestrator",
        "Withdrawal clean-up steps (deleteProfile, deleteImages) by outcome: ok, or failed (retried with backoff).")

    // MARK: The gateway

    public static let httpRequests = MetricDefinition(
        "onboarding_gateway_http_requests_total", .counter, labels: ["route", "method", "status"], by: "gateway",
        "HTTP requests answered, by route template (unmatched for none), method and status code.")
    public static let httpDuration = MetricDefinition(
        "onboarding_gateway_http_request_duration_seconds", .histogram, labels: ["route", "method"], by: "gateway",
        "Time to answer an HTTP request, to the start of the response (a stream's first bytes).")
    public static let intentStreams = MetricDefinition(
        "onboarding_gateway_intent_streams", .gauge, by: "gateway", "Intent streams open (GET /v1/me/intents).")
    public static let rateLimited = MetricDefinition(
        "onboarding_gateway_rate_limited_total", .counter, labels: ["limit"], by: "gateway",
        "Requests refused with 429, by limit: sign_in or username_check.")

    // MARK: Read when scraped (the bus's counts, the service's health reply, /proc)

    /// The bus's own counts (``BusStatistics``), each a counter `onboarding_bus_<name>_total`.
    public static let busCounts: [(definition: MetricDefinition, value: @Sendable (BusStatistics) -> Int)] = [
        bus("dropped_events", "Events a subscriber's queue had no room for.", \.droppedEvents),
        bus("unreadable_events", "Events that arrived but could not be read.", \.unreadableEvents),
        bus("overloaded_requests", "Requests refused because the server's queue was full.", \.overloadedRequests),
        bus("rejected_requests", "Requests refused because they could not be read or broke a limit.", \.rejectedRequests),
        bus("late_replies", "Replies that arrived after their caller had given up.", \.lateReplies),
        bus("refused_handshakes", "Connections refused: an unknown CURVE key, or a failed handshake.", \.refusedHandshakes),
        bus("failed_handshakes", "Connections to servers that failed the CURVE handshake.", \.failedHandshakes),
        bus("dropped_replies", "Replies dropped because their caller was not reading them.", \.droppedReplies),
    ]

    private static func bus(_ name: String, _ help: String, _ value: @escaping @Sendable (BusStatistics) -> Int)
        -> (MetricDefinition, @Sendable (BusStatistics) -> Int)
    {
        (MetricDefinition("onboarding_bus_\(name)_total", .counter, by: "every program", help), value)
    }

    public static let slowSubscribers = MetricDefinition(
        "onboarding_bus_slow_subscribers", .gauge, by: "every program", "Subscribers of this process that are not reading now.")

    /// The orchestrator's feeds (from its health reply), one series per publisher.
    public static let feedCounts: [(definition: MetricDefinition, value: @Sendable (FeedStatistics) -> Int)] = [
        feed("handled", "Events handled from a publisher, live or replayed.", \.handled),
        feed("replayed", "Events fetched with events.after because the live stream skipped them.", \.replayed),
        feed("duplicates_dropped", "Events received again after they had been handled, and dropped.", \.duplicatesDropped),
        feed("lost", "Events the publisher pruned before they could be fetched.", \.lost),
    ]

    private static func feed(_ name: String, _ help: String, _ value: @escaping @Sendable (FeedStatistics) -> Int)
        -> (MetricDefinition, @Sendable (FeedStatistics) -> Int)
    {
        (MetricDefinition("onboarding_feed_\(name)_total", .counter, labels: ["publisher"], by: "orchestrator", help), value)
    }

    public static let unlinkPending = MetricDefinition(
        "onboarding_unlink_pending_jobs", .gauge, by: "auth", "Withdrawn accounts still to be unlinked at their provider.")
    public static let unlinkOldest = MetricDefinition(
        "onboarding_unlink_oldest_pending_seconds", .gauge, by: "auth", "How long the oldest unlink job has waited (0 when none waits).")

    // As Prometheus's client libraries name them.
    public static let processCPU = MetricDefinition(
        "process_cpu_seconds_total", .counter, by: "every program", "Total user and system CPU time spent in seconds.")
    public static let processResident = MetricDefinition(
        "process_resident_memory_bytes", .gauge, by: "every program", "Resident memory size in bytes.")
    public static let processDescriptors = MetricDefinition(
        "process_open_fds", .gauge, by: "every program", "Number of open file descriptors.")
    public static let processStart = MetricDefinition(
        "process_start_time_seconds", .gauge, by: "every program", "Start time of the process since unix epoch in seconds.")

    /// Every metric, in the order the README lists them.
    public static let all: [MetricDefinition] =
        [
            requests, requestDuration, eventsPublished, transactions, transactionDuration, batchSize, walCheckpoints, walBytes,
            outboxRows, outboxOldest, outboxRetention,
            feedLagEvents, feedLagSeconds,
        ] + feedCounts.map(\.definition)
        + [decisions, signInToIntent, cleanUps, unlinkPending, unlinkOldest]
        + [httpRequests, httpDuration, intentStreams, rateLimited]
        + busCounts.map(\.definition) + [slowSubscribers, processCPU, processResident, processDescriptors, processStart]

    /// The help text of the metric called `name`, or `nil` for one not declared here.
    public static func help(for name: String) -> String? {
        byName[name]?.help
    }

    private static let byName: [String: MetricDefinition] = Dictionary(uniqueKeysWithValues: all.map { ($0.name, $0) })
}

/// The buckets every duration histogram uses: 100 µs to 10 s, about three a decade.
public let durationBuckets: [Duration] = [
    .microseconds(100), .microseconds(250), .microseconds(500),
    .milliseconds(1), .microseconds(2500), .milliseconds(5),
    .milliseconds(10), .milliseconds(25), .milliseconds(50),
    .milliseconds(100), .milliseconds(250), .milliseconds(500),
    .seconds(1), .milliseconds(2500), .seconds(5), .seconds(10),
]

/// The buckets of ``MetricDefinition/batchSize``.
public let batchSizeBuckets: [Double] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]

extension MetricDefinition {
    /// The README's metrics table: every metric, its type, labels, who exports it and what it means.
    public static func markdownTable() -> String {
        var lines = ["| metric | type | labels | exported by | meaning |", "|---|---|---|---|---|"]
        for metric in all {
            let labels = metric.labels.isEmpty ? "–" : metric.labels.map { "`\($0)`" }.joined(separator: ", ")
            lines.append("| `\(metric.name)` | \(metric.kind.rawValue) | \(labels) | \(metric.exportedBy) | \(metric.help) |")
        }
        return lines.joined(separator: "\n") + "\n"
    }
}
