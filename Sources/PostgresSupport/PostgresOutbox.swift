import Foundation
import Logging
import Messaging
import OnboardingAPI
import PostgresNIO
import ServiceRuntime

/// The transactional outbox on PostgreSQL: what ``Outbox`` is on SQLite, for several writers.
///
/// An event is written in the transaction of the change it reports and published after that
/// transaction commits. Its sequence number comes from the one row of `outbox_head`, which a
/// transaction that records events locks (``lockHead``, first) until it ends: such transactions
/// take turns, whichever process or replica runs them.
/// So numbers are dense (a rolled-back transaction gives its numbers back) and become visible in
/// order: a reader never sees event n before n-1, and `events.after` never skips one. The cost:
/// one service's event-writing transactions commit one after another, so they should be few and
/// large (batch what queued meanwhile), as on SQLite.
///
/// `outbox_head` also keeps the newest number ever assigned once pruning has removed every row,
/// so numbers are never reused.
///
/// Thread safety: immutable; each method works on the connection it is given.
public struct PostgresOutbox: Sendable {
    public let source: String

    public init(source: String) {
        self.source = source
    }

    /// Adds the `outbox` and `outbox_head` tables to `migrator`.
    public static func registerMigration(in migrator: inout PostgresMigrator) {
        migrator.register(
            "outbox-v1",
            [
                """
                CREATE TABLE outbox (
                  sequence bigint PRIMARY KEY,
                  type text NOT NULL,
                  topic text NOT NULL,
                  uid text,
                  envelope text NOT NULL,
                  created_at text NOT NULL)
                """,
                "CREATE TABLE outbox_head (id int PRIMARY KEY CHECK (id = 1), sequence bigint NOT NULL)",
                "INSERT INTO outbox_head (id, sequence) VALUES (1, 0)",
            ])
    }

    /// An event to record: everything but its sequence number, which the append assigns.
    public struct Recording: Sendable {
        public var type: String
        public var topic: String
        public var uid: String?
        public var time: String
        let envelope: @Sendable (EnvelopeHeader) throws -> Data
        let correlationId: String?
        /// The trace context of the work that recorded it (see ``Traces``), written with it.
        let trace: (traceparent: String?, tracestate: String?)

        /// - Parameter trace: the trace context to write with it; by default the current task's.
        public init<Event: APIEvent>(
            _ event: Event, uid: String?, correlationId: String? = nil, topic: String? = nil, time: String? = nil,
            trace: (traceparent: String?, tracestate: String?)? = nil
        ) {
            self.type = Event.type
            self.topic = topic ?? Event.type
            self.uid = uid
            self.time = time ?? Timestamp.now()
            self.correlationId = correlationId
            self.envelope = { header in try Envelope(header: header, payload: event).encoded() }
            self.trace = trace ?? Traces.current()
        }
    }

    /// Takes the head row's lock and returns the last number assigned: the first statement of
    /// every transaction that records events (see ``PostgresStore/eventTransaction(_:afterCommit:)``).
    /// Taking it first makes those transactions take turns from their first statement, so they
    /// never wait for each other's rows in a cycle, and each reads what the one before committed.
    public static let lockHead = "SELECT sequence FROM outbox_head WHERE id = 1 FOR UPDATE"

    /// ``lockHead`` as a prepared statement.
    struct LockHead: PostgresPreparedStatement {
        static let sql = PostgresOutbox.lockHead
        func makeBindings() -> PostgresBindings { PostgresBindings() }
        func decodeRow(_ row: PostgresRow) throws -> Int64 { try row.decode(Int64.self) }
    }

    /// The last sequence number assigned, from ``lockHead`` run on `connection`.
    static func lockedHead(on connection: PostgresConnection, logger: Logger) async throws -> Int64 {
        var last: Int64?
        for try await sequence in try await connection.execute(LockHead(), logger: logger) { last = sequence }
        guard let last else { throw ServiceError(.storeUnavailable, "The outbox has no head row: was the store migrated?") }
        return last
    }

    /// Records `events` in the transaction open on `connection`, numbered on from the last
    /// event of the service, and returns them as messages to publish once it has committed
    /// (and to drop if it rolls back). For a transaction that did not start with ``lockHead``.
    public func append(
        _ events: [Recording], on connection: PostgresConnection, logger: Logger
    ) async throws -> [OutgoingMessage] {
        guard !events.isEmpty else { return [] }
        let last = try await Self.lockedHead(on: connection, logger: logger)
        return try await record(events, after: last, on: connection, logger: logger)
    }

    /// Records `events` numbered from `last + 1` on, where `last` is what ``lockHead`` returned
    /// in the same transaction, and moves the head past them: one statement. Returns them as
    /// messages to publish once the transaction has committed.
    public func record(
        _ events: [Recording], after last: Int64, on connection: PostgresConnection, logger: Logger
    ) async throws -> [OutgoingMessage] {
        guard !events.isEmpty else { return [] }
        let (rows, messages) = try numbered(events, after: last)
        _ = try await connection.execute(rows, logger: logger)
        return messages
    }

    /// ``record(_:after:on:logger:)`` in a pipelined transaction, numbered on from its
    /// ``PipelineTransaction/lastSequence()``: queued with the transaction's next flight.
    public func record(_ events: [Recording], in transaction: PipelineTransaction) throws -> [OutgoingMessage] {
        guard !events.isEmpty else { return [] }
        let (rows, messages) = try numbered(events, after: try transaction.lastSequence())
        try transaction.send(
            PipelineQuery(unsafeSQL: Record.sql) { query in
                query.bind(rows.newest)
                query.bind(rows.sequences)
                for texts in [rows.types, rows.topics, rows.uids, rows.envelopes, rows.times] { query.bind(texts) }
            })
        return messages
    }

    /// `events` numbered from `last + 1` on: the rows to insert, and the messages to publish.
    private func numbered(_ events: [Recording], after last: Int64) throws -> (Record, [OutgoingMessage]) {
        var sequences: [Int64] = [], types: [String] = [], topics: [String] = [], uids: [String] = []
        var envelopes: [String] = [], times: [String] = []
        var messages: [OutgoingMessage] = []
        for (offset, event) in events.enumerated() {
            let sequence = last + 1 + Int64(offset)
            let header = EnvelopeHeader(
                type: event.type, source: source, sequence: UInt64(sequence), time: event.time,
                correlationId: event.correlationId, uid: event.uid, traceparent: event.trace.traceparent,
                tracestate: event.trace.tracestate)
            let body = try event.envelope(header)
            sequences.append(sequence)
            types.append(event.type)
            topics.append(event.topic)
            uids.append(event.uid ?? "")
            envelopes.append(String(decoding: body, as: UTF8.self))
            times.append(event.time)
            messages.append(OutgoingMessage(topic: event.topic, body: body))
        }
        let rows = Record(
            newest: last + Int64(events.count), sequences: sequences, types: types, topics: topics, uids: uids,
            envelopes: envelopes, times: times)
        return (rows, messages)
    }

    /// Inserts events and moves the head past them (prepared: every event-writing transaction runs it).
    struct Record: PostgresPreparedStatement {
        static let sql = """
            WITH head AS (UPDATE outbox_head SET sequence = $1 WHERE id = 1)
            INSERT INTO outbox (sequence, type, topic, uid, envelope, created_at)
            SELECT s, t, p, NULLIF(u, ''), e, c
            FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]) AS x(s, t, p, u, e, c)
            """
        var newest: Int64
        var sequences: [Int64], types: [String], topics: [String], uids: [String], envelopes: [String], times: [String]

        func makeBindings() -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 7)
            bindings.append(newest)
            bindings.append(sequences)
            for texts in [types, topics, uids, envelopes, times] { bindings.append(texts) }
            return bindings
        }

        func decodeRow(_ row: PostgresRow) throws {}
    }

    // MARK: Replay

    /// The events recorded after `sequence`, oldest first, with the bounds of what is kept, from
    /// one snapshot (one statement): at most `limit` (by default ``Outbox/defaultPageSize``, never
    /// more than ``EventsAfter/maximumLimit``).
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` when `limit` is below 1; database errors.
    public static func events(
        after sequence: UInt64, limit: Int? = nil, on connection: PostgresConnection, logger: Logger
    ) async throws -> EventPage {
        if let limit, limit < 1 {
            throw ServiceError(
                .invalidRequest,
                "limit must be at least 1 (or left out for \(Outbox.defaultPageSize)); it was \(limit).")
        }
        let pageSize = Int64(min(limit ?? Outbox.defaultPageSize, EventsAfter.maximumLimit))
        let after = Int64(clamping: sequence)
        let rows = try await connection.query(
            """
            WITH page AS (
              SELECT sequence, topic, envelope FROM outbox WHERE sequence > \(after) ORDER BY sequence LIMIT \(pageSize))
            SELECT h.sequence, coalesce((SELECT min(sequence) FROM outbox), 0), p.sequence, p.topic, p.envelope
            FROM outbox_head h LEFT JOIN page p ON true
            WHERE h.id = 1
            ORDER BY p.sequence
            """,
            logger: logger)
        var page = EventPage(events: [], firstSequence: 0, lastSequence: 0)
        for try await (last, first, eventSequence, topic, envelope) in rows.decode((Int64, Int64, Int64?, String?, String?).self) {
            page.lastSequence = UInt64(clamping: last)
            page.firstSequence = UInt64(clamping: first)
            if let eventSequence, let topic, let envelope {
                page.events.append(RecordedEvent(sequence: UInt64(clamping: eventSequence), topic: topic, envelope: envelope))
            }
        }
        return page
    }

    /// The newest sequence number assigned (0 before the first event), pruned rows and all.
    public static func lastSequence(on connection: PostgresConnection, logger: Logger) async throws -> UInt64 {
        let rows = try await connection.query("SELECT sequence FROM outbox_head WHERE id = 1", logger: logger)
        var last: Int64 = 0
        for try await sequence in rows.decode(Int64.self) { last = sequence }
        return UInt64(clamping: last)
    }

    // MARK: Retention

    /// How many events the outbox keeps (counted: a rolled-back number leaves a gap here), and
    /// when the oldest was committed.
    public static func shape(on connection: PostgresConnection, logger: Logger) async throws -> OutboxShape {
        let rows = try await connection.query(
            "SELECT count(*), (SELECT created_at FROM outbox ORDER BY sequence LIMIT 1) FROM outbox", logger: logger)
        var shape = OutboxShape(rows: 0, oldest: nil)
        for try await (count, oldest) in rows.decode((Int64, String?).self) {
            shape = OutboxShape(rows: Int(count), oldest: oldest.flatMap(Timestamp.parse))
        }
        return shape
    }

    /// Deletes the events `retention` no longer keeps, oldest first, at most `chunkSize`
    /// numbers per transaction (as ``Outbox/prune(_:now:chunkSize:in:)`` does on SQLite). It
    /// never takes `outbox_head`'s lock, so writers do not wait for it.
    ///
    /// - Returns: how many events were deleted.
    @discardableResult
    public static func prune(
        _ retention: Outbox.Retention, now: Date = Date(), chunkSize: Int = 10_000, client: PostgresClient,
        logger: Logger
    ) async throws -> Int {
        let cutoff = retention.cutoff(now: now)
        let chunk = Int64(max(1, chunkSize))
        var deleted = 0
        while true {
            try Task.checkCancellation()
            let (count, more) = try await client.withTransaction(logger: logger) { connection -> (Int, Bool) in
                let bounds = try await connection.query(
                    "SELECT min(sequence), max(sequence) FROM outbox", logger: logger)
                var oldest: Int64?, newest: Int64?
                for try await (low, high) in bounds.decode((Int64?, Int64?).self) { (oldest, newest) = (low, high) }
                guard let oldest, let newest else { return (0, false) }
                let chunkEnd = oldest + chunk - 1
                var firstYoung: Int64?
                let young = try await connection.query(
                    """
                    SELECT sequence FROM outbox WHERE sequence BETWEEN \(oldest) AND \(chunkEnd) AND created_at >= \(cutoff)
                    ORDER BY sequence LIMIT 1
                    """,
                    logger: logger)
                for try await sequence in young.decode(Int64.self) { firstYoung = sequence }
                guard
                    let bound = retention.pruneBound(
                        oldest: oldest, newest: newest, chunkEnd: chunkEnd, firstYoung: firstYoung)
                else { return (0, false) }
                let gone = try await connection.query(
                    "WITH gone AS (DELETE FROM outbox WHERE sequence <= \(bound) RETURNING 1) SELECT count(*) FROM gone",
                    logger: logger)
                var count: Int64 = 0
                for try await rows in gone.decode(Int64.self) { count = rows }
                return (Int(count), bound == chunkEnd && bound < newest)
            }
            deleted += count
            if !more { return deleted }
        }
    }
}
