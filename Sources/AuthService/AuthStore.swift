import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime

/// Accounts and sessions in SQLite, with the events each change causes written to the outbox in
/// the same transaction.
///
/// Also auth's own ``SessionVerifier``: `.session` requests are checked against this store.
///
/// Ended sessions: a sign-out or withdrawal records the session it ended (the token's digest,
/// the uid, how it ended, when) in the `endedSession` table, in the transaction that ends it,
/// so a retry whose first reply was lost gets the same answer and publishes nothing more:
/// - a sign-out of a session that was signed out, or withdrawn, answers its uid (sign-out asks
///   for the session to be over, and it is);
/// - a withdrawal of a session that was withdrawn answers its uid; of one that was only signed
///   out, it is `unauthenticated` (an ended session cannot delete the account).
///
/// An ended session is remembered for ``endedSessionRetention`` (24 hours), then forgotten:
/// a retry after that is `unauthenticated`. Each sign-out and withdrawal deletes the rows older
/// than that. Only the token the request carried is remembered: another session that a
/// withdrawal ended is `unauthenticated` for both. An ended session never verifies
/// (``uid(forSessionToken:)`` is `unauthenticated`).
///
/// Thread safety: immutable; every method may be called from any task. GRDB serializes writes.
struct AuthStore: AuthStorage {
    /// How long ended sessions are remembered for retries.
    static let endedSessionRetention = SessionEnding.retention

    let database: any DatabaseWriter
    let outbox: Outbox
    var logger: Logger? = nil
    /// The time ended sessions are stamped and judged with (tests move it).
    var clock: @Sendable () -> Date = { Date() }
    /// How long sessions live and how many an account may hold.
    var sessions = SessionPolicy()
    /// When sign-ins next prune other accounts' expired sessions.
    let pruning = PruneSchedule()

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        Outbox.registerMigration(in: &migrator)
        migrator.registerMigration("auth-v1") { db in
            try db.create(table: "account") { table in
                table.column("uid", .text).primaryKey()
                table.column("provider", .text).notNull()
                table.column("subject", .text).notNull()
                table.column("createdAt", .text).notNull()
                table.uniqueKey(["provider", "subject"])
            }
            try db.create(table: "session") { table in
                table.column("token", .text).primaryKey()
                table.column("uid", .text).notNull().indexed().references("account", onDelete: .cascade)
                table.column("createdAt", .text).notNull()
            }
        }
        migrator.registerMigration("auth-v2-hashed-session-tokens") { db in
            // Sessions are looked up by the SHA-256 of their token: a copy of the database does
            // not hand out live sessions.
            let tokens = try String.fetchAll(db, sql: "SELECT token FROM session")
            for token in tokens {
                try db.execute(
                    sql: "UPDATE session SET token = ? WHERE token = ?", arguments: [SessionToken.digest(token), token])
            }
        }
        migrator.registerMigration("auth-v3-ended-sessions") { db in
            // No reference to account: a withdrawal deletes the account, and the record of how
            // its session ended must stay.
            try db.create(table: "endedSession") { table in
                table.column("token", .text).primaryKey()
                table.column("uid", .text).notNull()
                table.column("ending", .text).notNull()
                table.column("endedAt", .text).notNull().indexed()
            }
        }
        registerSessionLifetimeMigration(in: &migrator)
        migrator.registerMigration("auth-v5-session-ids") { db in
            // Sessions keyed by a number that grows (the row id, which the token carries)
            // instead of by the digest of a random token: a new session is appended to the
            // table instead of dirtying a random page of an index. Earlier sessions keep their
            // digest in `legacyToken`, indexed only where it is set.
            try db.execute(
                sql: """
                    CREATE TABLE session_v5 (
                      id INTEGER PRIMARY KEY,
                      token TEXT NOT NULL,
                      legacyToken TEXT,
                      uid TEXT NOT NULL REFERENCES account(uid) ON DELETE CASCADE,
                      createdAt TEXT NOT NULL,
                      lastUsedAt TEXT NOT NULL);
                    INSERT INTO session_v5 (id, token, legacyToken, uid, createdAt, lastUsedAt)
                      SELECT rowid, token, token, uid, createdAt, lastUsedAt FROM session;
                    DROP TABLE session;
                    ALTER TABLE session_v5 RENAME TO session;
                    CREATE INDEX session_uid ON session(uid);
                    CREATE INDEX session_lastUsedAt ON session(lastUsedAt);
                    CREATE INDEX session_legacyToken ON session(legacyToken) WHERE legacyToken IS NOT NULL;
                    """)
        }
        registerUnlinkMigration(in: &migrator)
        migrator.registerMigration("auth-v7-account-without-rowid") { db in
            // Keyed by uid alone: a new account was written to the table and to the index of its
            // uid, two pages per commit; without a row id it is one. (GRDB runs this with foreign
            // keys off and checks them before it commits: sessions and grants keep their account.)
            try db.execute(
                sql: """
                    CREATE TABLE account_v7 (
                      uid TEXT PRIMARY KEY NOT NULL,
                      provider TEXT NOT NULL,
                      subject TEXT NOT NULL,
                      createdAt TEXT NOT NULL,
                      UNIQUE (provider, subject)
                    ) WITHOUT ROWID;
                    INSERT INTO account_v7 (uid, provider, subject, createdAt) SELECT uid, provider, subject, createdAt FROM account;
                    DROP TABLE account;
                    ALTER TABLE account_v7 RENAME TO account;
                    """)
        }
        return migrator
    }

    /// Finds or creates the account of (provider, subject) and opens a session for it.
    ///
    /// Race-safe across tasks and processes: the insert yields to the UNIQUE(provider, subject)
    /// constraint, so simultaneous first sign-ins of one account all read back the same uid.
    func signIn(provider: Provider, subject: String, correlationId: String) async throws -> SignInResult {
        let (outbox, policy, clock, pruning) = (self.outbox, sessions, clock, pruning)
        return try await withStore(database, logger: logger) { db in
            try Self.signIn(
                provider: provider, subject: subject, correlationId: correlationId, outbox: outbox, sessions: policy,
                pruning: pruning, now: clock(), in: db)
        }
    }

    /// ``signIn(provider:subject:correlationId:)`` inside the caller's write transaction: auth's
    /// hot path, many sign-ins to one transaction. `sessions` and `now` decide which of the
    /// account's sessions end with it (``applySessionPolicy(_:uid:isNewAccount:now:outbox:correlationId:pruning:in:)``).
    static func signIn(
        provider: Provider, subject: String, correlationId: String, outbox: Outbox, sessions policy: SessionPolicy,
        pruning: PruneSchedule, now date: Date, in db: Database
    ) throws -> SignInResult {
        // Time-ordered: new accounts (and the orchestrator's people) go to the end of their
        // tables' indexes.
        let candidateUID = Identifier.timeOrdered()
        let secret = SessionToken.makeSecret()
        let now = Timestamp.format(date)
        try db.executeHot(
            """
            INSERT INTO account (uid, provider, subject, createdAt) VALUES (?, ?, ?, ?)
            ON CONFLICT (provider, subject) DO NOTHING
            """
        ) {
            $0.bind(candidateUID)
            $0.bind(provider.rawValue)
            $0.bind(subject)
            $0.bind(now)
        }
        let isNewAccount = db.changesCount > 0
        let uid: String
        if isNewAccount {
            uid = candidateUID
        } else {
            guard
                let existing = try String.fetchOne(
                    db.cachedStatement(sql: "SELECT uid FROM account WHERE provider = ? AND subject = ?"),
                    arguments: [provider.rawValue, subject])
            else {
                throw ServiceError(.internalError, "The account vanished while signing in; try again.")
            }
            uid = existing
        }
        try db.executeHot("INSERT INTO session (token, uid, createdAt, lastUsedAt) VALUES (?, ?, ?, ?)") {
            $0.bind(SessionToken.digest(secret))
            $0.bind(uid)
            $0.bind(now)
            $0.bind(now)
        }
        let token = SessionToken.token(id: db.lastInsertedRowID, secret: secret)
        try applySessionPolicy(
            policy, uid: uid, isNewAccount: isNewAccount, now: date, outbox: outbox, correlationId: correlationId,
            pruning: pruning, in: db)
        // A new account has this one session; no need to count.
        let sessions = isNewAccount ? 1 : try liveSessions(of: uid, in: db)
        try outbox.append(
            SignedIn(uid: uid, provider: provider, isNewAccount: isNewAccount, sessions: sessions),
            uid: uid, correlationId: correlationId, in: db)
        return SignInResult(uid: uid, sessionToken: token, provider: provider, isNewAccount: isNewAccount)
    }

    /// Ends the session of `token` and records `SignedOut`; a retry answers the same without
    /// recording anything (see the type's notes on ended sessions).
    ///
    /// - Returns: the session's uid.
    /// - Throws: `unauthenticated` when the token is neither a live session nor one that ended
    ///   (signed out or withdrawn) within ``endedSessionRetention``.
    func signOut(token: String, everywhere: Bool = false, correlationId: String) async throws -> String {
        let (outbox, now) = (self.outbox, clock())
        return try await withStore(database, logger: logger) { db in
            let key = SessionKey(token: token)
            let digest = key.digest
            if let (id, uid) = try Self.liveSession(key, in: db) {
                try db.execute(sql: "DELETE FROM session WHERE id = ?", arguments: [id])
                if everywhere { try db.execute(sql: "DELETE FROM session WHERE uid = ?", arguments: [uid]) }
                try Self.recordEnding(.signOut, digest: digest, uid: uid, at: now, in: db)
                try outbox.append(
                    SignedOut(uid: uid, sessions: try Self.liveSessions(of: uid, in: db)), uid: uid,
                    correlationId: correlationId, in: db)
                return uid
            }
            if let ended = try Self.ended(digest: digest, asOf: now, in: db) { return ended.uid }
            throw Self.unauthenticated
        }
    }

    /// Deletes the account of `token`'s session, and with it every session of that account, and
    /// records `Withdrawn`; a retry answers the same without recording anything (see the type's
    /// notes on ended sessions).
    ///
    /// - Returns: the deleted account's uid.
    /// - Throws: `unauthenticated` when the token is neither a live session nor one that was
    ///   withdrawn within ``endedSessionRetention`` (a signed-out session cannot withdraw).
    func withdraw(token: String, correlationId: String) async throws -> String {
        let (outbox, now, policy) = (self.outbox, clock(), sessions)
        return try await withStore(database, logger: logger) { db in
            let key = SessionKey(token: token)
            let digest = key.digest
            if let (_, uid) = try Self.liveSession(key, in: db),
                try !Self.isExpired(key, policy: policy, now: now, in: db)
            {
                try Self.enqueueUnlink(uid: uid, now: now, in: db)
                try db.execute(sql: "DELETE FROM account WHERE uid = ?", arguments: [uid])
                try Self.recordEnding(.withdrawal, digest: digest, uid: uid, at: now, in: db)
                try outbox.append(Withdrawn(uid: uid), uid: uid, correlationId: correlationId, in: db)
                return uid
            }
            if let ended = try Self.ended(digest: digest, asOf: now, in: db), ended.ending.answersWithdrawal { return ended.uid }
            throw Self.unauthenticated
        }
    }

    /// Records that the session with `digest` ended, and forgets the endings older than the
    /// retention window (an indexed range delete, so each ending pays for the few before it).
    static func recordEnding(_ ending: SessionEnding, digest: String, uid: String, at now: Date, in db: Database) throws {
        try db.execute(
            sql: "DELETE FROM endedSession WHERE endedAt < ?",
            arguments: [Timestamp.format(now.addingTimeInterval(-endedSessionRetention))])
        try db.execute(
            sql: "INSERT OR REPLACE INTO endedSession (token, uid, ending, endedAt) VALUES (?, ?, ?, ?)",
            arguments: [digest, uid, ending.rawValue, Timestamp.format(now)])
    }

    /// How the session with `digest` ended, if it did within the retention window before `now`.
    static func ended(digest: String, asOf now: Date, in db: Database) throws -> (uid: String, ending: SessionEnding)? {
        let cutoff = Timestamp.format(now.addingTimeInterval(-endedSessionRetention))
        guard
            let row = try Row.fetchOne(
                db, sql: "SELECT uid, ending FROM endedSession WHERE token = ? AND endedAt >= ?", arguments: [digest, cutoff]),
            let ending = SessionEnding(rawValue: row["ending"])
        else { return nil }
        return (row["uid"], ending)
    }

    /// The uid of `token`'s live session; a use that slides its expiry (see ``SessionPolicy``).
    func uid(forSessionToken token: String) async throws -> String {
        try await liveSessionUID(token: token)
    }

    func events(after sequence: UInt64, limit: Int?) async throws -> EventPage {
        try await withStore(database, write: false, logger: logger) { db in
            try Outbox.events(after: sequence, limit: limit, in: db)
        }
    }

    /// How many live sessions `uid` has, as of the current transaction.
    private static func liveSessions(of uid: String, in db: Database) throws -> Int {
        try Int.fetchOne(db.cachedStatement(sql: "SELECT COUNT(*) FROM session WHERE uid = ?"), arguments: [uid]) ?? 0
    }

    /// The row id and uid of `key`'s live session, or `nil`.
    private static func liveSession(_ key: SessionKey, in db: Database) throws -> (id: Int64, uid: String)? {
        let (condition, arguments) = key.condition
        guard let row = try Row.fetchOne(db, sql: "SELECT id, uid FROM session WHERE \(condition)", arguments: arguments)
        else { return nil }
        return (row["id"], row["uid"])
    }

    private static let unauthenticated = SessionRefusal.unknown
}
