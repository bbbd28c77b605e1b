import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime
import TestSupport
import Testing

@testable import AuthService

/// The unlink queue in auth's store: written in the withdrawal's transaction with the token the
/// sign-in left, which goes with the account; each step of a job as the worker records it.
@Suite("auth's unlink queue (store)")
struct AuthUnlinkStoreTests {
    /// Runs `body` with a fresh store of `kind` and a clock the test moves.
    func withStore(_ kind: StoreKind, _ body: @Sendable (any AuthStorage, ManualTime) async throws -> Void) async throws {
        let time = ManualTime()
        let publisher = try await InProcessBus().publisher(at: "inproc://auth-unlink-events")
        let context = AuthStorageContext(
            publisher: publisher, sessions: SessionPolicy(), clock: { time.now }, eventRetention: Outbox.Retention(),
            logger: quietLogger)
        try await withAuthDatabase(kind, inMemory: true) { database in
            try await database.withStorage(context) { store in try await body(store, time) }
        }
    }

    /// The rows of `table`, on SQLite (`nil` on another store).
    static func count(_ table: String, in store: any AuthStorage) async throws -> Int? {
        guard let sqlite = store as? AuthStore else { return nil }
        return try await sqlite.database.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM \(table)") ?? 0 }
    }

    @Test("a withdrawal queues the unlink with the newest stored token; the token goes with the account", arguments: StoreKind.available)
    func withdrawalQueuesJob(kind: StoreKind) async throws {
        try await withStore(kind) { store, time in
            let naver = try await store.signIn(provider: .naver, subject: "n-1", correlationId: "c1")
            try await store.recordGrant(uid: naver.uid, provider: .naver, token: "old-access")
            try await store.recordGrant(uid: naver.uid, provider: .naver, token: "new-access")
            let kakao = try await store.signIn(provider: .kakao, subject: "k-1", correlationId: "c2")
            #expect(try await Self.count("providerGrant", in: store) ?? 1 == 1)

            _ = try await store.withdraw(token: naver.sessionToken, correlationId: "c3")
            _ = try await store.withdraw(token: kakao.sessionToken, correlationId: "c4")
            #expect(try await Self.count("providerGrant", in: store) ?? 0 == 0, "no token is left with the account")
            let jobs = try await store.claimDueUnlinkJobs(at: time.now, limit: 10, lease: 60)
            #expect(Set(jobs.map(\.uid)) == [naver.uid, kakao.uid])
            let naverJob = try #require(jobs.first { $0.provider == .naver })
            #expect(naverJob.token == "new-access" && naverJob.subject == "n-1" && naverJob.attempts == 0)
            #expect(jobs.first { $0.provider == .kakao }?.token == nil)

            // A token arriving after the withdrawal (a sign-in racing it) is not kept: a later
            // withdrawal of a new account under the same uid is impossible, so nothing can use it.
            try await store.recordGrant(uid: naver.uid, provider: .naver, token: "late")
            #expect(try await Self.count("providerGrant", in: store) ?? 0 == 0)
        }
    }

    @Test("a retry is rescheduled and shown in the queue's status; done and refused jobs are deleted", arguments: StoreKind.available)
    func steps(kind: StoreKind) async throws {
        try await withStore(kind) { store, time in
            let person = try await store.signIn(provider: .kakao, subject: "k-2", correlationId: "c1")
            _ = try await store.withdraw(token: person.sessionToken, correlationId: "c2")
            let job = try #require(try await store.claimDueUnlinkJobs(at: time.now, limit: 10, lease: 60).first)
            let queued = time.now
            time.advance(30)
            try await store.apply(.retry(at: time.now.addingTimeInterval(60), attempts: 1, error: "kakao answered HTTP 503"), to: job, at: time.now)
            #expect(try await store.claimDueUnlinkJobs(at: time.now, limit: 10, lease: 60).isEmpty)
            let next = try #require(try await store.nextUnlinkAttempt())
            #expect(abs(next.timeIntervalSince(time.now.addingTimeInterval(60))) < 0.001)
            #expect(try await store.unlinkQueueStatus(at: queued.addingTimeInterval(45)) == UnlinkQueueStatus(
                pending: 1, oldestPendingSeconds: 45, lastError: "kakao answered HTTP 503", lastErrorAt: Timestamp.format(time.now)))

            time.advance(60)
            let again = try #require(try await store.claimDueUnlinkJobs(at: time.now, limit: 10, lease: 60).first)
            #expect(again.attempts == 1 && again.lastError == "kakao answered HTTP 503")
            try await store.apply(.unlinked, to: again, at: time.now)
            #expect(try await store.nextUnlinkAttempt() == nil)
            #expect(try await store.unlinkQueueStatus(at: time.now) == UnlinkQueueStatus(pending: 0))
        }
    }
}

@Suite("auth's unlink worker", .timeLimit(.minutes(1)))
struct AuthUnlinkWorkerTests {
    @Test("in dev mode nothing is configured: each withdrawal's unlink is dropped, logged once per provider")
    func devModeDropsOncePerProvider() async throws {
        let (bus, rpc) = (InProcessBus(), Defaults.authRPC)
        let lines = Observed<[String]>([])
        let events = Observed<[UnlinkEvent]>([])
        let configuration = AuthService.Configuration(
            rpc: rpc, events: Defaults.authEvents, devMode: true,
            unlink: UnlinkConfiguration(observer: { event in events.update { $0.append(event) } }))
        let logger = Logger(label: "test") { _ in ObservedLogHandler(lines: lines) }
        let service = try AuthService(configuration: configuration, bus: bus, logger: logger)
        try await withRunningService(service, on: bus, answeringAt: rpc) {
            for (provider, subject) in [(Provider.kakao, "a"), (.kakao, "b"), (.google, "c")] {
                let session = try await bus.call(SignIn(provider: provider, subject: subject), to: rpc, source: "test")
                _ = try await bus.call(Withdraw(), to: rpc, source: "test", sessionToken: session.sessionToken)
            }
            let seen = try await events.wait { $0.count == 3 }
            #expect(seen.allSatisfy { event in
                if case .dropped(_, let provider, let reason) = event { reason == .notConfigured(provider) } else { false }
            })
            #expect(lines.value.filter { $0.contains("not configured") }.count == 2, "\(lines.value)")
            #expect(try await bus.call(HealthCheck(), to: rpc, source: "test").unlink == UnlinkQueueStatus(pending: 0))
        }
    }

    @Test("a wake-up before the wait is kept; a wait with a timeout ends by itself")
    func wakeSignal() async {
        let signal = WakeSignal()
        var waiter = signal.makeWaiter()
        signal.wake()
        await waiter.wait(timeout: nil)
        await waiter.wait(timeout: .milliseconds(1))
        // A wake-up from another task ends a wait that has no timeout.
        let waking = Task { signal.wake() }
        await waiter.wait(timeout: nil)
        await waking.value
    }
}
