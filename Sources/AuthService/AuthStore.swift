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
/// Thread safety: immutable; every method may be called from any task. GRDB serializes writes.
struct AuthStore: SessionVerifier {
    let database: any DatabaseWriter
    let outbox: Outbox
    var logger: Logger? = nil

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
        return migrator
    }

    /// Finds or creates the account of (provider, subject) and opens a session for it.
    ///
    /// Race-safe across tasks and processes: the insert yields to the UNIQUE(provider, subject)
    /// constraint, so simultaneous first sign-ins of one account all read back the same uid.
    func signIn(provider: Provider, subject: String, correlationId: String) async throws -> SignInResult {
        let candidateUID = UUID().uuidString.lowercased()
        let token = SessionToken.make()
        let outbox = self.outbox
        return try await withStore(database, logger: logger) { db in
            let now = Timestamp.now()
            try db.execute(
                sql: """
                    INSERT INTO account (uid, provider, subject, createdAt) VALUES (?, ?, ?, ?)
                    ON CONFLICT (provider, subject) DO NOTHING
                    """,
                arguments: [candidateUID, provider.rawValue, subject, now])
            let isNewAccount = db.changesCount > 0
            guard
                let uid = try String.fetchOne(
                    db, sql: "SELECT uid FROM account WHERE provider = ? AND subject = ?",
                    arguments: [provider.rawValue, subject])
            else {
                throw ServiceError(.internalError, "The account vanished while signing in; try again.")
            }
            try db.execute(
                sql: "INSERT INTO session (token, uid, createdAt) VALUES (?, ?, ?)",
                arguments: [SessionToken.digest(token), uid, now])
            try outbox.append(
                SignedIn(uid: uid, provider: provider, isNewAccount: isNewAccount), uid: uid,
                correlationId: correlationId, in: db)
            return SignInResult(uid: uid, sessionToken: token, provider: provider, isNewAccount: isNewAccount)
        }
    }

    /// Ends the session of `token`.
    ///
    /// - Returns: the session's uid.
    /// - Throws: `unauthenticated` when the token is not a live session.
    func signOut(token: String, correlationId: String) async throws -> String {
        let outbox = self.outbox
        return try await withStore(database, logger: logger) { db in
            let uid = try Self.uid(ofSession: token, in: db)
            try db.execute(sql: "DELETE FROM session WHERE token = ?", arguments: [SessionToken.digest(token)])
            try outbox.append(SignedOut(uid: uid), uid: uid, correlationId: correlationId, in: db)
            return uid
        }
    }

    /// Deletes the account of `token`'s session, and with it every session of that account.
    ///
    /// - Returns: the deleted account's uid.
    /// - Throws: `unauthenticated` when the token is not a live session.
    func withdraw(token: String, correlationId: String) async throws -> String {
        let outbox = self.outbox
        return try await withStore(database, logger: logger) { db in
            let uid = try Self.uid(ofSession: token, in: db)
            try db.execute(sql: "DELETE FROM account WHERE uid = ?", arguments: [uid])
            try outbox.append(Withdrawn(uid: uid), uid: uid, correlationId: correlationId, in: db)
            return uid
        }
    }

    func uid(forSessionToken token: String) async throws -> String {
        try await withStore(database, write: false, logger: logger) { db in try Self.uid(ofSession: token, in: db) }
    }

    private static func uid(ofSession token: String, in db: Database) throws -> String {
        guard !token.isEmpty,
            let uid = try String.fetchOne(
                db, sql: "SELECT uid FROM session WHERE token = ?", arguments: [SessionToken.digest(token)])
        else {
            throw ServiceError(
                .unauthenticated, "The session token is not valid: it is unknown, signed out or withdrawn. Sign in again.")
        }
        return uid
    }
}
