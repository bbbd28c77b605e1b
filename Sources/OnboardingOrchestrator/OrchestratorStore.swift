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
enum OrchestratorStore {
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

    static func person(_ uid: String, in db: Database) throws -> OnboardingStateMachine.PersistedPerson? {
        guard let row = try Row.fetchOne(
            db.cachedStatement(sql: "SELECT \(personColumns) FROM person WHERE uid = ?"), arguments: [uid])
        else { return nil }
        return persisted(row)
    }

    /// Everyone with work under way (a pending check or clean-up), to resume after a restart.
    static func peopleWithWork(in db: Database) throws -> [(String, OnboardingStateMachine.PersistedPerson)] {
        try Row.fetchAll(
            db, sql: "SELECT \(personColumns) FROM person WHERE pendingCheck IS NOT NULL OR cleanup != ''"
        ).map { (($0["uid"] as String), persisted($0)) }
    }

    private static func persisted(_ row: Row) -> OnboardingStateMachine.PersistedPerson {
        let profile: OnboardingStateMachine.ProfileKnowledge =
            switch row["profile"] as String {
            case "present": .present
            case "absent": .absent
            default: .unknown
            }
        let cleanup = (row["cleanup"] as String).split(separator: ",").compactMap { OnboardingStateMachine.CleanupStep(rawValue: String($0)) }
        return .init(
            profile: profile, profileAsOf: UInt64(clamping: row["profileAsOf"] as Int64), sessions: row["sessions"],
            intent: routeState(row).intent,
            owesDismiss: row["owesDismiss"],
            pendingCheck: (row["pendingCheck"] as String?).flatMap(RouteIntent.Reason.init(rawValue:)),
            withdrawn: row["withdrawn"], cleanup: Set(cleanup))
    }

    /// A route intent put in the outbox in this transaction: its route sequence and time.
    struct PublishedIntent {
        var intent: RouteIntent
        var sequence: UInt64
        var time: String
    }

    /// Writes `person`'s row. `published`: the intent emitted for them in this transaction, if
    /// any; when it is the one in force, its route sequence and time go in with the row (one
    /// write per person per transaction).
    static func save(
        _ uid: String, _ person: OnboardingStateMachine.PersistedPerson, published: PublishedIntent? = nil, in db: Database
    ) throws {
        let profile: String =
            switch person.profile {
            case .present: "present"
            case .absent: "absent"
            case .unknown: "unknown"
            }
        let cleanup = OnboardingStateMachine.CleanupStep.allCases.filter(person.cleanup.contains).map(\.rawValue).joined(separator: ",")
        var published = published
        if let emitted = published, emitted.intent.intentId != person.intent?.intentId {
            // Emitted, then replaced or withdrawn within the transaction: recorded as it was,
            // then the row below says what is in force now.
            try recordIntent(emitted, in: db)
            published = nil
        }
        var arguments: StatementArguments = [
            uid, profile, Int64(clamping: person.profileAsOf), person.sessions, person.owesDismiss, person.pendingCheck?.rawValue,
            person.withdrawn, cleanup, person.intent?.intentId, person.intent?.intent.rawValue,
            person.intent?.reason.rawValue,
        ]
        if let published {
            arguments += [Int64(clamping: published.sequence), published.time]
            try db.executeCached("""
                INSERT INTO person (uid, profile, profileAsOf, sessions, owesDismiss, pendingCheck, withdrawn, cleanup, intentId, intent, reason, intentSequence, intentTime)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (uid) DO UPDATE SET
                    profile = excluded.profile, profileAsOf = excluded.profileAsOf, sessions = excluded.sessions,
                    owesDismiss = excluded.owesDismiss,
                    pendingCheck = excluded.pendingCheck, withdrawn = excluded.withdrawn, cleanup = excluded.cleanup,
                    intentId = excluded.intentId, intent = excluded.intent, reason = excluded.reason,
                    intentSequence = excluded.intentSequence, intentTime = excluded.intentTime
                """, arguments)
            return
        }
        // An intent that is no longer in force (a sign-out, a withdrawal) takes its route
        // sequence and time with it; one in force keeps what was recorded with it.
        try db.executeCached("""
                INSERT INTO person (uid, profile, profileAsOf, sessions, owesDismiss, pendingCheck, withdrawn, cleanup, intentId, intent, reason)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (uid) DO UPDATE SET
                    profile = excluded.profile, profileAsOf = excluded.profileAsOf, sessions = excluded.sessions,
                    owesDismiss = excluded.owesDismiss,
                    pendingCheck = excluded.pendingCheck, withdrawn = excluded.withdrawn, cleanup = excluded.cleanup,
                    intentId = excluded.intentId, intent = excluded.intent, reason = excluded.reason,
                    intentSequence = CASE WHEN excluded.intentId IS NULL THEN NULL ELSE intentSequence END,
                    intentTime = CASE WHEN excluded.intentId IS NULL THEN NULL ELSE intentTime END
                """, arguments)
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
        guard let id: String = row["intentId"],
            let kind = (row["intent"] as String?).flatMap(RouteIntent.Kind.init(rawValue:)),
            let reason = (row["reason"] as String?).flatMap(RouteIntent.Reason.init(rawValue:))
        else { return RouteState(uid: uid, intent: nil, sequence: nil, time: nil) }
        return RouteState(
            uid: uid, intent: RouteIntent(intentId: id, uid: uid, intent: kind, reason: reason),
            sequence: (row["intentSequence"] as Int64?).map { UInt64($0) }, time: row["intentTime"])
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
        try db.executeCached("INSERT INTO cursor (publisher, sequence) VALUES (?, ?) ON CONFLICT (publisher) DO UPDATE SET sequence = excluded.sequence", [publisher, Int64(clamping: sequence)])
    }

    // MARK: Set-ups

    struct Setup: Sendable, Hashable {
        var uid: String
        var idempotencyKey: String
        var username: String
    }

    static func beginSetup(_ setup: Setup, in db: Database) throws {
        try db.execute(
            sql: """
                INSERT INTO setup (uid, idempotencyKey, username, startedAt) VALUES (?, ?, ?, ?)
                ON CONFLICT (uid, idempotencyKey) DO UPDATE SET
                    username = excluded.username, startedAt = excluded.startedAt
                """,
            arguments: [setup.uid, setup.idempotencyKey, setup.username, Timestamp.now()])
    }

    static func endSetup(uid: String, idempotencyKey: String, in db: Database) throws {
        try db.execute(sql: "DELETE FROM setup WHERE uid = ? AND idempotencyKey = ?", arguments: [uid, idempotencyKey])
    }

    static func unfinishedSetups(in db: Database) throws -> [Setup] {
        try Row.fetchAll(db, sql: "SELECT uid, idempotencyKey, username FROM setup").map {
            Setup(uid: $0["uid"], idempotencyKey: $0["idempotencyKey"], username: $0["username"])
        }
    }
}
