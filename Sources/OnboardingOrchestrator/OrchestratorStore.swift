import Foundation
import GRDB
import Messaging
import OnboardingAPI
import ServiceRuntime

/// The orchestrator's SQLite tables, and the reads and writes it makes of them.
///
/// - `person`: per uid, what ``OnboardingStateMachine/PersistedPerson`` holds (the intent in
///   force among it, which `onboarding.intent` answers), and the route sequence and time the
///   intent in force was last published with.
/// - `outbox`: every route intent emitted, with its route sequence number (see ``Outbox``).
/// - `cursor`: per publisher, the sequence of the last event handled, written in the same
///   transaction as that event's effects, so an event is handled once however often it arrives.
/// - `setup`: set-ups under way, so one that a crash interrupts is finished or undone on restart.
///
/// Every function here runs inside a transaction the caller opened.
package enum OrchestratorStore {
    static func migrator() -> DatabaseMigrator {
        var migrator = DatabaseMigrator()
        Outbox.registerMigration(in: &migrator)
        migrator.registerMigration("orchestrator-v1") { db in
            try db.create(table: "person") { table in
                table.primaryKey("uid", .text)
                table.column("profile", .text).notNull()
                table.column("pendingCheck", .text)
                table.column("withdrawn", .boolean).notNull().defaults(to: false)
                table.column("cleanup", .text).notNull().defaults(to: "")
                table.column("intentId", .text)
                table.column("intent", .text)
                table.column("reason", .text)
                table.column("intentSequence", .integer)
                table.column("intentTime", .text)
            }
            try db.create(index: "person_pending", on: "person", columns: ["pendingCheck"], condition: Column("pendingCheck") != nil)
            try db.create(index: "person_cleanup", on: "person", columns: ["uid"], condition: Column("cleanup") != "")
            try db.create(table: "cursor") { table in
                table.primaryKey("publisher", .text)
                table.column("sequence", .integer).notNull()
            }
            // One row per set-up (a person may start another before an earlier one is settled).
            try db.create(table: "setup") { table in
                table.column("uid", .text).notNull()
                table.column("idempotencyKey", .text).notNull()
                table.column("username", .text).notNull()
                table.column("startedAt", .text).notNull()
                table.primaryKey(["uid", "idempotencyKey"])
            }
        }
        // Decisions derived from state: how new the profile knowledge is, and whether a
        // `dismiss` is owed (a `presentProfileSetup` is in force or was, since the last profile).
        migrator.registerMigration("orchestrator-v2-derived") { db in
            try db.alter(table: "person") { table in
                table.add(column: "profileAsOf", .integer).notNull().defaults(to: 0)
                table.add(column: "owesDismiss", .boolean).notNull().defaults(to: false)
                table.add(column: "sessions", .integer).notNull().defaults(to: 0)
            }
            try db.execute(sql: "UPDATE person SET owesDismiss = 1 WHERE intent = 'presentProfileSetup'")
            // Sessions were not counted before: someone with an intent in force is taken as signed in.
            try db.execute(sql: "UPDATE person SET sessions = 1 WHERE intent IS NOT NULL AND NOT withdrawn")
        }
        migrator.registerMigration("orchestrator-v3-person-without-rowid") { db in
            // Keyed by uid alone: a new person's row was written to the table and to the index of
            // its uid, two pages per commit; without a row id it is one.
            try db.execute(
                sql: """
                    CREATE TABLE person_v3 (
                      uid TEXT PRIMARY KEY NOT NULL,
                      profile TEXT NOT NULL,
                      pendingCheck TEXT,
                      withdrawn BOOLEAN NOT NULL DEFAULT 0,
                      cleanup TEXT NOT NULL DEFAULT '',
                      intentId TEXT,
                      intent TEXT,
                      reason TEXT,
                      intentSequence INTEGER,
                      intentTime TEXT,
                      profileAsOf INTEGER NOT NULL DEFAULT 0,
                      owesDismiss BOOLEAN NOT NULL DEFAULT 0,
                      sessions INTEGER NOT NULL DEFAULT 0
                    ) WITHOUT ROWID;
                    INSERT INTO person_v3 (uid, profile, pendingCheck, withdrawn, cleanup, intentId, intent, reason,
                                           intentSequence, intentTime, profileAsOf, owesDismiss, sessions)
                      SELECT uid, profile, pendingCheck, withdrawn, cleanup, intentId, intent, reason,
                             intentSequence, intentTime, profileAsOf, owesDismiss, sessions FROM person;
                    DROP TABLE person;
                    ALTER TABLE person_v3 RENAME TO person;
                    CREATE INDEX person_pending ON person(pendingCheck) WHERE pendingCheck IS NOT NULL;
                    CREATE INDEX person_cleanup ON person(uid) WHERE cleanup != '';
                    """)
        }
        // Set-up attempts, numbered higher than any before (see SetUpRecord.attempt).
        migrator.registerMigration("orchestrator-v4-setup-attempts") { db in
            try db.alter(table: "setup") { table in
                table.add(column: "attempt", .integer).notNull().defaults(to: 0)
            }
            try db.create(table: "setupAttempt") { table in
                table.primaryKey("id", .integer).check { $0 == 1 }
                table.column("last", .integer).notNull()
            }
            try db.execute(sql: "INSERT INTO setupAttempt (id, last) VALUES (1, 0)")
        }
        return migrator
    }

    static func openDatabase(path: String?) throws -> any DatabaseWriter {
        do {
            let writer = try ServiceDatabase.open(path: path)
            try migrator().migrate(writer)
            return writer
        } catch {
            throw ServiceError(.storeUnavailable, "Could not open the orchestrator's database at \(path ?? ":memory:"): \(error)")
        }
    }

    // MARK: People

    /// The columns ``persisted(_:)`` reads.
    private static let personColumns =
        "uid, profile, profileAsOf, sessions, owesDismiss, pendingCheck, withdrawn, cleanup, intentId, intent, reason"

    /// On the hot path: read for every input about someone the machine is not tracking.
    static func person(_ uid: String, in db: Database) throws -> OnboardingStateMachine.PersistedPerson? {
        try db.fetchOneHot("SELECT \(personColumns) FROM person WHERE uid = ?", { $0.bind(uid) }) { row in
            PersonRow(
                uid: row.string(0), profile: row.string(1), profileAsOf: row.int64(2), sessions: Int(row.int64(3)),
                owesDismiss: row.bool(4), pendingCheck: row.optionalString(5), withdrawn: row.bool(6),
                cleanup: row.string(7), intentId: row.optionalString(8), intent: row.optionalString(9),
                reason: row.optionalString(10)
            ).persisted
        }
    }

    /// The largest uid with a row (by byte order, SQLite's for text), or "" when there is none.
    static func largestUID(in db: Database) throws -> String {
        try db.fetchOneHot("SELECT max(uid) FROM person", { _ in }, read: { $0.optionalString(0) ?? "" }) ?? ""
    }

    /// Everyone with work under way (a pending check or clean-up), to resume after a restart.
    static func peopleWithWork(in db: Database) throws -> [(String, OnboardingStateMachine.PersistedPerson)] {
        try Row.fetchAll(
            db, sql: "SELECT \(personColumns) FROM person WHERE pendingCheck IS NOT NULL OR cleanup != ''"
        ).map { row in
            let columns = PersonRow(
                uid: row["uid"], profile: row["profile"], profileAsOf: row["profileAsOf"], sessions: row["sessions"],
                owesDismiss: row["owesDismiss"], pendingCheck: row["pendingCheck"], withdrawn: row["withdrawn"],
                cleanup: row["cleanup"], intentId: row["intentId"], intent: row["intent"], reason: row["reason"])
            return (columns.uid, columns.persisted)
        }
    }

    /// A route intent put in the outbox in this transaction: its route sequence and time.
    package struct PublishedIntent: Sendable, Hashable {
        package var intent: RouteIntent
        package var sequence: UInt64
        package var time: String
        /// The trace it continues (W3C text), for a store that writes it after deciding.
        package var traceparent: String?
        package var tracestate: String?

        package init(intent: RouteIntent, sequence: UInt64, time: String, traceparent: String? = nil, tracestate: String? = nil) {
            self.intent = intent
            self.sequence = sequence
            self.time = time
            self.traceparent = traceparent
            self.tracestate = tracestate
        }
    }

    /// Writes `person`'s row. `published`: the intent in force for them, emitted in this
    /// transaction; its route sequence and time go in with the row (one write per person per
    /// transaction).
    static func save(
        _ uid: String, _ person: OnboardingStateMachine.PersistedPerson, published: PublishedIntent? = nil, in db: Database
    ) throws {
        let row = PersonRow(uid: uid, person)
        func bindPerson(_ arguments: inout HotArguments) {
            arguments.bind(row.uid)
            arguments.bind(row.profile)
            arguments.bind(row.profileAsOf)
            arguments.bind(row.sessions)
            arguments.bind(row.owesDismiss)
            arguments.bind(row.pendingCheck)
            arguments.bind(row.withdrawn)
            arguments.bind(row.cleanup)
            arguments.bind(row.intentId)
            arguments.bind(row.intent)
            arguments.bind(row.reason)
        }
        if let published {
            try db.executeHot("""
                INSERT INTO person (uid, profile, profileAsOf, sessions, owesDismiss, pendingCheck, withdrawn, cleanup, intentId, intent, reason, intentSequence, intentTime)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (uid) DO UPDATE SET
                    profile = excluded.profile, profileAsOf = excluded.profileAsOf, sessions = excluded.sessions,
                    owesDismiss = excluded.owesDismiss,
                    pendingCheck = excluded.pendingCheck, withdrawn = excluded.withdrawn, cleanup = excluded.cleanup,
                    intentId = excluded.intentId, intent = excluded.intent, reason = excluded.reason,
                    intentSequence = excluded.intentSequence, intentTime = excluded.intentTime
                """
            ) {
                bindPerson(&$0)
                $0.bind(Int64(clamping: published.sequence))
                $0.bind(published.time)
            }
            return
        }
        // An intent that is no longer in force (a sign-out, a withdrawal) takes its route
        // sequence and time with it; one in force keeps what was recorded with it.
        try db.executeHot("""
                INSERT INTO person (uid, profile, profileAsOf, sessions, owesDismiss, pendingCheck, withdrawn, cleanup, intentId, intent, reason)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (uid) DO UPDATE SET
                    profile = excluded.profile, profileAsOf = excluded.profileAsOf, sessions = excluded.sessions,
                    owesDismiss = excluded.owesDismiss,
                    pendingCheck = excluded.pendingCheck, withdrawn = excluded.withdrawn, cleanup = excluded.cleanup,
                    intentId = excluded.intentId, intent = excluded.intent, reason = excluded.reason,
                    intentSequence = CASE WHEN excluded.intentId IS NULL THEN NULL ELSE intentSequence END,
                    intentTime = CASE WHEN excluded.intentId IS NULL THEN NULL ELSE intentTime END
                """, bindPerson)
    }

    /// Records `published` as the intent in force for its person.
    static func recordIntent(_ published: PublishedIntent, in db: Database) throws {
        let intent = published.intent
        try db.executeCached("""
                INSERT INTO person (uid, profile, intentId, intent, reason, intentSequence, intentTime)
                VALUES (?, 'unknown', ?, ?, ?, ?, ?)
                ON CONFLICT (uid) DO UPDATE SET
                    intentId = excluded.intentId, intent = excluded.intent, reason = excluded.reason,
                    intentSequence = excluded.intentSequence, intentTime = excluded.intentTime
                """, [intent.uid, intent.intentId, intent.intent.rawValue, intent.reason.rawValue, Int64(clamping: published.sequence), published.time])
    }

    // MARK: Route state

    static func routeState(of uid: String, in db: Database) throws -> RouteState {
        let row = try Row.fetchOne(
            db, sql: "SELECT uid, intentId, intent, reason, intentSequence, intentTime FROM person WHERE uid = ?",
            arguments: [uid])
        return row.map(routeState) ?? RouteState(uid: uid, intent: nil, sequence: nil, time: nil)
    }

    static func routeStates(after uid: String?, limit: Int, in db: Database) throws -> RouteStatePage {
        let rows = try Row.fetchAll(
            db,
            sql: """
                SELECT uid, intentId, intent, reason, intentSequence, intentTime FROM person
                WHERE intentId IS NOT NULL AND uid > ? ORDER BY uid LIMIT ?
                """,
            arguments: [uid ?? "", limit + 1])
        let states = rows.prefix(limit).map(routeState)
        return RouteStatePage(states: Array(states), nextUID: rows.count > limit ? states.last?.uid : nil)
    }

    private static func routeState(_ row: Row) -> RouteState {
        let uid: String = row["uid"]
        guard let intent = intent(uid: uid, id: row["intentId"], kind: row["intent"], reason: row["reason"]) else {
            return RouteState(uid: uid, intent: nil, sequence: nil, time: nil)
        }
        return RouteState(
            uid: uid, intent: intent, sequence: (row["intentSequence"] as Int64?).map { UInt64($0) }, time: row["intentTime"])
    }

    /// The intent in force stored in a person's row, if any.
    package static func intent(uid: String, id: String?, kind: String?, reason: String?) -> RouteIntent? {
        guard let id, let kind = kind.flatMap(RouteIntent.Kind.init(rawValue:)),
            let reason = reason.flatMap(RouteIntent.Reason.init(rawValue:))
        else { return nil }
        return RouteIntent(intentId: id, uid: uid, intent: kind, reason: reason)
    }

    // MARK: Cursors

    static func cursors(in db: Database) throws -> [String: UInt64] {
        var cursors: [String: UInt64] = [:]
        for row in try Row.fetchAll(db, sql: "SELECT publisher, sequence FROM cursor") {
            cursors[row["publisher"]] = UInt64(row["sequence"] as Int64)
        }
        return cursors
    }

    static func setCursor(_ publisher: String, to sequence: UInt64, in db: Database) throws {
        try db.executeHot("INSERT INTO cursor (publisher, sequence) VALUES (?, ?) ON CONFLICT (publisher) DO UPDATE SET sequence = excluded.sequence") {
            $0.bind(publisher)
            $0.bind(Int64(clamping: sequence))
        }
    }

    // MARK: Set-ups

    package typealias Setup = SetUpRecord

    /// - Returns: the set-up's attempt: one higher than any this store numbered before.
    static func beginSetup(_ setup: Setup, in db: Database) throws -> UInt64 {
        guard let attempt = try Int64.fetchOne(db, sql: "UPDATE setupAttempt SET last = last + 1 WHERE id = 1 RETURNING last") else {
            throw ServiceError(.internalError, "The orchestrator's store has no set-up attempt counter.")
        }
        try db.execute(
            sql: """
                INSERT INTO setup (uid, idempotencyKey, username, startedAt, attempt) VALUES (?, ?, ?, ?, ?)
                ON CONFLICT (uid, idempotencyKey) DO UPDATE SET
                    username = excluded.username, startedAt = excluded.startedAt, attempt = excluded.attempt
                """,
            arguments: [setup.uid, setup.idempotencyKey, setup.username, Timestamp.now(), attempt])
        return UInt64(attempt)
    }

    static func endSetup(_ setup: Setup, in db: Database) throws {
        try db.execute(
            sql: "DELETE FROM setup WHERE uid = ? AND idempotencyKey = ? AND attempt = ?",
            arguments: [setup.uid, setup.idempotencyKey, Int64(clamping: setup.attempt)])
    }

    static func endSetups(of uid: String, through attempt: UInt64, in db: Database) throws {
        try db.execute(
            sql: "DELETE FROM setup WHERE uid = ? AND attempt <= ?", arguments: [uid, Int64(clamping: attempt)])
    }

    static func isCurrentSetup(_ setup: Setup, in db: Database) throws -> Bool {
        let attempt = Int64(clamping: setup.attempt)
        return try Bool.fetchOne(
            db,
            sql: """
                SELECT EXISTS (SELECT 1 FROM setup WHERE uid = ? AND idempotencyKey = ? AND attempt = ?)
                   AND NOT EXISTS (SELECT 1 FROM setup WHERE uid = ? AND attempt > ?)
                """,
            arguments: [setup.uid, setup.idempotencyKey, attempt, setup.uid, attempt]) ?? false
    }

    static func unfinishedSetups(in db: Database) throws -> [Setup] {
        try Row.fetchAll(db, sql: "SELECT uid, idempotencyKey, username, attempt FROM setup").map {
            Setup(
                uid: $0["uid"], idempotencyKey: $0["idempotencyKey"], username: $0["username"],
                attempt: UInt64(clamping: $0["attempt"] as Int64))
        }
    }
}
