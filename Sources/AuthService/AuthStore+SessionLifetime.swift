import Foundation
import GRDB
import Messaging
import OnboardingAPI
import ServiceRuntime
import Synchronization

/// Sessions that end by themselves (``SessionPolicy``): the last use of each session, expiry,
/// the cap per account, and pruning. Kept apart from the sign-in and sign-out transactions,
/// which call in here.
extension AuthStore {
    static let pruneBatch = SessionPruneSchedule.batch
    typealias PruneSchedule = SessionPruneSchedule

    static func registerSessionLifetimeMigration(in migrator: inout DatabaseMigrator) {
        migrator.registerMigration("auth-v4-session-last-use") { db in
            try db.alter(table: "session") { table in
                table.add(column: "lastUsedAt", .text).notNull().defaults(to: "")
            }
            // Sessions from before count as used when they were made.
            try db.execute(sql: "UPDATE session SET lastUsedAt = createdAt")
            try db.create(index: "session_lastUsedAt", on: "session", columns: ["lastUsedAt"])
        }
    }

    /// In a sign-in's transaction, after its session of `uid` was added: ends `uid`'s sessions
    /// beyond the cap (least recently used first) and its expired ones (nothing to do for a new
    /// account), and prunes up to ``pruneBatch`` expired sessions of other accounts, telling about
    /// each such account with `SignedOut` (its sessions left). Two indexed look-ups when there is
    /// nothing to end.
    static func applySessionPolicy(
        _ policy: SessionPolicy, uid: String, isNewAccount: Bool, now: Date, outbox: Outbox, correlationId: String,
        pruning: PruneSchedule, in db: Database
    ) throws {
        let cutoff = Timestamp.format(policy.expiryCutoff(now: now))
        if !isNewAccount {
            let sessions = try Row.fetchAll(
                db.cachedStatement(sql: "SELECT id, token, lastUsedAt FROM session WHERE uid = ? ORDER BY lastUsedAt DESC, id DESC"),
                arguments: [uid])
            let endings = policy.endings(atSignIn: sessions, now: now) { Timestamp.parse($0["lastUsedAt"]) ?? .distantPast }
            for (row, ending) in endings {
                try db.execute(sql: "DELETE FROM session WHERE id = ?", arguments: [row["id"] as Int64])
                try recordEnding(ending, digest: row["token"], uid: uid, at: now, in: db)
            }
        }
        guard pruning.isDue(at: now) else { return }
        let stale = try Row.fetchAll(
            db.cachedStatement(sql: "SELECT id, token, uid FROM session WHERE lastUsedAt <= ? AND uid != ? LIMIT ?"),
            arguments: [cutoff, uid, pruneBatch])
        pruning.looked(at: now, found: stale.count)
        var accounts: Set<String> = []
        for row in stale {
            let (id, token, owner): (Int64, String, String) = (row["id"], row["token"], row["uid"])
            try db.execute(sql: "DELETE FROM session WHERE id = ?", arguments: [id])
            try recordEnding(.expired, digest: token, uid: owner, at: now, in: db)
            accounts.insert(owner)
        }
        for owner in accounts.sorted() {
            try outbox.append(
                SignedOut(uid: owner, sessions: try liveSessionCount(of: owner, in: db)), uid: owner,
                correlationId: correlationId, in: db)
        }
    }

    static func lookUp(token: String, policy: SessionPolicy, now: Date, in db: Database) throws -> SessionLookup {
        let key = SessionKey(token: token)
        let (condition, arguments) = key.condition
        guard !token.isEmpty,
            let row = try Row.fetchOne(
                db.cachedStatement(sql: "SELECT uid, lastUsedAt FROM session WHERE \(condition)"), arguments: arguments)
        else {
            return .ended(token.isEmpty ? nil : try ended(digest: key.digest, asOf: now, in: db)?.ending)
        }
        return .found(uid: row["uid"], lastUsed: Timestamp.parse(row["lastUsedAt"]) ?? .distantPast, policy: policy, now: now)
    }

    /// The uid of `token`'s live session, sliding its expiry when its last recorded use is old
    /// enough; an expired session is ended (with `SignedOut` for its account) and refused.
    ///
    /// - Throws: `unauthenticated`, with reason `sessionExpired` or `sessionEvicted` when the
    ///   session ended that way within the last day.
    func liveSessionUID(token: String) async throws -> String {
        let (policy, now, outbox) = (sessions, clock(), self.outbox)
        let key = SessionKey(token: token)
        let (condition, arguments) = key.condition
        let found = try await withStore(database, write: false, logger: logger) { db in
            try Self.lookUp(token: token, policy: policy, now: now, in: db)
        }
        switch found {
        case .live(let uid, renew: false):
            return uid
        case .live(let uid, renew: true):
            try await withStore(database, logger: logger) { db in
                try db.execute(
                    sql: "UPDATE session SET lastUsedAt = ? WHERE \(condition)",
                    arguments: [Timestamp.format(now)] + arguments)
            }
            return uid
        case .expired(let uid):
            try await withStore(database, logger: logger) { db in
                try db.execute(sql: "DELETE FROM session WHERE \(condition)", arguments: arguments)
                guard db.changesCount > 0 else { return }  // another request ended it first
                try Self.recordEnding(.expired, digest: key.digest, uid: uid, at: now, in: db)
                try outbox.append(
                    SignedOut(uid: uid, sessions: try Self.liveSessionCount(of: uid, in: db)), uid: uid,
                    correlationId: UUID().uuidString.lowercased(), in: db)
            }
            throw SessionRefusal.expired
        case .ended(let ending):
            throw SessionRefusal.of(ending)
        }
    }

    /// Whether `key`'s session exists but has expired at `now` (a withdrawal must not use it).
    static func isExpired(_ key: SessionKey, policy: SessionPolicy, now: Date, in db: Database) throws -> Bool {
        let (condition, arguments) = key.condition
        guard
            let lastUsed = try String.fetchOne(
                db, sql: "SELECT lastUsedAt FROM session WHERE \(condition)", arguments: arguments)
        else { return false }
        return policy.isExpired(lastUsed: Timestamp.parse(lastUsed) ?? .distantPast, now: now)
    }

    static func liveSessionCount(of uid: String, in db: Database) throws -> Int {
        try Int.fetchOne(db.cachedStatement(sql: "SELECT COUNT(*) FROM session WHERE uid = ?"), arguments: [uid]) ?? 0
    }
}
