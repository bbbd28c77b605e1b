import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import Synchronization

/// A transactional outbox: an event is written in the same transaction as the change it reports,
/// and published once that transaction commits.
///
/// Each event's sequence number is its row id in the `outbox` table, and it only grows: numbers are
/// never reused, even after old rows are pruned (pruning records the newest number it removed in
/// `outboxFloor`, which the numbering starts above). Events are
/// published in commit order from the database's writer, so subscribers see sequence numbers
/// in order, and the table is the record to replay from.
///
/// Thread safety: immutable after `init`; `append` runs inside a write transaction.
public final class Outbox: Sendable {
    public let source: String
    private let publisher: any EventPublisher
    /// The events of the transaction under way, published together when it commits. One
    /// transaction at a time writes (SQLite has one writer), so one list serves them all; one
    /// observer per transaction, however many events it records (GRDB consults every observer
    /// on every statement).
    private let unpublished = Mutex(Unpublished())
    /// The number after this outbox's last committed event, while the file has not changed since.
    private let nextAfterCommit = KeptSinceCommit<UInt64>()

    private struct Unpublished {
        var messages: [OutgoingMessage] = []
        var observing = false
        /// The next sequence number in the transaction under way, once its first event has read it.
        var next: UInt64?
    }

    public init(source: String, publisher: any EventPublisher) {
        self.source = source
        self.publisher = publisher
    }

    /// Registers the `outbox` table's migration.
    public static func registerMigration(in migrator: inout DatabaseMigrator) {
        migrator.registerMigration("outbox-v1") { db in
            try db.create(table: "outbox") { table in
                table.autoIncrementedPrimaryKey("sequence")
                table.column("type", .text).notNull()
                table.column("topic", .text).notNull()
                table.column("uid", .text)
                table.column("envelope", .blob).notNull()
                table.column("createdAt", .text).notNull()
            }
        }
        migrator.registerMigration("outbox-v2-floor") { db in
            // Without AUTOINCREMENT: SQLite then rewrote its `sqlite_sequence` row in every
            // transaction that recorded an event, one more page written per commit. What that row
            // guarded (no number used twice once old events are pruned) is kept by `outboxFloor`,
            // which only pruning writes.
            try db.execute(
                sql: """
                    CREATE TABLE outbox_v2 (
                      sequence INTEGER PRIMARY KEY,
                      type TEXT NOT NULL,
                      topic TEXT NOT NULL,
                      uid TEXT,
                      envelope BLOB NOT NULL,
                      createdAt TEXT NOT NULL);
                    INSERT INTO outbox_v2 (sequence, type, topic, uid, envelope, createdAt)
                      SELECT sequence, type, topic, uid, envelope, createdAt FROM outbox;
                    CREATE TABLE outboxFloor (id INTEGER PRIMARY KEY CHECK (id = 1), sequence INTEGER NOT NULL);
                    INSERT INTO outboxFloor (id, sequence) SELECT 1, seq FROM sqlite_sequence WHERE name = 'outbox';
                    DROP TABLE outbox;
                    ALTER TABLE outbox_v2 RENAME TO outbox;
                    """)
        }
    }

    /// Records `event` in the current transaction and publishes it after commit.
    ///
    /// - Parameter time: the envelope's `time` (now, when `nil`).
    /// - Returns: the event's sequence number.
    @discardableResult
    public func append<Event: APIEvent>(
        _ event: Event, uid: String?, correlationId: String? = nil, topic: String? = nil, time: String? = nil,
        in db: Database
    ) throws -> UInt64 {
        let topic = topic ?? Event.type
        let time = time ?? Timestamp.now()
        // The next number, known before the insert, so the row is written once with its final
        // envelope: one above the largest number ever used, pruned rows included
        // (``lastSequence(in:)``). Later events of the same transaction count on from it, as
        // nobody else can write meanwhile. From one transaction to the next it is kept only while
        // the database file has not changed since this outbox's commit (``KeptSinceCommit``: any
        // other commit, another outbox's, pruning's, another connection's or process's, moves
        // SQLite's data version); otherwise the transaction's first event reads it (a seek to
        // each table's last row), as it does after a rollback or a restart.
        func insert(_ sequence: UInt64) throws -> Data {
            var header = EnvelopeHeader(
                type: Event.type, source: source, sequence: sequence, time: time, correlationId: correlationId, uid: uid)
            Traces.inject(into: &header)
            let body = try Envelope(header: header, payload: event).encoded()
            try db.executeHot("INSERT INTO outbox (sequence, type, topic, uid, envelope, createdAt) VALUES (?, ?, ?, ?, ?, ?)") {
                $0.bind(Int64(clamping: sequence))
                $0.bind(Event.type)
                $0.bind(topic)
                $0.bind(uid)
                $0.bind(body)
                $0.bind(time)
            }
            return body
        }
        let sequence = try unpublished.withLock({ $0.next }) ?? nextAfterCommit.value(in: db) ?? Self.lastSequence(in: db) + 1
        let body = try insert(sequence)
        let firstOfTransaction = unpublished.withLock { unpublished in
            unpublished.messages.append(OutgoingMessage(topic: topic, body: body))
            unpublished.next = sequence + 1
            defer { unpublished.observing = true }
            return !unpublished.observing
        }
        if firstOfTransaction {
            db.afterNextTransaction(
                onCommit: { [self] db in
                    let (messages, next) = takeUnpublished()
                    // Publishing only queues each message for the bus's I/O thread; it never blocks.
                    for message in messages { try? publisher.publish(message) }
                    if let next { nextAfterCommit.keep(next, committedIn: db) } else { nextAfterCommit.forget() }
                },
                onRollback: { [self] _ in
                    _ = takeUnpublished()
                    nextAfterCommit.forget()
                })
        }
        return sequence
    }
}

extension Outbox {
    /// The events of the transaction that just ended, and the number that follows them.
    private func takeUnpublished() -> (messages: [OutgoingMessage], next: UInt64?) {
        unpublished.withLock { unpublished in
            defer { unpublished = Unpublished() }
            return (unpublished.messages, unpublished.next)
        }
    }
}

// MARK: - Replay

extension Outbox {
    /// The page size of `events.after` when the request gives no `limit`.
    public static let defaultPageSize = 500

    /// The events recorded after `sequence`, oldest first: at most `limit` of them (by default
    /// ``defaultPageSize``, never more than ``EventsAfter/maximumLimit``).
    ///
    /// Run it inside one read (or write) so the page and its bounds come from one snapshot.
    /// ``EventPage/lastSequence`` is the largest sequence ever assigned (``lastSequence(in:)``), so it
    /// stays right after old rows are pruned or when every row is gone.
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` when `limit` is below 1; database errors.
    public static func events(after sequence: UInt64, limit: Int? = nil, in db: Database) throws -> EventPage {
        if let limit, limit < 1 {
            throw ServiceError(
                .invalidRequest,
                "limit must be at least 1 (or left out for \(defaultPageSize)); it was \(limit).")
        }
        let pageSize = min(limit ?? defaultPageSize, EventsAfter.maximumLimit)
        let rows = try Row.fetchAll(
            db, sql: "SELECT sequence, topic, envelope FROM outbox WHERE sequence > ? ORDER BY sequence LIMIT ?",
            arguments: [Int64(clamping: sequence), pageSize])
        let events = rows.map { row in
            RecordedEvent(
                sequence: UInt64(clamping: row["sequence"] as Int64),
                topic: row["topic"],
                envelope: String(decoding: row["envelope"] as Data, as: UTF8.self))
        }
        let first = try Int64.fetchOne(db, sql: "SELECT MIN(sequence) FROM outbox") ?? 0
        return EventPage(events: events, firstSequence: UInt64(clamping: first), lastSequence: try lastSequence(in: db))
    }

    /// The largest sequence number ever assigned (0 before the first event), pruned rows and
    /// all: every event up to it has been recorded.
    public static func lastSequence(in db: Database) throws -> UInt64 {
        // The newest row, or (every row pruned) the newest number pruning removed.
        let sql = "SELECT max(ifnull((SELECT max(sequence) FROM outbox), 0), ifnull((SELECT sequence FROM outboxFloor), 0))"
        return UInt64(clamping: try db.fetchOneHot(sql, { _ in }, read: { $0.int64(0) }) ?? 0)
    }
}

extension RequestDispatcher {
    /// Answers `events.after` from the outbox in `database`, to callers with the service token
    /// (no `uid` needed): the page after the request's `sequence`, from one snapshot.
    ///
    /// A `limit` below 1 is refused with `invalidRequest`; a larger one than
    /// ``EventsAfter/maximumLimit`` is cut down to it.
    public mutating func onEventsAfter(database: any DatabaseWriter) {
        let logger = self.logger
        on(EventsAfter.self, access: .serviceWithoutUID) { request, _ in
            try await withStore(database, write: false, logger: logger) { db in
                try Outbox.events(after: request.sequence, limit: request.limit, in: db)
            }
        }
    }
}

// MARK: - Retention

extension Outbox {
    /// How long published events stay in the outbox for subscribers to replay.
    ///
    /// An event is pruned once it is older than ``maxAge`` or more than ``maxEvents`` sequence
    /// numbers behind the newest. Pruning only ever removes the oldest events, so what is kept
    /// is always one unbroken run of sequence numbers.
    public struct Retention: Sendable, Hashable {
        public var maxAge: Duration
        public var maxEvents: Int

        public init(maxAge: Duration = .seconds(Defaults.eventRetentionHours * 3600), maxEvents: Int = 1_000_000) {
            self.maxAge = maxAge
            self.maxEvents = maxEvents
        }

        /// The `createdAt` text below which events are too old at `now`.
        ///
        /// `createdAt` is RFC 3339 in UTC with milliseconds, so text order is time order.
        package func cutoff(now: Date) -> String {
            let (seconds, attoseconds) = maxAge.components
            return Timestamp.format(now.addingTimeInterval(-(Double(seconds) + Double(attoseconds) / 1e18)))
        }

        /// The newest sequence one pruning step deletes (everything at or below it), or `nil`
        /// when nothing is to go.
        ///
        /// - Parameters:
        ///   - oldest: the oldest sequence kept; `newest`: the newest.
        ///   - chunkEnd: the last sequence this step may reach (it bounds the transaction).
        ///   - firstYoung: the oldest sequence up to `chunkEnd` that is not too old (`nil`: none).
        package func pruneBound(oldest: Int64, newest: Int64, chunkEnd: Int64, firstYoung: Int64?) -> Int64? {
            let beyondCount = newest - Int64(max(0, maxEvents))
            let beyondAge = (firstYoung ?? (chunkEnd + 1)) - 1
            let bound = min(chunkEnd, max(beyondCount, beyondAge))
            return bound >= oldest ? bound : nil
        }
    }

    /// Deletes the events `retention` no longer keeps, oldest first, at most `chunkSize`
    /// sequence numbers per transaction so that writers never wait long.
    ///
    /// - Returns: how many events were deleted.
    /// - Throws: database errors, or `CancellationError` between chunks.
    @discardableResult
    public static func prune(
        _ retention: Retention, now: Date = Date(), chunkSize: Int = 10_000, in writer: any DatabaseWriter
    ) async throws -> Int {
        let cutoff = retention.cutoff(now: now)
        let chunk = Int64(max(1, chunkSize))
        var deleted = 0
        while true {
            try Task.checkCancellation()
            let (count, more) = try await writer.write { db -> (Int, Bool) in
                guard let oldest = try Int64.fetchOne(db, sql: "SELECT MIN(sequence) FROM outbox"),
                    let newest = try Int64.fetchOne(db, sql: "SELECT MAX(sequence) FROM outbox")
                else { return (0, false) }
                let chunkEnd = oldest + chunk - 1
                // Reads rows oldest first and stops at the first young one: one row when none is old.
                let firstYoung = try Int64.fetchOne(
                    db,
                    sql: """
                        SELECT sequence FROM outbox WHERE sequence BETWEEN ? AND ? AND createdAt >= ?
                        ORDER BY sequence LIMIT 1
                        """,
                    arguments: [oldest, chunkEnd, cutoff])
                guard
                    let bound = retention.pruneBound(
                        oldest: oldest, newest: newest, chunkEnd: chunkEnd, firstYoung: firstYoung)
                else { return (0, false) }
                try db.execute(sql: "DELETE FROM outbox WHERE sequence <= ?", arguments: [bound])
                let deleted = db.changesCount
                // Numbers removed are never used again, even if every row went (see `lastSequence`).
                try db.execute(
                    sql: """
                        INSERT INTO outboxFloor (id, sequence) VALUES (1, ?)
                        ON CONFLICT (id) DO UPDATE SET sequence = max(sequence, excluded.sequence)
                        """,
                    arguments: [min(bound, newest)])
                return (deleted, bound == chunkEnd && bound < newest)
            }
            deleted += count
            if !more { return deleted }
        }
    }
}

/// Runs `body` while the outbox in `database` is pruned to `retention`: once at start, then every
/// `interval`, in a child task and in chunks (see ``Outbox/prune(_:now:chunkSize:in:)``).
///
/// A failed pruning is logged and tried again at the next interval.
public func withEventRetention<T: Sendable>(
    _ retention: Outbox.Retention, database: any DatabaseWriter, every interval: Duration = .seconds(60),
    logger: Logger, _ body: () async throws -> T
) async throws -> T {
    try await withEventRetention(
        retention, every: interval, logger: logger, prune: { try await Outbox.prune(retention, in: database) },
        measure: { try await database.read(Outbox.shape(in:)) }, body)
}

extension Outbox {
    /// How many events the outbox keeps, and when the oldest was committed. Sequence numbers
    /// of kept events run unbroken (pruning removes the oldest only), so two seeks count them.
    public static func shape(in db: Database) throws -> OutboxShape {
        guard let row = try Row.fetchOne(db, sql: "SELECT min(sequence) AS low, max(sequence) AS high FROM outbox"),
            let low: Int64 = row["low"], let high: Int64 = row["high"]
        else { return OutboxShape(rows: 0, oldest: nil) }
        let oldest = try String.fetchOne(db, sql: "SELECT createdAt FROM outbox WHERE sequence = ?", arguments: [low])
        return OutboxShape(rows: Int(high - low + 1), oldest: oldest.flatMap(Timestamp.parse))
    }
}

/// Runs `body` while `prune` removes what `retention` no longer keeps: once at start, then every
/// `interval`, in a child task. Each store's outbox passes its own pruning, and `measure`, which
/// finds what is left for the outbox's metrics (``OutboxShape``).
///
/// A failed pruning is logged and tried again at the next interval.
public func withEventRetention<T: Sendable>(
    _ retention: Outbox.Retention, every interval: Duration = .seconds(60), logger: Logger,
    prune: @escaping @Sendable () async throws -> Int, measure: (@Sendable () async throws -> OutboxShape)? = nil,
    _ body: () async throws -> T
) async throws -> T {
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask {
            repeat {
                do {
                    let deleted = try await prune()
                    if deleted > 0 {
                        logger.info("pruned \(deleted) events past the retention window (\(retention.maxAge), \(retention.maxEvents) events)")
                    }
                } catch {
                    if Task.isCancelled { return }
                    logger.error("pruning the outbox failed: \(error); it grows until a later pruning succeeds")
                }
                // Measured whether or not pruning worked: a growing outbox is what its failure shows.
                if let measure {
                    do {
                        OutboxFigures.record(try await measure(), retention: retention)
                    } catch {
                        if Task.isCancelled { return }
                        logger.warning("measuring the outbox for its metrics failed: \(error)")
                    }
                }
            } while (try? await Task.sleep(for: interval)) != nil
        }
        let result = try await body()
        group.cancelAll()
        return result
    }
}
