import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingOrchestrator
import PostgresNIO
import PostgresSupport
import ServiceRuntime

/// The orchestrator's people, cursors, set-ups and route outbox in PostgreSQL: what its SQLite
/// store is, for replicas of which one leads (see ``Leadership``).
///
/// A batch of decisions is one ``PostgresStore/pipelinedEventTransaction(_:afterCommit:)``: the
/// outbox head's lock, one statement that checks this replica still leads and reads the rows of
/// the people the machine is not tracking (sent together: one round trip), the decisions (into a
/// ``DecisionBuffer``), then one statement per kind of write (intents recorded, rows, cursors, the
/// route outbox), sent with `COMMIT` (the second round trip), whatever the batch's size. Route
/// intents are published after the commit, in sequence order.
///
/// Thread safety: immutable; any task may call any method.
final class OrchestratorPostgresStore: BufferedDecisionStore {
    let store: PostgresStore
    let publisher: any EventPublisher
    let logger: Logger
    /// This replica's term (see ``Leadership``): decisions commit only while it is the current one.
    let epoch: Int64
    private let outbox = PostgresOutbox(source: ServiceName.orchestrator)

    init(store: PostgresStore, context: OrchestratorStorageContext, epoch: Int64) {
        self.store = store
        self.publisher = context.publisher
        self.logger = context.logger
        self.epoch = epoch
    }

    static func migrator(schema: String) throws -> PostgresMigrator {
        var migrator = try PostgresMigrator(schema: schema)
        PostgresOutbox.registerMigration(in: &migrator)
        migrator.register(
            "orchestrator-v1",
            [
                // Byte order for uids, as on SQLite: `onboarding.routes` pages by uid.
                """
                CREATE TABLE person (
                  uid text COLLATE "C" PRIMARY KEY,
                  profile text NOT NULL,
                  profile_as_of bigint NOT NULL DEFAULT 0,
                  sessions bigint NOT NULL DEFAULT 0,
                  owes_dismiss boolean NOT NULL DEFAULT false,
                  pending_check text,
                  withdrawn boolean NOT NULL DEFAULT false,
                  cleanup text NOT NULL DEFAULT '',
                  intent_id text,
                  intent text,
                  reason text,
                  intent_sequence bigint,
                  intent_time text)
                """,
                "CREATE INDEX person_work ON person (uid) WHERE pending_check IS NOT NULL OR cleanup <> ''",
                "CREATE TABLE cursor (publisher text PRIMARY KEY, sequence bigint NOT NULL)",
                """
                CREATE TABLE setup (
                  uid text NOT NULL,
                  idempotency_key text NOT NULL,
                  username text NOT NULL,
                  started_at text NOT NULL,
                  PRIMARY KEY (uid, idempotency_key))
                """,
                // Which replica leads, and since when (see Leadership).
                """
                CREATE TABLE leader (
                  id int PRIMARY KEY CHECK (id = 1),
                  epoch bigint NOT NULL,
                  holder text,
                  since timestamptz)
                """,
                "INSERT INTO leader (id, epoch) VALUES (1, 0)",
            ])
        // Set-up attempts, numbered higher than any before (see SetUpRecord.attempt).
        migrator.register(
            "orchestrator-v2-setup-attempts",
            ["ALTER TABLE setup ADD COLUMN attempt bigint NOT NULL DEFAULT 0", "CREATE SEQUENCE setup_attempt"])
        return migrator
    }

    // MARK: Decisions

    func commit<Result: Sendable>(
        reading uids: [String], restarting: Bool, _ decide: @escaping @Sendable (inout DecisionBuffer) throws -> Result
    ) async throws -> Result {
        let (epoch, publisher, outbox) = (self.epoch, self.publisher, self.outbox)
        // Two flights: BEGIN, the head's lock and the read of the people; then the writes and COMMIT.
        return try await store.pipelinedEventTransaction { transaction in
            let stored = try Self.people(uids, ifLeading: epoch, in: transaction)
            let withWork = restarting ? try Self.peopleWithWork(in: transaction) : nil
            var buffer = DecisionBuffer(
                stored: stored, withWork: withWork, lastSequence: UInt64(clamping: try transaction.lastSequence()))
            let result = try decide(&buffer)
            try Self.write(buffer, in: transaction)
            let recordings = buffer.emitted.map { published in
                PostgresOutbox.Recording(
                    published.intent, uid: published.intent.uid, topic: Topics.route(uid: published.intent.uid),
                    time: published.time, trace: (published.traceparent, published.tracestate))
            }
            return (result, try outbox.record(recordings, in: transaction))
        } afterCommit: { _, messages in
            // Only queued for the bus's I/O thread: never blocks. Batches take turns, so in order.
            for message in messages { try? publisher.publish(message) }
        }.0
    }

    /// The stored rows of `uids`, after checking (in the same statement) that the term `epoch`
    /// is still the current one.
    private static func people(
        _ uids: [String], ifLeading epoch: Int64, in transaction: PipelineTransaction
    ) throws -> [String: OnboardingStateMachine.PersistedPerson] {
        let rows = try transaction.rows(
            """
            SELECT l.epoch, \(unescaped: personColumns("p"))
            FROM leader l LEFT JOIN person p ON p.uid = ANY(\(uids)::text[])
            WHERE l.id = 1
            """)
        var current: Int64?
        var people: [String: OnboardingStateMachine.PersistedPerson] = [:]
        for (term, uid, profile, asOf, sessions, owes, pending, withdrawn, cleanup, intentId, intent, reason) in try rows.decode(
            (Int64, String?, String?, Int64?, Int64?, Bool?, String?, Bool?, String?, String?, String?, String?).self)
        {
            current = term
            guard let uid, let profile, let asOf, let sessions, let owes, let withdrawn, let cleanup else { continue }
            people[uid] = PersonRow(
                uid: uid, profile: profile, profileAsOf: asOf, sessions: Int(sessions), owesDismiss: owes, pendingCheck: pending,
                withdrawn: withdrawn, cleanup: cleanup, intentId: intentId, intent: intent, reason: reason
            ).persisted
        }
        guard current == epoch else { throw notLeading(current) }
        return people
    }

    private static func personColumns(_ table: String) -> String {
        ["uid", "profile", "profile_as_of", "sessions", "owes_dismiss", "pending_check", "withdrawn", "cleanup", "intent_id", "intent", "reason"]
            .map { "\(table).\($0)" }.joined(separator: ", ")
    }

    /// The people with work left (a check or a clean-up), read in `transaction`.
    private static func peopleWithWork(in transaction: PipelineTransaction) throws
        -> [(String, OnboardingStateMachine.PersistedPerson)]
    {
        try transaction.rows(PipelineQuery(unsafeSQL: peopleWithWorkSQL)).decode(PersonColumns.self).map(person)
    }

    /// The people with work left, read on `connection`.
    private static func peopleWithWork(on connection: PostgresConnection, logger: Logger) async throws
        -> [(String, OnboardingStateMachine.PersistedPerson)]
    {
        var people: [(String, OnboardingStateMachine.PersistedPerson)] = []
        let rows = try await connection.query(PostgresQuery(unsafeSQL: peopleWithWorkSQL), logger: logger)
        for try await columns in rows.decode(PersonColumns.self) { people.append(person(columns)) }
        return people
    }

    private static let peopleWithWorkSQL =
        "SELECT \(personColumns("p")) FROM person p WHERE p.pending_check IS NOT NULL OR p.cleanup <> ''"

    /// A row of `person`, as ``personColumns(_:)`` lists them.
    private typealias PersonColumns = (String, String, Int64, Int64, Bool, String?, Bool, String, String?, String?, String?)

    private static func person(_ columns: PersonColumns) -> (String, OnboardingStateMachine.PersistedPerson) {
        let (uid, profile, asOf, sessions, owes, pending, withdrawn, cleanup, intentId, intent, reason) = columns
        let row = PersonRow(
            uid: uid, profile: profile, profileAsOf: asOf, sessions: Int(sessions), owesDismiss: owes, pendingCheck: pending,
            withdrawn: withdrawn, cleanup: cleanup, intentId: intentId, intent: intent, reason: reason)
        return (uid, row.persisted)
    }

    /// Queues what `buffer` holds: the intents recorded, then the rows (which may overwrite
    /// them), then the cursors; one statement each. Optional text travels as "" and optional
    /// numbers as -1 (arrays of optionals are not sent), turned back into NULL here.
    private static func write(_ buffer: DecisionBuffer, in transaction: PipelineTransaction) throws {
        if !buffer.recorded.isEmpty {
            let intents = buffer.recorded
            try transaction.send(
                """
                INSERT INTO person (uid, profile, intent_id, intent, reason, intent_sequence, intent_time)
                SELECT u, 'unknown', i, k, r, s, t
                FROM unnest(\(intents.map(\.intent.uid))::text[], \(intents.map(\.intent.intentId))::text[],
                            \(intents.map(\.intent.intent.rawValue))::text[], \(intents.map(\.intent.reason.rawValue))::text[],
                            \(intents.map { Int64(clamping: $0.sequence) })::bigint[], \(intents.map(\.time))::text[])
                  AS x(u, i, k, r, s, t)
                ON CONFLICT (uid) DO UPDATE SET
                  intent_id = excluded.intent_id, intent = excluded.intent, reason = excluded.reason,
                  intent_sequence = excluded.intent_sequence, intent_time = excluded.intent_time
                """)
        }
        if !buffer.saved.isEmpty {
            // An intent emitted in this transaction goes in with its route sequence and time; one
            // in force from before keeps what was recorded with it; none clears them.
            let rows = buffer.saved.map(\.row), published = buffer.saved.map(\.published)
            try transaction.send(
                """
                INSERT INTO person (uid, profile, profile_as_of, sessions, owes_dismiss, pending_check, withdrawn, cleanup,
                                    intent_id, intent, reason, intent_sequence, intent_time)
                SELECT u, p, a, n, o, NULLIF(c, ''), w, l, NULLIF(i, ''), NULLIF(k, ''), NULLIF(r, ''), NULLIF(s, -1), NULLIF(t, '')
                FROM unnest(\(rows.map(\.uid))::text[], \(rows.map(\.profile))::text[], \(rows.map(\.profileAsOf))::bigint[],
                            \(rows.map { Int64($0.sessions) })::bigint[], \(rows.map(\.owesDismiss))::boolean[],
                            \(rows.map { $0.pendingCheck ?? "" })::text[], \(rows.map(\.withdrawn))::boolean[],
                            \(rows.map(\.cleanup))::text[], \(rows.map { $0.intentId ?? "" })::text[],
                            \(rows.map { $0.intent ?? "" })::text[], \(rows.map { $0.reason ?? "" })::text[],
                            \(published.map { $0.map { Int64(clamping: $0.sequence) } ?? -1 })::bigint[],
                            \(published.map { $0?.time ?? "" })::text[])
                  AS x(u, p, a, n, o, c, w, l, i, k, r, s, t)
                ON CONFLICT (uid) DO UPDATE SET
                  profile = excluded.profile, profile_as_of = excluded.profile_as_of, sessions = excluded.sessions,
                  owes_dismiss = excluded.owes_dismiss, pending_check = excluded.pending_check, withdrawn = excluded.withdrawn,
                  cleanup = excluded.cleanup, intent_id = excluded.intent_id, intent = excluded.intent, reason = excluded.reason,
                  intent_sequence = CASE WHEN excluded.intent_id IS NULL THEN NULL
                                         ELSE coalesce(excluded.intent_sequence, person.intent_sequence) END,
                  intent_time = CASE WHEN excluded.intent_id IS NULL THEN NULL
                                     ELSE coalesce(excluded.intent_time, person.intent_time) END
                """)
        }
        if !buffer.cursors.isEmpty {
            let cursors = buffer.cursors.sorted { $0.key < $1.key }
            try transaction.send(
                """
                INSERT INTO cursor (publisher, sequence)
                SELECT * FROM unnest(\(cursors.map(\.key))::text[], \(cursors.map { Int64(clamping: $0.value) })::bigint[])
                ON CONFLICT (publisher) DO UPDATE SET sequence = excluded.sequence
                """)
        }
    }

    // MARK: Reading

    func routeState(of uid: String) async throws -> RouteState {
        let logger = self.logger
        return try await store.read { connection in
            let rows = try await connection.query(
                "SELECT intent_id, intent, reason, intent_sequence, intent_time FROM person WHERE uid = \(uid)", logger: logger)
            var state = RouteState(uid: uid, intent: nil, sequence: nil, time: nil)
            for try await (id, kind, reason, sequence, time) in rows.decode((String?, String?, String?, Int64?, String?).self) {
                state = Self.routeState(uid: uid, id: id, kind: kind, reason: reason, sequence: sequence, time: time)
            }
            return state
        }
    }

    func routeStates(after uid: String?, limit: Int) async throws -> RouteStatePage {
        let logger = self.logger
        let (after, count) = (uid ?? "", Int64(limit) + 1)
        return try await store.read { connection in
            let rows = try await connection.query(
                """
                SELECT uid, intent_id, intent, reason, intent_sequence, intent_time FROM person
                WHERE intent_id IS NOT NULL AND uid > \(after) ORDER BY uid LIMIT \(count)
                """,
                logger: logger)
            var states: [RouteState] = []
            for try await (uid, id, kind, reason, sequence, time) in rows.decode(
                (String, String?, String?, String?, Int64?, String?).self)
            {
                states.append(Self.routeState(uid: uid, id: id, kind: kind, reason: reason, sequence: sequence, time: time))
            }
            let page = Array(states.prefix(limit))
            return RouteStatePage(states: page, nextUID: states.count > limit ? page.last?.uid : nil)
        }
    }

    private static func routeState(uid: String, id: String?, kind: String?, reason: String?, sequence: Int64?, time: String?)
        -> RouteState
    {
        guard let intent = OrchestratorStore.intent(uid: uid, id: id, kind: kind, reason: reason) else {
            return RouteState(uid: uid, intent: nil, sequence: nil, time: nil)
        }
        return RouteState(uid: uid, intent: intent, sequence: sequence.map { UInt64(clamping: $0) }, time: time)
    }

    func events(after sequence: UInt64, limit: Int?) async throws -> EventPage {
        let logger = self.logger
        return try await store.read { connection in
            try await PostgresOutbox.events(after: sequence, limit: limit, on: connection, logger: logger)
        }
    }

    func cursors() async throws -> [String: UInt64] {
        let logger = self.logger
        return try await store.read { connection in
            var cursors: [String: UInt64] = [:]
            for try await (publisher, sequence) in try await connection.query("SELECT publisher, sequence FROM cursor", logger: logger)
                .decode((String, Int64).self)
            { cursors[publisher] = UInt64(clamping: sequence) }
            return cursors
        }
    }

    func peopleWithWork() async throws -> [(String, OnboardingStateMachine.PersistedPerson)] {
        let logger = self.logger
        return try await store.read { connection in try await Self.peopleWithWork(on: connection, logger: logger) }
    }

    // MARK: Set-ups

    /// Only while this replica leads: one that lost the lead (without noticing yet) starts no
    /// set-up, since the one that leads now settles every recorded set-up it is not running.
    func beginSetup(_ setup: SetUpRecord) async throws -> UInt64 {
        let (logger, now, epoch) = (self.logger, Timestamp.now(), self.epoch)
        return try await store.read { connection in
            let rows = try await connection.query(
                """
                INSERT INTO setup (uid, idempotency_key, username, started_at, attempt)
                SELECT \(setup.uid), \(setup.idempotencyKey), \(setup.username), \(now), nextval('setup_attempt')
                FROM leader WHERE id = 1 AND epoch = \(epoch)
                ON CONFLICT (uid, idempotency_key) DO UPDATE
                  SET username = excluded.username, started_at = excluded.started_at, attempt = excluded.attempt
                RETURNING attempt
                """,
                logger: logger)
            for try await attempt in rows.decode(Int64.self) { return UInt64(clamping: attempt) }
            throw Self.notLeading(nil)
        }
    }

    func endSetup(_ setup: SetUpRecord) async throws {
        let (logger, attempt) = (self.logger, Int64(clamping: setup.attempt))
        try await store.read { connection in
            _ = try await connection.query(
                "DELETE FROM setup WHERE uid = \(setup.uid) AND idempotency_key = \(setup.idempotencyKey) AND attempt = \(attempt)",
                logger: logger)
        }
    }

    /// Only while this replica leads: the set-ups recorded are then those a crash, a lost lead or
    /// an unreachable service left unfinished. (One that lost the lead would find the new
    /// leader's set-ups under way, and abandon them.)
    func unfinishedSetups() async throws -> [SetUpRecord] {
        let (logger, epoch) = (self.logger, self.epoch)
        return try await store.read { connection in
            var setups: [SetUpRecord] = []
            var current: Int64?
            for try await (term, uid, key, username, attempt) in try await connection.query(
                "SELECT l.epoch, s.uid, s.idempotency_key, s.username, s.attempt FROM leader l LEFT JOIN setup s ON true WHERE l.id = 1",
                logger: logger
            ).decode((Int64, String?, String?, String?, Int64?).self) {
                current = term
                guard let uid, let key, let username, let attempt else { continue }
                setups.append(SetUpRecord(uid: uid, idempotencyKey: key, username: username, attempt: UInt64(clamping: attempt)))
            }
            guard current == epoch else { throw Self.notLeading(current) }
            return setups
        }
    }

    func endSetups(of uid: String, through attempt: UInt64) async throws {
        let (logger, attempt) = (self.logger, Int64(clamping: attempt))
        try await store.read { connection in
            _ = try await connection.query("DELETE FROM setup WHERE uid = \(uid) AND attempt <= \(attempt)", logger: logger)
        }
    }

    /// `false` also when this replica no longer leads: the one that leads settles the set-up.
    func isCurrentSetup(_ setup: SetUpRecord) async throws -> Bool {
        let (logger, epoch, attempt) = (self.logger, self.epoch, Int64(clamping: setup.attempt))
        return try await store.read { connection in
            let rows = try await connection.query(
                """
                SELECT EXISTS (SELECT FROM setup WHERE uid = \(setup.uid) AND idempotency_key = \(setup.idempotencyKey) AND attempt = \(attempt))
                   AND NOT EXISTS (SELECT FROM setup WHERE uid = \(setup.uid) AND attempt > \(attempt))
                FROM leader WHERE id = 1 AND epoch = \(epoch)
                """,
                logger: logger)
            for try await current in rows.decode(Bool.self) { return current }
            return false
        }
    }

    /// What a replica that lost the lead answers when it would decide, begin a set-up or settle
    /// one: `current` is the term the store holds (`nil`: not read).
    private static func notLeading(_ current: Int64?) -> ServiceError {
        ServiceError(
            .storeUnavailable,
            "Another orchestrator leads now (term \(current.map(String.init) ?? "?")); this one stops. Send the request again: the one that leads answers it.")
    }
}
