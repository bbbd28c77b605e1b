import Foundation
import Logging
import Messaging
import OnboardingAPI
@testable import OnboardingOrchestrator
@testable import OrchestratorPostgres
import PostgresNIO
import PostgresSupport
import ServiceRuntime
import Synchronization
import TestSupport
import Testing

/// Orchestrator replicas on one PostgreSQL schema: one leads at a time, and one that lost the
/// lead cannot write a decision.
@Suite("the orchestrator on PostgreSQL: one replica leads", .enabled(if: TestPostgres.url != nil), .timeLimit(.minutes(1)))
struct OrchestratorLeadershipTests {
    @Test("a second replica stands by while the first leads, and takes over in a new term when it stops")
    func standbyTakesOver() async throws {
        try await TestPostgres.withSchema { location in
            let database = OrchestratorPostgresDatabase(
                location: location, maxConnections: 4, timeout: .seconds(15), leaseCheck: .milliseconds(50))
            let log = CapturedLog()
            let firstLeads = Latch(), firstMayStop = Latch(), secondLeads = Latch()
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    try await database.withStorage(try await context(log.logger(label: "first"))) { _ in
                        firstLeads.open()
                        await firstMayStop.wait()
                    }
                }
                await firstLeads.wait()
                group.addTask {
                    try await database.withStorage(try await context(log.logger(label: "second"))) { _ in secondLeads.open() }
                }
                try await log.waitFor("standing by")
                #expect(!secondLeads.isOpen)
                #expect(try await term(of: location) == 1)
                firstMayStop.open()
                await secondLeads.wait()
                #expect(try await term(of: location) == 2)
                try await group.waitForAll()
            }
        }
    }

    @Test("a leader whose lead connection is cut stops, saying why")
    func leaderStopsWhenItsConnectionIsCut() async throws {
        try await TestPostgres.withSchema { location in
            let database = OrchestratorPostgresDatabase(
                location: location, maxConnections: 4, timeout: .seconds(15), leaseCheck: .milliseconds(50),
                leasePatience: .seconds(1))
            let log = CapturedLog()
            let leads = Latch()
            let stopped = await #expect(throws: ServiceError.self) {
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask {
                        try await database.withStorage(try await context(log.logger(label: "leader"))) { _ in
                            leads.open()
                            // Runs until the lead is lost.
                            try await Task.sleep(for: .seconds(30))
                        }
                    }
                    await leads.wait()
                    try await cutLead(of: location)
                    try await group.waitForAll()
                }
            }
            #expect(stopped?.message.contains("no longer leads") == true)
        }
    }

    @Test("a replica whose lead was lost (its connection cut) cannot commit a decision, begin a set-up or settle one once another leads")
    func fencedAfterLosingTheLead() async throws {
        try await TestPostgres.withSchema { location in
            let log = CapturedLog()
            // The first does not look at its lead again during the test: only the term fences it.
            let first = OrchestratorPostgresDatabase(location: location, maxConnections: 4, timeout: .seconds(15), leaseCheck: .seconds(60))
            let second = OrchestratorPostgresDatabase(
                location: location, maxConnections: 4, timeout: .seconds(15), leaseCheck: .milliseconds(50))
            let secondLeads = Latch(), secondMayStop = Latch()
            let newest = NewestAttempt()
            let setUp = SetUpRecord(uid: "u1", idempotencyKey: "k1", username: "mina")
            try await first.withStorage(try await context(log.logger(label: "first"))) { storage in
                let store = try #require(storage as? any BufferedDecisionStore)
                try await store.commit(reading: ["u1"], restarting: false) { _ in }
                let older = SetUpRecord(
                    uid: setUp.uid, idempotencyKey: setUp.idempotencyKey, username: setUp.username,
                    attempt: try await storage.beginSetup(setUp))
                #expect(try await storage.unfinishedSetups() == [older])
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask {
                        try await second.withStorage(try await context(log.logger(label: "second"))) { storage in
                            // The same set-up, sent again to the replica that leads now.
                            let newer = try await storage.beginSetup(setUp)
                            #expect(newer > older.attempt)
                            var newerTry = setUp
                            newerTry.attempt = newer
                            #expect(try await storage.isCurrentSetup(newerTry))
                            newest.value.store(newer, ordering: .releasing)
                            secondLeads.open()
                            await secondMayStop.wait()
                            // The first's end of its older try left the newer try's record alone.
                            #expect(try await storage.unfinishedSetups().map(\.attempt) == [newer])
                        }
                    }
                    try await log.waitFor("standing by")
                    try await cutLead(of: location)
                    await secondLeads.wait()
                    let refused = await #expect(throws: ServiceError.self) {
                        try await store.commit(reading: ["u1"], restarting: false) { _ in }
                    }
                    #expect(refused?.code == .storeUnavailable)
                    #expect(refused?.message.contains("Another orchestrator leads now") == true)
                    for (what, refusal) in [
                        ("a set-up begun", await #expect(throws: ServiceError.self) { _ = try await storage.beginSetup(setUp) }),
                        ("the set-ups to settle", await #expect(throws: ServiceError.self) { _ = try await storage.unfinishedSetups() }),
                    ] {
                        #expect(refusal?.code == .storeUnavailable, "\(what)")
                        #expect(refusal?.message.contains("Another orchestrator leads now") == true, "\(what)")
                    }
                    // Not even the newest try is the old leader's to settle (its images are not its to remove).
                    var newerTry = setUp
                    newerTry.attempt = newest.value.load(ordering: .acquiring)
                    #expect(!(try await storage.isCurrentSetup(newerTry)), "a replica that lost the lead settles nothing")
                    try await storage.endSetup(older)
                    secondMayStop.open()
                    try await group.waitForAll()
                }
            }
        }
    }
}

private func context(_ logger: Logger) async throws -> OrchestratorStorageContext {
    let publisher = try await InProcessBus().publisher(at: Endpoint("inproc://routes"))
    return OrchestratorStorageContext(publisher: publisher, retention: Outbox.Retention(), logger: logger)
}

/// The current term (the `leader` row's epoch) of `location`'s schema.
private func term(of location: PostgresLocation) async throws -> Int64 {
    try await withClient(of: location) { client, logger in
        var epoch: Int64 = -1
        for try await value in try await client.query("SELECT epoch FROM leader WHERE id = 1", logger: logger).decode(Int64.self) {
            epoch = value
        }
        return epoch
    }
}

/// Ends the session that holds `location`'s lead (as a network failure would).
private func cutLead(of location: PostgresLocation) async throws {
    let ended = try await withClient(of: location) { client, logger in
        var ended: Int64 = 0
        let name = "onboarding.lead." + location.schema
        for try await count in try await client.query(
            """
            SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l
            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
              AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended(\(name), 0)
            """,
            logger: logger
        ).decode(Int64.self) { ended = count }
        return ended
    }
    #expect(ended == 1)
}

private func withClient<T: Sendable>(of location: PostgresLocation, _ body: (PostgresClient, Logger) async throws -> T) async throws -> T {
    let client = PostgresClient(configuration: location.clientConfiguration(applicationName: "onboarding-tests"), backgroundLogger: quietLogger)
    return try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { await client.run() }
        defer { group.cancelAll() }
        return try await body(client, quietLogger)
    }
}

/// Log messages of notice and above, to wait for one.
final class CapturedLog: Sendable {
    private let messages = Mutex<[String]>([])

    func logger(label: String) -> Logger {
        var logger = Logger(label: label) { _ in Handler(log: self) }
        logger.logLevel = .notice
        return logger
    }

    /// Returns once a message containing `text` was logged; throws after 10 s.
    func waitFor(_ text: String) async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while !messages.withLock({ $0.contains { $0.contains(text) } }) {
            guard ContinuousClock.now < deadline else { throw ServiceError(.timeout, "Nothing logged \"\(text)\" within 10 s.") }
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    private struct Handler: LogHandler {
        let log: CapturedLog
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .notice

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            log.messages.withLock { $0.append(event.message.description) }
        }
    }
}

/// The attempt the replica that leads now gave its try, for the one that lost the lead to ask about.
private final class NewestAttempt: Sendable {
    let value = Atomic<UInt64>(0)
}
