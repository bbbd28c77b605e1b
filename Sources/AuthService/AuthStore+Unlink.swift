import Foundation
import GRDB
import Messaging
import OnboardingAPI
import ServiceRuntime

// Unlinking at the provider on withdrawal: what each account's sign-in left to unlink with
// (`providerGrant`), and the durable queue of unlinks (`unlinkJob`), written in the withdrawal's
// own transaction so that a crash cannot lose one.
//
// Both tables hold provider tokens (Apple refresh tokens, Naver and Google access tokens): they
// are secrets at rest, protected like the rest of the database (0600), and never logged.
extension AuthStore {
    static func registerUnlinkMigration(in migrator: inout DatabaseMigrator) {
        migrator.registerMigration("auth-v6-provider-unlink") { db in
            // Goes with the account: a withdrawal copies it into the job, then deletes both.
            try db.create(table: "providerGrant") { table in
                table.column("uid", .text).primaryKey().references("account", onDelete: .cascade)
                table.column("provider", .text).notNull()
                table.column("token", .text).notNull()
                table.column("updatedAt", .text).notNull()
            }
            // No reference to account: the job outlives it.
            try db.create(table: "unlinkJob") { table in
                table.column("uid", .text).primaryKey()
                table.column("provider", .text).notNull()
                table.column("subject", .text).notNull()
                table.column("token", .text)
                table.column("attempts", .integer).notNull().defaults(to: 0)
                table.column("createdAt", .text).notNull()
                table.column("nextAttemptAt", .text).notNull().indexed()
                table.column("lastError", .text)
                table.column("lastAttemptAt", .text)
            }
        }
    }

    /// Queues the unlink of `uid`'s account, with the token its sign-in left, inside the
    /// withdrawal's transaction. Call before the account is deleted.
    static func enqueueUnlink(uid: String, now: Date, in db: Database) throws {
        let stamp = Timestamp.format(now)
        try db.execute(
            sql: """
                INSERT OR REPLACE INTO unlinkJob (uid, provider, subject, token, attempts, createdAt, nextAttemptAt)
                SELECT account.uid, account.provider, account.subject, providerGrant.token, 0, ?, ?
                FROM account LEFT JOIN providerGrant ON providerGrant.uid = account.uid
                WHERE account.uid = ?
                """,
            arguments: [stamp, stamp, uid])
    }

    /// Keeps `token` as what unlinking `uid`'s account at `provider` takes (the newest sign-in's).
    /// Nothing happens when the account is gone (withdrawn meanwhile).
    func recordGrant(uid: String, provider: Provider, token: String) async throws {
        let now = Timestamp.format(clock())
        try await withStore(database, logger: logger) { db in
            try db.execute(
                sql: """
                    INSERT INTO providerGrant (uid, provider, token, updatedAt)
                    SELECT uid, ?, ?, ? FROM account WHERE uid = ?
                    ON CONFLICT (uid) DO UPDATE SET token = excluded.token, updatedAt = excluded.updatedAt
                    """,
                arguments: [provider.rawValue, token, now, uid])
        }
    }

    // The worker's own queries throw the database's errors as they are (a cancellation at
    // shutdown included): the worker logs what is not a cancellation.

    /// Up to `limit` jobs whose next attempt is due at `now`, the longest due first. The lease is
    /// not recorded: one process owns a SQLite store, and its one worker is the only claimant.
    func claimDueUnlinkJobs(at now: Date, limit: Int, lease: TimeInterval) async throws -> [UnlinkJob] {
        try await database.read { db in
            try Row.fetchAll(
                db, sql: "SELECT * FROM unlinkJob WHERE nextAttemptAt <= ? ORDER BY nextAttemptAt LIMIT ?",
                arguments: [Timestamp.format(now), limit]
            ).compactMap(Self.unlinkJob)
        }
    }

    /// When the next job is due (`nil`: the queue is empty).
    func nextUnlinkAttempt() async throws -> Date? {
        try await database.read { db in
            try String.fetchOne(db, sql: "SELECT MIN(nextAttemptAt) FROM unlinkJob").flatMap(Timestamp.parse)
        }
    }

    /// Carries out `step` for `job`: deletes it, or records the failure and the next attempt.
    func apply(_ step: UnlinkStep, to job: UnlinkJob, at now: Date) async throws {
        try await database.write { db in
            switch step {
            case .unlinked, .refused:
                try db.execute(sql: "DELETE FROM unlinkJob WHERE uid = ?", arguments: [job.uid])
            case .retry(let at, let attempts, let error):
                try db.execute(
                    sql: "UPDATE unlinkJob SET attempts = ?, nextAttemptAt = ?, lastError = ?, lastAttemptAt = ? WHERE uid = ?",
                    arguments: [attempts, Timestamp.format(at), error, Timestamp.format(now), job.uid])
            }
        }
    }

    func unlinkQueueStatus(at now: Date) async throws -> UnlinkQueueStatus {
        try await database.read { db in try Self.unlinkQueueStatus(at: now, in: db) }
    }

    /// The queue as `health` shows it; `lastError` is the newest failure recorded on a pending job.
    static func unlinkQueueStatus(at now: Date, in db: Database) throws -> UnlinkQueueStatus {
        let row = try Row.fetchOne(db, sql: "SELECT COUNT(*) AS pending, MIN(createdAt) AS oldest FROM unlinkJob")
        let error = try Row.fetchOne(
            db,
            sql: "SELECT lastError, lastAttemptAt FROM unlinkJob WHERE lastError IS NOT NULL ORDER BY lastAttemptAt DESC LIMIT 1")
        let oldest = (row?["oldest"] as String?).flatMap(Timestamp.parse)
        return UnlinkQueueStatus(
            pending: row?["pending"] ?? 0, oldestPendingSeconds: oldest.map { max(0, Int(now.timeIntervalSince($0))) },
            lastError: error?["lastError"], lastErrorAt: error?["lastAttemptAt"])
    }

    private static func unlinkJob(_ row: Row) -> UnlinkJob? {
        guard let provider = Provider(rawValue: row["provider"]), let createdAt = Timestamp.parse(row["createdAt"]),
            let next = Timestamp.parse(row["nextAttemptAt"])
        else { return nil }
        return UnlinkJob(
            uid: row["uid"], provider: provider, subject: row["subject"], token: row["token"], attempts: row["attempts"],
            createdAt: createdAt, nextAttemptAt: next, lastError: row["lastError"])
    }
}
