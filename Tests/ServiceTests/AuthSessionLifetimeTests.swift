import Foundation
import GRDB
import Messaging
import OnboardingAPI
import ServiceRuntime
import Synchronization
import TestSupport
import Testing

@testable import AuthService

@Suite("sessions that end")
struct AuthSessionLifetimeTests {
    /// A store of one kind with `policy` and a clock the test moves.
    struct Harness: Sendable {
        let store: any AuthStorage
        let time: ManualTime

        func advance(hours: Double) { time.advance(hours * 3600) }

        func signIn(_ subject: String) async throws -> SignInResult {
            try await store.signIn(provider: .google, subject: subject, correlationId: UUID().uuidString)
        }

        /// The payloads of the events of `type` recorded, oldest first.
        func recorded<Event: APIEvent>(_ type: Event.Type) async throws -> [Event] {
            try await store.events(after: 0, limit: nil).events.filter { $0.topic == Event.type }.map { event in
                try JSONDecoder().decode(Envelope<Event>.self, from: Data(event.envelope.utf8)).payload
            }
        }

        /// The `auth.signedOut` events recorded, as (uid, sessions left).
        func signedOutEvents() async throws -> [(String, Int)] {
            try await recorded(SignedOut.self).map { ($0.uid, $0.sessions ?? -1) }
        }
    }

    /// Runs `body` with a fresh store of `kind` (SQLite in memory, or a fresh PostgreSQL schema).
    func withHarness(
        _ kind: StoreKind, _ policy: SessionPolicy, _ body: @Sendable (Harness) async throws -> Void
    ) async throws {
        let time = ManualTime()
        let publisher = try await InProcessBus().publisher(at: "inproc://auth-events")
        let context = AuthStorageContext(
            publisher: publisher, sessions: policy, clock: { time.now }, eventRetention: Outbox.Retention(), logger: quietLogger)
        try await withAuthDatabase(kind, inMemory: true) { database in
            try await database.withStorage(context) { store in try await body(Harness(store: store, time: time)) }
        }
    }

    func expectRefused(_ reason: String?, _ body: () async throws -> some Any) async {
        let error = await #expect(throws: ServiceError.self) { _ = try await body() }
        #expect(error?.code == .unauthenticated)
        #expect(error?.reason == reason, "\(String(describing: error))")
    }

    @Test("a session expires when unused for its lifetime; each use slides it", arguments: StoreKind.available)
    func expiry(store: StoreKind) async throws {
        try await withHarness(store, SessionPolicy(lifetime: 24 * 3600)) { h in
            let session = try await h.signIn("ann")
            h.advance(hours: 23)
            #expect(try await h.store.uid(forSessionToken: session.sessionToken) == session.uid)
            h.advance(hours: 23)
            #expect(try await h.store.uid(forSessionToken: session.sessionToken) == session.uid, "the use 23 h ago slid it")
            h.advance(hours: 24.5)
            await expectRefused("sessionExpired") { try await h.store.uid(forSessionToken: session.sessionToken) }
            await expectRefused("sessionExpired") { try await h.store.uid(forSessionToken: session.sessionToken) }
            let events = try await h.signedOutEvents()
            #expect(events.count == 1 && events.first?.0 == session.uid && events.first?.1 == 0, "the orchestrator learns it ended")
            // An expired session cannot withdraw the account; a new sign-in can.
            await expectRefused(nil) { try await h.store.withdraw(token: session.sessionToken, correlationId: "w") }
            #expect(try await h.signIn("ann").uid == session.uid)
        }
    }

    @Test("uses within the renewal interval write nothing")
    func renewalIsCoarse() async throws {
        try await withHarness(.sqlite, SessionPolicy()) { h in
            let session = try await h.signIn("bo")
            let database = try #require(h.store as? AuthStore).database
            func lastUsed() async throws -> String? {
                try await database.read { db in try String.fetchOne(db, sql: "SELECT lastUsedAt FROM session") }
            }
            let first = try await lastUsed()
            h.advance(hours: 0.5)
            _ = try await h.store.uid(forSessionToken: session.sessionToken)
            #expect(try await lastUsed() == first)
            h.advance(hours: 1)
            _ = try await h.store.uid(forSessionToken: session.sessionToken)
            #expect(try await lastUsed() != first)
        }
    }

    @Test("an account holds at most N sessions: a sign-in beyond ends the least recently used", arguments: StoreKind.available)
    func cap(store: StoreKind) async throws {
        try await withHarness(store, SessionPolicy(maximumPerAccount: 3)) { h in
            var sessions: [SignInResult] = []
            for _ in 0..<3 {
                sessions.append(try await h.signIn("cy"))
                h.advance(hours: 2)
            }
            // The first is used again, so the second is now the least recently used.
            _ = try await h.store.uid(forSessionToken: sessions[0].sessionToken)
            h.advance(hours: 2)
            sessions.append(try await h.signIn("cy"))
            await expectRefused("sessionEvicted") { try await h.store.uid(forSessionToken: sessions[1].sessionToken) }
            for index in [0, 2, 3] {
                #expect(try await h.store.uid(forSessionToken: sessions[index].sessionToken) == sessions[0].uid)
            }
            #expect(try await h.recorded(SignedIn.self).map(\.sessions) == [1, 2, 3, 3], "the cap holds at each sign-in")
        }
    }

    @Test("sign-out everywhere ends every session of the account", arguments: StoreKind.available)
    func signOutEverywhere(store: StoreKind) async throws {
        try await withHarness(store, SessionPolicy()) { h in
            let phone = try await h.signIn("di")
            let tablet = try await h.signIn("di")
            let other = try await h.signIn("ed")
            #expect(try await h.store.signOut(token: phone.sessionToken, everywhere: true, correlationId: "s") == phone.uid)
            await expectRefused(nil) { try await h.store.uid(forSessionToken: phone.sessionToken) }
            await expectRefused(nil) { try await h.store.uid(forSessionToken: tablet.sessionToken) }
            #expect(try await h.store.uid(forSessionToken: other.sessionToken) == other.uid)
            #expect(try await h.signedOutEvents().last?.1 == 0)
            #expect(try await h.store.signOut(token: phone.sessionToken, everywhere: true, correlationId: "s2") == phone.uid, "a retry")
        }
    }

    @Test("expired sessions of other accounts are pruned at sign-ins, each account told with SignedOut", arguments: StoreKind.available)
    func pruning(store: StoreKind) async throws {
        try await withHarness(store, SessionPolicy(lifetime: 24 * 3600)) { h in
            let old = try await h.signIn("fay")
            _ = try await h.signIn("fay")
            h.advance(hours: 25)
            _ = try await h.signIn("gus")
            let events = try await h.signedOutEvents()
            #expect(events.count == 1 && events[0].0 == old.uid && events[0].1 == 0)
            await expectRefused("sessionExpired") { try await h.store.uid(forSessionToken: old.sessionToken) }
        }
    }

    @Test("other accounts' expired sessions are looked for at most once a second, unless a look found a full batch")
    func pruneSchedule() {
        let schedule = AuthStore.PruneSchedule()
        let start = Date(timeIntervalSince1970: 1_800_000_000)
        #expect(schedule.isDue(at: start))
        schedule.looked(at: start, found: 3)
        #expect(!schedule.isDue(at: start.addingTimeInterval(0.999)))
        #expect(schedule.isDue(at: start.addingTimeInterval(1)))
        schedule.looked(at: start.addingTimeInterval(1), found: AuthStore.pruneBatch)
        #expect(schedule.isDue(at: start.addingTimeInterval(1)), "more may be waiting")
    }

    @Test("the policy's decisions")
    func policy() {
        let policy = SessionPolicy(lifetime: 100, maximumPerAccount: 2, renewalInterval: 10)
        let start = Date(timeIntervalSince1970: 0)
        #expect(!policy.isExpired(lastUsed: start, now: start.addingTimeInterval(99)))
        #expect(policy.isExpired(lastUsed: start, now: start.addingTimeInterval(100)))
        #expect(!policy.needsRenewal(lastUsed: start, now: start.addingTimeInterval(9)))
        #expect(policy.needsRenewal(lastUsed: start, now: start.addingTimeInterval(10)))
        #expect(Array(policy.evicted(["newest", "newer", "old", "oldest"])) == ["old", "oldest"])
        #expect(policy.evicted(["only"]).isEmpty)
        // At a sign-in: the expired ones, then the least recently used beyond the cap, each once.
        let sessions = [("new", 100.0), ("used", 50), ("stale", 0), ("older", -1)]
        let endings = policy.endings(atSignIn: sessions, now: start.addingTimeInterval(100)) { start.addingTimeInterval($0.1) }
        #expect(endings.map { "\($0.session.0) \($0.ending)" } == ["stale expired", "older expired"], "at the lifetime exactly, a session has expired")
        let live = [("new", 100.0), ("used", 90), ("older", 80)]
        #expect(policy.endings(atSignIn: live, now: start.addingTimeInterval(100)) { start.addingTimeInterval($0.1) }.map(\.session.0) == ["older"])
    }
}

/// A clock the test moves by hand.
final class ManualTime: Sendable {
    private let value = Mutex(Date(timeIntervalSince1970: 1_800_000_000))
    var now: Date { value.withLock { $0 } }
    func advance(_ seconds: TimeInterval) { value.withLock { $0 = $0.addingTimeInterval(seconds) } }
}

extension AuthSessionLifetimeTests {
    @Test("through auth.verifySession: a use slides the session, expiry is refused with its reason")
    func overTheBus() async throws {
        let bus = InProcessBus()
        let time = ManualTime()
        let configuration = AuthService.Configuration(
            rpc: Defaults.authRPC, events: Defaults.authEvents, devMode: true,
            sessions: SessionPolicy(lifetime: 24 * 3600), clock: { time.now })
        let service = try AuthService(configuration: configuration, bus: bus, logger: quietLogger)
        try await withRunningService(service, on: bus, answeringAt: Defaults.authRPC) {
            let session: SignInResult = try await bus.call(SignIn(provider: .kakao, subject: "hal"), to: Defaults.authRPC, source: "test")
            func verify() async throws -> String {
                try await bus.call(VerifySession(sessionToken: session.sessionToken), to: Defaults.authRPC, source: "test").uid
            }
            #expect(try await verify() == session.uid, "fresh: answered on the bus's thread")
            time.advance(20 * 3600)
            #expect(try await verify() == session.uid, "its use is recorded (a write, answered later)")
            time.advance(20 * 3600)
            #expect(try await verify() == session.uid, "40 h after sign-in, 20 h after its last recorded use")
            time.advance(25 * 3600)
            await expectRefused("sessionExpired") { try await verify() }
            await expectRefused("sessionExpired") { try await verify() }
            let signedOut = try await bus.call(SignOut(), to: Defaults.authRPC, source: "test", sessionToken: session.sessionToken)
            #expect(signedOut.uid == session.uid, "signing out of an expired session: it is over, as asked")
        }
    }
}
