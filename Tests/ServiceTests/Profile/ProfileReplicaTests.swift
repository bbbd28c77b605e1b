import Foundation
import Logging
import Messaging
import OnboardingAPI
import PostgresNIO
import PostgresSupport
import ProfilePostgres
@testable import ProfileService
import Testing
import TestSupport

extension ProfileServiceTests {
    /// Two profile replicas on one PostgreSQL database, each with its own cache.
    @Suite("Profile replicas", .enabled(if: TestPostgres.url != nil, "needs ONBOARDING_TEST_POSTGRES_URL"))
    struct ProfileReplicaTests {
        @Test("a change made through one replica evicts the other's cached answer")
        func changesEvictOtherReplicasCaches() async throws {
            try await withTwoReplicas { first, second, _ async throws in
                // The second replica caches "no profile" for u1, and then u1's profile.
                #expect(try await second.call(GetProfile(), uid: "u1").profile == nil)
                let created = try #require(try await first.call(CreateProfile(username: "mina"), uid: "u1").profile)
                let seen = try await eventually { try await second.call(GetProfile(), uid: "u1").profile }
                #expect(seen == created)

                let renamed = try #require(try await first.call(UpdateProfile(username: "sora"), uid: "u1").profile)
                #expect(try await eventually { try await second.call(GetProfile(), uid: "u1").profile?.username == "sora" ? true : nil })
                #expect(try await first.call(GetProfile(), uid: "u1").profile == renamed, "its own change is cached at once")

                #expect(try await second.call(DeleteProfile(), uid: "u1").deleted)
                #expect(try await eventually { try await first.call(GetProfile(), uid: "u1").profile == nil ? true : nil })
            }
        }

        @Test("a replica that loses its listening connection forgets what it cached, and listens again")
        func lostListenerForgets() async throws {
            try await withTwoReplicas { first, second, location async throws in
                #expect(try await second.call(GetProfile(), uid: "u1").profile == nil)
                // Every listener of this schema is cut off; then a change is made that none hears.
                try await terminateListeners(of: location)
                // The pool may lend a connection the server has just ended (storeUnavailable,
                // "try again"): sent again, as a caller would.
                _ = try await eventually {
                    do {
                        return try await first.call(CreateProfile(username: "mina", idempotencyKey: "k1"), uid: "u1")
                    } catch let error as ServiceError where error.code == .storeUnavailable {
                        return nil
                    }
                }
                let seen = try await eventually { try await second.call(GetProfile(), uid: "u1").profile }
                #expect(seen.username == "mina")
                // Listening again: the next change is heard.
                _ = try await first.call(UpdateProfile(username: "sora"), uid: "u1")
                #expect(try await eventually { try await second.call(GetProfile(), uid: "u1").profile?.username == "sora" ? true : nil })
            }
        }

        @Test("of simultaneous claims of one name through two replicas, exactly one wins")
        func claimsAcrossReplicas() async throws {
            try await withTwoReplicas { first, second, _ async throws in
                let refusals = try await withThrowingTaskGroup(of: ErrorCode?.self) { group in
                    for index in 0..<10 {
                        let replica = index.isMultiple(of: 2) ? first : second
                        group.addTask {
                            do {
                                _ = try await replica.call(CreateProfile(username: index < 5 ? "Mina" : "mina"), uid: "u\(index)")
                                return nil
                            } catch let error as ServiceError {
                                return error.code
                            }
                        }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
                #expect(refusals.filter { $0 == nil }.count == 1)
                #expect(refusals.compactMap { $0 } == Array(repeating: .usernameTaken, count: 9))
            }
        }
    }
}

/// Two profile services on one fresh PostgreSQL schema, each on a bus of its own.
private func withTwoReplicas(
    _ body: (RunningProfileService, RunningProfileService, PostgresLocation) async throws -> Void
) async throws {
    try await TestPostgres.withSchema { location in
        let database = ProfilePostgresDatabase(location: location, maxConnections: 4, timeout: .seconds(15))
        try await RunningProfileService.with(database: database) { first in
            try await RunningProfileService.with(database: database) { second in
                try await body(first, second, location)
            }
        }
    }
}

/// `probe`'s first non-`nil` answer, asked again every 20 ms for up to 5 s.
private func eventually<T>(_ probe: () async throws -> T?) async throws -> T {
    let deadline = ContinuousClock.now + .seconds(5)
    while true {
        if let answer = try await probe() { return answer }
        guard ContinuousClock.now < deadline else { throw ServiceError(.timeout, "No answer within 5 s.") }
        try await Task.sleep(for: .milliseconds(20))
    }
}

/// Ends every connection listening for changes of `location`'s schema (as a network failure would).
private func terminateListeners(of location: PostgresLocation) async throws {
    var logger = Logger(label: "test.postgres")
    logger.logLevel = .critical
    let client = PostgresClient(configuration: location.clientConfiguration(applicationName: "onboarding-tests"), backgroundLogger: logger)
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { await client.run() }
        defer { group.cancelAll() }
        let pattern = "LISTEN \"\(location.schema)_changes\"%"
        let rows = try await client.query(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE \(pattern)", logger: logger)
        var ended: Int64 = 0
        for try await count in rows.decode(Int64.self) { ended = count }
        #expect(ended == 2, "each replica listens on one connection")
    }
}
