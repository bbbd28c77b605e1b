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
    /// How many expired sessions of other accounts one sign-in prunes, at most (each with a
    /// `SignedOut` event for its account), so that pruning costs every sign-in little and
    /// still drains what expires.
    static let pruneBatch = 16

    /// When sign-ins next look for other accounts' expired sessions: at most once a second
    /// while a look finds fewer than ``AuthStore/pruneBatch`` (an expired session is refused
    /// when presented whether or not it was pruned yet), at once after a full one.
    final class PruneSchedule: Sendable {
        private let next = Mutex(Date.distantPast)

        static let interval: TimeInterval = 1

        /// Whether a sign-in at `now` should look.
        func isDue(at now: Date) -> Bool {
            next.withLock { now >= $0 }
        }

        /// A look at `now` found `count` sessions to prune.
        func looked(at now: Date, found count: Int) {
            next.withLock { $0 = count >= AuthStore.pruneBatch ? .distantPast : now.addingTimeInterval(Self.interval) }
        }
    }

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
            let expired = sessions.filter { ($0["lastUsedAt"] as String) < cutoff }
            let evicted = policy.evicted(sessions)
            var ended: Set<Int64> = []
            for (row, ending) in expired.map({ ($0, SessionEnding.expired) }) + evicted.map({ ($0, .evicted) }) {
                let id: Int64 = row["id"]
                guard ended.insert(id).inserted else { continue }
                try db.execute(sql: "DELETE FROM session WHERE id = ?", arguments: [id])
                try recordEnding(ending, digest: row["token"], uid: uid, at: now, in: db)
            }
        }
        guard pruning.isDue(at: now) else { return }
        let stale = try Row.fetchAll(
            db.cachedStatement(sql: "SELECT id, token, uid FROM session WHERE lastUsedAt < ? AND uid != ? LIMIT ?"),
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

    /// What a session token is, as of `now`: a read, for the bus's thread.
    enum SessionLookup: Sendable, Hashable {
        /// Live; `renew`: its last use should be recorded (a write) to slide its expiry.
        case live(uid: String, renew: Bool)
        /// Past its lifetime, not yet ended in the store.
        case expired(uid: String)
        /// Not a session (any more): how it ended, when that is known.
        case ended(SessionEnding?)
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
        let uid: String = row["uid"]
        let lastUsed = Timestamp.parse(row["lastUsedAt"]) ?? .distantPast
        if policy.isExpired(lastUsed: lastUsed, now: now) { return .expired(uid: uid) }
        return .live(uid: uid, renew: policy.needsRenewal(lastUsed: lastUsed, now: now))
    }

    /// The error for a token that is not a live session.
    static func refusal(_ ending: SessionEnding?) -> ServiceError {
        switch ending {
        case .expired?: sessionExpired
        case .evicted?: sessionEvicted
        default: unauthenticatedSession
        }
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
            throw Self.sessionExpired
        case .ended(let ending):
            throw Self.refusal(ending)
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

    static let sessionExpired = ServiceError(
        .unauthenticated, "The session expired: it was not used for too long. Sign in again.", reason: "sessionExpired")
    static let sessionEvicted = ServiceError(
        .unauthenticated,
        "The session was ended because the account signed in on too many devices (the oldest session ends). Sign in again.",
        reason: "sessionEvicted")
    static let unauthenticatedSession = ServiceError(
        .unauthenticated, "The session token is not valid: it is unknown, signed out or withdrawn. Sign in again.")
}
