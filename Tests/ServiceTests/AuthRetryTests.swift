import Foundation
import GRDB
import Messaging
import OnboardingAPI
import ServiceRuntime
import Synchronization
import TestSupport
import Testing

@testable import AuthService

extension AuthServiceTests {
    /// The next `count` events from `received`, failing instead of hanging when they do not come.
    func nextEvents(_ count: Int, from stream: AsyncStream<Message>) async throws -> [Message] {
        try await withThrowingTaskGroup(of: [Message]?.self) { group in
            group.addTask {
                var messages: [Message] = []
                for await message in stream {
                    messages.append(message)
                    if messages.count == count { break }
                }
                return messages
            }
            group.addTask {
                try await Task.sleep(for: .seconds(10))
                return nil
            }
            defer { group.cancelAll() }
            return try #require(try await group.next() ?? nil, "\(count) events did not come")
        }
    }

    // MARK: Retries

    @Test("a retried sign-out answers the same uid and publishes nothing more; the session stays ended", arguments: StoreKind.available)
    func retriedSignOut(store: StoreKind) async throws {
        try await withAuth(store) {
            let stream = try await bus.subscribe(to: [events], topics: ["auth."], limits: MessageLimits())
            let session = try await signIn(.kakao, "retry")
            #expect(try await signOut(token: session.sessionToken).uid == session.uid)
            // The reply was lost; the app sends the same request again.
            let reply = try await bus.request(
                try OutgoingMessage(Envelope(header: EnvelopeHeader(type: SignOut.type, source: "test", sessionToken: session.sessionToken), payload: SignOut())),
                to: rpc, timeout: .seconds(3))
            #expect(reply.header.type == SignOut.replyType)
            #expect(reply.header.uid == session.uid)
            #expect(try reply.payload(as: AccountResult.self) == AccountResult(uid: session.uid))
            await expectError(.unauthenticated) { try await verify(session.sessionToken) }

            let marker = try await signIn(.apple, "marker")
            let messages = try await nextEvents(3, from: stream)
            #expect(messages.map(\.header.type) == [SignedIn.type, SignedOut.type, SignedIn.type])
            #expect(messages.last?.header.uid == marker.uid)
        }
    }

    @Test("a retried withdrawal answers the same uid and publishes nothing more; the account stays gone", arguments: StoreKind.available)
    func retriedWithdrawal(store: StoreKind) async throws {
        try await withAuth(store) {
            let stream = try await bus.subscribe(to: [events], topics: ["auth."], limits: MessageLimits())
            let session = try await signIn(.naver, "retry")
            #expect(try await withdraw(token: session.sessionToken).uid == session.uid)
            #expect(try await withdraw(token: session.sessionToken).uid == session.uid)
            await expectError(.unauthenticated) { try await verify(session.sessionToken) }

            let again = try await signIn(.naver, "retry")
            #expect(again.isNewAccount && again.uid != session.uid)
            let messages = try await nextEvents(3, from: stream)
            #expect(messages.map(\.header.type) == [SignedIn.type, Withdrawn.type, SignedIn.type])
            #expect(messages.last?.header.uid == again.uid)
        }
    }

    @Test("a withdrawal with a signed-out session is unauthenticated, and the account stays", arguments: StoreKind.available)
    func withdrawAfterSignOut(store: StoreKind) async throws {
        try await withAuth(store) {
            let session = try await signIn(.google, "careful")
            _ = try await signOut(token: session.sessionToken)
            await expectError(.unauthenticated) { try await withdraw(token: session.sessionToken) }
            let again = try await signIn(.google, "careful")
            #expect(again.uid == session.uid && !again.isNewAccount)
        }
    }

    @Test("a sign-out of a withdrawn session answers the withdrawn uid, and publishes nothing", arguments: StoreKind.available)
    func signOutAfterWithdrawal(store: StoreKind) async throws {
        try await withAuth(store) {
            let stream = try await bus.subscribe(to: [events], topics: ["auth."], limits: MessageLimits())
            let session = try await signIn(.apple, "gone")
            _ = try await withdraw(token: session.sessionToken)
            #expect(try await signOut(token: session.sessionToken).uid == session.uid)
            let marker = try await signIn(.apple, "marker")
            let messages = try await nextEvents(3, from: stream)
            #expect(messages.map(\.header.type) == [SignedIn.type, Withdrawn.type, SignedIn.type])
            #expect(messages.last?.header.uid == marker.uid)
        }
    }

    @Test("another session that a withdrawal ended is not a retry: both are unauthenticated", arguments: StoreKind.available)
    func otherSessionOfAWithdrawal(store: StoreKind) async throws {
        try await withAuth(store) {
            let phone = try await signIn(.kakao, "two-devices")
            let tablet = try await signIn(.kakao, "two-devices")
            _ = try await withdraw(token: phone.sessionToken)
            await expectError(.unauthenticated) { try await signOut(token: tablet.sessionToken) }
            await expectError(.unauthenticated) { try await withdraw(token: tablet.sessionToken) }
        }
    }

    @Test("simultaneous sign-outs of one session all answer its uid, and one event is published", arguments: StoreKind.available)
    func simultaneousSignOuts(store: StoreKind) async throws {
        try await withAuthDatabase(store) { database in
            try await withAuth(database: database) {
                let stream = try await bus.subscribe(to: [events], topics: ["auth."], limits: MessageLimits())
                let session = try await signIn(.google, "impatient")
                let uids = try await withThrowingTaskGroup(of: String.self) { group in
                    for _ in 0..<8 {
                        group.addTask { try await signOut(token: session.sessionToken).uid }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
                #expect(uids == Array(repeating: session.uid, count: 8))
                let marker = try await signIn(.google, "marker")
                let messages = try await nextEvents(3, from: stream)
                #expect(messages.map(\.header.type) == [SignedIn.type, SignedOut.type, SignedIn.type])
                #expect(messages.last?.header.uid == marker.uid)
            }
        }
    }

    @Test("an ended session is remembered across a restart")
    func endedSessionSurvivesRestart() async throws {
        try await withTemporaryDirectory { directory in
            let path = "\(directory)/auth.sqlite"
            let session = try await withAuth(databasePath: path) {
                let session = try await signIn(.naver, "restart")
                _ = try await signOut(token: session.sessionToken)
                return session
            }
            let restarted = InProcessBus()
            try await withAuth(databasePath: path, bus: restarted) {
                let again: AccountResult = try await restarted.call(
                    SignOut(), to: rpc, source: "test", sessionToken: session.sessionToken)
                #expect(again.uid == session.uid)
            }
            let stored = try await DatabaseQueue(path: path).read { db in
                try String.fetchAll(db, sql: "SELECT token FROM endedSession")
            }
            #expect(stored.count == 1 && !stored.contains(session.sessionToken), "only the digest is kept")
        }
    }

    @Test("ended sessions are forgotten after 24 hours: a later retry is unauthenticated and the row is pruned")
    func endedSessionsArePruned() async throws {
        let database = try ServiceDatabase.open(path: nil)
        try AuthStore.migrator.migrate(database)
        let now = Mutex(Date(timeIntervalSince1970: 1_700_000_000))
        let publisher = try await InProcessBus().publisher(at: "inproc://auth-events")
        let store = AuthStore(
            database: database, outbox: Outbox(source: ServiceName.auth, publisher: publisher), logger: nil,
            clock: { now.withLock { $0 } })
        func advance(hours: Double) { now.withLock { $0 = $0.addingTimeInterval(hours * 3600) } }
        func endedRows() async throws -> Int {
            try await database.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM endedSession") ?? 0 }
        }

        let old = try await store.signIn(provider: .google, subject: "old", correlationId: "c1")
        let withdrawn = try await store.signIn(provider: .google, subject: "withdrawn", correlationId: "c2")
        _ = try await store.signOut(token: old.sessionToken, correlationId: "c3")
        _ = try await store.withdraw(token: withdrawn.sessionToken, correlationId: "c4")
        advance(hours: 23.9)
        #expect(try await store.signOut(token: old.sessionToken, correlationId: "c5") == old.uid)
        #expect(try await store.withdraw(token: withdrawn.sessionToken, correlationId: "c6") == withdrawn.uid)
        advance(hours: 0.2)
        await expectError(.unauthenticated) { try await store.signOut(token: old.sessionToken, correlationId: "c7") }
        await expectError(.unauthenticated) { try await store.withdraw(token: withdrawn.sessionToken, correlationId: "c8") }
        #expect(try await endedRows() == 2, "a look-up alone deletes nothing")

        let next = try await store.signIn(provider: .google, subject: "next", correlationId: "c9")
        _ = try await store.signOut(token: next.sessionToken, correlationId: "c10")
        #expect(try await endedRows() == 1, "the next ending prunes the expired ones")
    }
}
