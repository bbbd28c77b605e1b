import AuthPostgres
import AuthService
import Foundation
import Messaging
import OnboardingAPI
import ServiceRuntime
import Synchronization
import TestSupport
import Testing

/// Two auth replicas on one PostgreSQL schema: what the database must settle between them.
@Suite("auth on PostgreSQL: two replicas on one schema", .enabled(if: TestPostgres.url != nil), .timeLimit(.minutes(1)))
struct AuthPostgresRaceTests {
    /// Runs `body` with two stores (two pools, two publishers) on one fresh schema. Accounts may
    /// hold 100 sessions: the races sign one account in many times.
    func withTwoReplicas(_ body: @Sendable (any AuthStorage, any AuthStorage) async throws -> Void) async throws {
        try await TestPostgres.withSchema { location in
            // Tests run many stores at once on a loaded machine: a small pool each, and time.
            let database = AuthPostgresDatabase(location: location, maxConnections: 4, timeout: .seconds(15))
            let bus = InProcessBus()
            func context(_ name: String) async throws -> AuthStorageContext {
                AuthStorageContext(
                    publisher: try await bus.publisher(at: Endpoint("inproc://auth-\(name)")), sessions: SessionPolicy(maximumPerAccount: 100), clock: { Date() },
                    eventRetention: Outbox.Retention(), logger: quietLogger)
            }
            let (first, second) = (try await context("a"), try await context("b"))
            try await database.withStorage(first) { a in
                try await database.withStorage(second) { b in try await body(a, b) }
            }
        }
    }

    @Test("first sign-ins of one account on both replicas at once make one account")
    func firstSignIns() async throws {
        try await withTwoReplicas { a, b in
            let results = try await withThrowingTaskGroup(of: SignInResult.self) { group in
                for index in 0..<40 {
                    let store = index.isMultiple(of: 2) ? a : b
                    group.addTask { try await store.signIn(provider: .apple, subject: "both", correlationId: "c\(index)") }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(Set(results.map(\.uid)).count == 1)
            #expect(results.filter(\.isNewAccount).count == 1)
            #expect(Set(results.map(\.sessionToken)).count == 40)
            // Every session verifies on either replica.
            for result in results.prefix(5) { #expect(try await b.uid(forSessionToken: result.sessionToken) == result.uid) }
        }
    }

    @Test("a withdrawal sent to both replicas at once deletes once: both answer the uid, one Withdrawn is recorded")
    func doubleWithdrawal() async throws {
        try await withTwoReplicas { a, b in
            let session = try await a.signIn(provider: .kakao, subject: "twice", correlationId: "c1")
            async let first = a.withdraw(token: session.sessionToken, correlationId: "w1")
            async let second = b.withdraw(token: session.sessionToken, correlationId: "w2")
            #expect(try await [first, second] == [session.uid, session.uid])
            let page = try await b.events(after: 0, limit: nil)
            #expect(page.events.map(\.topic) == [SignedIn.type, Withdrawn.type])
            #expect(page.events.map(\.sequence) == [1, 2], "numbers are dense across replicas")
            let jobs = try await a.claimDueUnlinkJobs(at: Date(), limit: 10, lease: 60)
            #expect(jobs.map(\.uid) == [session.uid], "one unlink queued")
        }
    }

    @Test("two unlink workers claiming at once never get the same job; a claim is held for its lease")
    func unlinkClaims() async throws {
        try await withTwoReplicas { a, b in
            for index in 0..<20 {
                let session = try await a.signIn(provider: .kakao, subject: "u\(index)", correlationId: "c\(index)")
                _ = try await b.withdraw(token: session.sessionToken, correlationId: "w\(index)")
            }
            let now = Date()
            async let left = a.claimDueUnlinkJobs(at: now, limit: 15, lease: 60)
            async let right = b.claimDueUnlinkJobs(at: now, limit: 15, lease: 60)
            let (mine, theirs) = try await (left, right)
            #expect(Set(mine.map(\.uid)).isDisjoint(with: theirs.map(\.uid)))
            #expect(mine.count + theirs.count == 20)
            #expect(try await a.claimDueUnlinkJobs(at: now.addingTimeInterval(59), limit: 50, lease: 60).isEmpty)
            let again = try await b.claimDueUnlinkJobs(at: now.addingTimeInterval(61), limit: 50, lease: 60)
            #expect(again.count == 20, "a dead claimant's jobs come back")
            // The first claimant wakes up late: what it records is dropped, the new claim's stays.
            let late = try #require(mine.first)
            try await a.apply(.unlinked, to: late, at: now.addingTimeInterval(62))
            try await a.apply(.retry(at: now.addingTimeInterval(500), attempts: 1, error: "late"), to: late, at: now.addingTimeInterval(62))
            #expect(try await a.unlinkQueueStatus(at: now.addingTimeInterval(62)).pending == 20)
            let current = try #require(again.first { $0.uid == late.uid })
            try await b.apply(.unlinked, to: current, at: now.addingTimeInterval(63))
            #expect(try await a.unlinkQueueStatus(at: now.addingTimeInterval(63)).pending == 19)
        }
    }

    @Test("sign-outs of one session on both replicas: both answer its uid, one SignedOut is recorded")
    func doubleSignOut() async throws {
        try await withTwoReplicas { a, b in
            let session = try await a.signIn(provider: .google, subject: "out", correlationId: "c1")
            try await withThrowingTaskGroup(of: String.self) { group in
                for index in 0..<10 {
                    let store = index.isMultiple(of: 2) ? a : b
                    group.addTask { try await store.signOut(token: session.sessionToken, everywhere: false, correlationId: "s\(index)") }
                }
                for try await uid in group { #expect(uid == session.uid) }
            }
            #expect(try await a.events(after: 0, limit: nil).events.map(\.topic) == [SignedIn.type, SignedOut.type])
        }
    }

    @Test("a batch of many sign-ins, new and returning and repeated, gives what one at a time would")
    func batchedSignIns() async throws {
        try await withTwoReplicas { a, _ in
            let returning = try await a.signIn(provider: .naver, subject: "back", correlationId: "c0")
            let subjects = (0..<300).map { "p\($0 % 250)" } + ["back", "back"]
            let results = try await withThrowingTaskGroup(of: (String, SignInResult).self) { group in
                for (index, subject) in subjects.enumerated() {
                    group.addTask { (subject, try await a.signIn(provider: .naver, subject: subject, correlationId: "b\(index)")) }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            let bySubject = Dictionary(grouping: results, by: \.0)
            #expect(bySubject.count == 251)
            for (subject, signIns) in bySubject {
                #expect(Set(signIns.map(\.1.uid)).count == 1, "\(subject): one account")
                #expect(signIns.filter(\.1.isNewAccount).count == (subject == "back" ? 0 : 1), "\(subject)")
            }
            #expect(bySubject["back"]?.first?.1.uid == returning.uid)
            let signedIn = try await a.events(after: 0, limit: 1_000).events.filter { $0.topic == SignedIn.type }
            #expect(signedIn.count == 303)
        }
    }

    @Test("one account withdrawn from two devices on two replicas at once: one withdrawal, the other unauthenticated, never a deadlock")
    func withdrawalsFromTwoDevices() async throws {
        try await withTwoReplicas { a, b in
            for round in 0..<10 {
                let phone = try await a.signIn(provider: .kakao, subject: "two-\(round)", correlationId: "p")
                let tablet = try await b.signIn(provider: .kakao, subject: "two-\(round)", correlationId: "t")
                async let first = Result(catching: { try await a.withdraw(token: phone.sessionToken, correlationId: "w1") })
                async let second = Result(catching: { try await b.withdraw(token: tablet.sessionToken, correlationId: "w2") })
                let outcomes = await [first, second]
                #expect(outcomes.filter { (try? $0.get()) == phone.uid }.count == 1, "round \(round): \(outcomes)")
                #expect(outcomes.filter { ($0.error as? ServiceError)?.code == .unauthenticated }.count == 1, "round \(round): \(outcomes)")
            }
            let withdrawn = try await a.events(after: 0, limit: 1_000).events.filter { $0.topic == Withdrawn.type }
            #expect(withdrawn.count == 10)
        }
    }

    @Test("sign-ins on one replica and sign-outs on the other, of one account: every event's session count is the store's at its commit")
    func countsFollowTheCommits() async throws {
        try await withTwoReplicas { a, b in
            var sessions: [SignInResult] = []
            for index in 0..<10 { sessions.append(try await a.signIn(provider: .google, subject: "busy", correlationId: "s\(index)")) }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (index, session) in sessions.enumerated() {
                    group.addTask { _ = try await a.signIn(provider: .google, subject: "busy", correlationId: "n\(index)") }
                    group.addTask { _ = try await b.signOut(token: session.sessionToken, everywhere: false, correlationId: "o\(index)") }
                }
                try await group.waitForAll()
            }
            var live = 0
            for event in try await a.events(after: 0, limit: 1_000).events {
                let data = Data(event.envelope.utf8)
                if event.topic == SignedIn.type {
                    live += 1
                    #expect(try JSONDecoder().decode(Envelope<SignedIn>.self, from: data).payload.sessions == live, "event \(event.sequence)")
                } else if event.topic == SignedOut.type {
                    live -= 1
                    #expect(try JSONDecoder().decode(Envelope<SignedOut>.self, from: data).payload.sessions == live, "event \(event.sequence)")
                }
            }
            #expect(live == 10)
        }
    }
}

extension Result where Failure == any Error {
    init(catching body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }

    var error: (any Error)? {
        if case .failure(let error) = self { return error }
        return nil
    }
}
