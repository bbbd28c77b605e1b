@testable import AuthService
import Foundation
import GRDB
import Messaging
import OnboardingAPI
import ServiceRuntime
import Testing

/// Session tokens carry their session's row id (`<id>.<secret>`), so a new session is appended
/// to the table; tokens made before that (a bare secret) keep working.
@Suite("auth session keys", .timeLimit(.minutes(1)))
struct AuthSessionKeyTests {
    let auth = AuthServiceTests()

    @Test("a token is its session's id, a dot and a 43-character secret; ids grow with each sign-in")
    func tokenFormat() async throws {
        try await auth.withAuth {
            var previous: Int64 = 0
            for subject in ["a", "b", "a", "c"] {
                let token = try await auth.signIn(.google, subject).sessionToken
                let parts = token.split(separator: ".", omittingEmptySubsequences: false)
                #expect(parts.count == 2, "\(token)")
                let id = try #require(Int64(parts[0]))
                #expect(id > previous)
                previous = id
                #expect(parts[1].count == 43)
                #expect(parts[1].allSatisfy { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" })
                #expect(SessionKey(token: token) == .session(id: id, digest: SessionToken.digest(String(parts[1]))))
            }
        }
    }

    @Test("the id alone is not enough: another secret, or another session's id, is refused")
    func secretMustMatch() async throws {
        try await auth.withAuth {
            let alice = try await auth.signIn(.kakao, "alice").sessionToken
            let bob = try await auth.signIn(.kakao, "bob").sessionToken
            let (aliceID, aliceSecret) = (alice.prefix { $0 != "." }, alice.drop { $0 != "." }.dropFirst())
            let (bobID, bobSecret) = (bob.prefix { $0 != "." }, bob.drop { $0 != "." }.dropFirst())
            for forged in ["\(aliceID).\(bobSecret)", "\(bobID).\(aliceSecret)", "\(aliceID).", String(aliceSecret), "\(aliceID)"] {
                await auth.expectError(.unauthenticated) { try await auth.verify(forged) }
            }
            let (aliceUID, bobUID) = (try await auth.verify(alice).uid, try await auth.verify(bob).uid)
            #expect(aliceUID != bobUID)
        }
    }

    @Test("a session made before session ids verifies, signs out, and answers a retry after the upgrade")
    func legacyTokens() async throws {
        try await withTemporaryDirectory { directory in
            let path = "\(directory)/auth.sqlite"
            // The store as the version before session ids left it, with one session.
            let legacyToken = SessionToken.makeSecret()
            let queue = try DatabaseQueue(path: path)
            try AuthStore.migrator.migrate(queue, upTo: "auth-v4-session-last-use")
            try await queue.write { db in
                try db.execute(
                    sql: "INSERT INTO account (uid, provider, subject, createdAt) VALUES ('uid-legacy', 'apple', 'old', '2026-11-01T00:00:00.000Z')")
                try db.execute(
                    sql: "INSERT INTO session (token, uid, createdAt, lastUsedAt) VALUES (?, 'uid-legacy', ?, ?)",
                    arguments: [SessionToken.digest(legacyToken), Timestamp.format(Date()), Timestamp.format(Date())])
            }
            try queue.close()

            try await auth.withAuth(databasePath: path) {
                #expect(try await auth.verify(legacyToken).uid == "uid-legacy")
                let fresh = try await auth.signIn(.apple, "old")
                #expect(fresh.uid == "uid-legacy")
                #expect(try #require(Int64(fresh.sessionToken.prefix { $0 != "." })) > 1)
                #expect(try await auth.signOut(token: legacyToken).uid == "uid-legacy")
                // A retry whose first reply was lost gets the same answer.
                #expect(try await auth.signOut(token: legacyToken).uid == "uid-legacy")
                await auth.expectError(.unauthenticated) { try await auth.verify(legacyToken) }
                #expect(try await auth.verify(fresh.sessionToken).uid == "uid-legacy")
            }
        }
    }

    @Test("accounts, their sessions and grants stored before account lost its row id are all still there, and still go together")
    func accountWithoutRowID() async throws {
        try await withTemporaryDirectory { directory in
            let path = "\(directory)/auth.sqlite"
            let queue = try DatabaseQueue(path: path)
            try AuthStore.migrator.migrate(queue, upTo: "auth-v6-provider-unlink")
            try await queue.write { db in
                let now = Timestamp.format(Date())
                for (uid, subject) in [("uid-a", "a"), ("uid-b", "b")] {
                    try db.execute(
                        sql: "INSERT INTO account (uid, provider, subject, createdAt) VALUES (?, 'kakao', ?, ?)", arguments: [uid, subject, now])
                    try db.execute(
                        sql: "INSERT INTO session (token, uid, createdAt, lastUsedAt) VALUES (?, ?, ?, ?)",
                        arguments: [SessionToken.digest(SessionToken.makeSecret()), uid, now, now])
                    try db.execute(
                        sql: "INSERT INTO providerGrant (uid, provider, token, updatedAt) VALUES (?, 'kakao', 'secret', ?)", arguments: [uid, now])
                }
            }
            try AuthStore.migrator.migrate(queue)
            try await queue.write { db in
                let schema = try String.fetchOne(db, sql: "SELECT sql FROM sqlite_master WHERE name = 'account'") ?? ""
                #expect(schema.contains("WITHOUT ROWID"))
                #expect(try String.fetchAll(db, sql: "SELECT uid FROM account ORDER BY uid") == ["uid-a", "uid-b"])
                #expect(try Int.fetchOne(db, sql: "SELECT count(*) FROM session") == 2)
                #expect(try Row.fetchAll(db, sql: "PRAGMA foreign_key_check").isEmpty)
                // Deleting an account still takes its sessions and grant with it.
                try db.execute(sql: "DELETE FROM account WHERE uid = 'uid-a'")
                #expect(try String.fetchAll(db, sql: "SELECT uid FROM session") == ["uid-b"])
                #expect(try String.fetchAll(db, sql: "SELECT uid FROM providerGrant") == ["uid-b"])
                // (provider, subject) is still one account.
                #expect(throws: DatabaseError.self) {
                    try db.execute(sql: "INSERT INTO account (uid, provider, subject, createdAt) VALUES ('uid-c', 'kakao', 'b', '')")
                }
            }
            try queue.close()
            try await auth.withAuth(databasePath: path) {
                let again = try await auth.signIn(.kakao, "b")
                #expect(again.uid == "uid-b")
                #expect(!again.isNewAccount)
                #expect(try await auth.signIn(.kakao, "new").isNewAccount)
            }
        }
    }
}
