import Foundation
import Logging
import Messaging
import OnboardingAPI
import PostgresNIO
import PostgresSupport
import ServiceRuntime
import Synchronization
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

let testDatabaseURL = TestPostgres.url

let quietLogger: Logger = {
    var logger = Logger(label: "test.postgres")
    logger.logLevel = .critical
    return logger
}()

/// Runs `body` with a client whose tables live in a fresh schema, dropped afterwards.
func withTestSchema<T: Sendable>(
    _ body: @Sendable (PostgresClient, PostgresLocation) async throws -> T
) async throws -> T {
    try await TestPostgres.withSchema { location in
        let client = PostgresClient(
            configuration: location.clientConfiguration(applicationName: "onboarding-tests"), backgroundLogger: quietLogger)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            return try await body(client, location)
        }
    }
}

func migratedOutbox(_ client: PostgresClient, _ location: PostgresLocation) async throws {
    var migrator = try PostgresMigrator(schema: location.schema)
    PostgresOutbox.registerMigration(in: &migrator)
    try await migrator.migrate(client, logger: quietLogger)
}

/// Appends `count` events in one transaction and returns their sequence numbers as published.
func append(_ count: Int, to outbox: PostgresOutbox, client: PostgresClient) async throws -> [UInt64] {
    let messages = try await client.withTransaction(logger: quietLogger) { connection in
        try await outbox.append(
            (0..<count).map { _ in PostgresOutbox.Recording(SignedOut(uid: "u1"), uid: "u1") }, on: connection,
            logger: quietLogger)
    }
    return try messages.map { try Message(topic: $0.topic, body: $0.body).header.sequence }
}

@Suite("PostgreSQL: migrations and the outbox", .enabled(if: testDatabaseURL != nil), .timeLimit(.minutes(1)))
struct PostgresOutboxTests {
    @Test("two replicas migrating at once: one applies every migration, the other finds them applied")
    func concurrentMigrations() async throws {
        try await withTestSchema { client, location in
            var migrator = try PostgresMigrator(schema: location.schema)
            PostgresOutbox.registerMigration(in: &migrator)
            migrator.register("second", ["CREATE TABLE thing (id int PRIMARY KEY)"])
            async let first = migrator.migrate(client, logger: quietLogger)
            async let second = migrator.migrate(client, logger: quietLogger)
            let applied = try await [first, second].sorted { $0.count < $1.count }
            #expect(applied == [[], ["outbox-v1", "second"]])
            #expect(try await migrator.migrate(client, logger: quietLogger).isEmpty, "a restart applies nothing")
        }
    }

    @Test("a migration may outlast the store's time limit, and one whose connection is lost is tried again")
    func watchedMigration() async throws {
        try await withTestSchema { client, location in
            let name = "test-migration-\(UInt32.random(in: 0...UInt32.max))"
            let store = PostgresStore(location: location, applicationName: name, timeout: .seconds(1), logger: quietLogger)
            let running = Task { await store.run() }
            defer { running.cancel() }
            var migrator = try PostgresMigrator(schema: location.schema)
            migrator.register("slow", ["SELECT pg_sleep(2.5)"])
            // Ends the first try's server process while it sleeps, as a database restart would.
            let ended = Task {
                while true {
                    let rows = try await client.query(
                        """
                        SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                        WHERE application_name = \(name) AND query = 'SELECT pg_sleep(2.5)' AND state = 'active'
                        """, logger: quietLogger)
                    for try await terminated in rows.decode(Bool.self) where terminated { return }
                    try await Task.sleep(for: .milliseconds(20))
                }
            }
            defer { ended.cancel() }
            let applied = try await store.migrate(migrator, patience: .seconds(30))
            try await ended.value
            // The second try sleeps past the store's 1 s limit: it is left to run while its
            // process lives. (Were a try given up and committed later, the next finds it applied.)
            #expect(applied == ["slow"] || applied.isEmpty)
            let recorded = try await client.query(
                PostgresQuery(unsafeSQL: "SELECT count(*)::int FROM \(location.schema).migration WHERE name = 'slow'"), logger: quietLogger)
            for try await count in recorded.decode(Int.self) { #expect(count == 1) }
        }
    }

    @Test("appends from concurrent transactions get dense numbers, and a reader never sees one before the one below it")
    func denseSequences() async throws {
        try await withTestSchema { client, location in
            try await migratedOutbox(client, location)
            let outbox = PostgresOutbox(source: "auth")
            let (writers, transactions) = (4, 60)
            func size(_ writer: Int, _ transaction: Int) -> Int { (writer + transaction) % 3 + 1 }
            let expected = (0..<writers).flatMap { w in (0..<transactions).map { size(w, $0) } }.reduce(0, +)
            // A reader pages through what is visible while the writers run: every page continues
            // exactly where the previous one ended.
            let reader = Task {
                var cursor: UInt64 = 0
                var pages = 0
                while cursor < UInt64(expected) {
                    let page = try await client.withConnection { connection in
                        try await PostgresOutbox.events(after: cursor, limit: 50, on: connection, logger: quietLogger)
                    }
                    for event in page.events {
                        #expect(event.sequence == cursor + 1, "no number is skipped or seen early")
                        cursor = event.sequence
                    }
                    #expect(page.lastSequence >= cursor)
                    pages += 1
                }
                return pages
            }
            let published = try await withThrowingTaskGroup(of: [UInt64].self) { group in
                for writer in 0..<writers {
                    group.addTask {
                        var numbers: [UInt64] = []
                        for transaction in 0..<transactions {
                            numbers += try await append(size(writer, transaction), to: outbox, client: client)
                        }
                        return numbers
                    }
                }
                return try await group.reduce(into: []) { $0 += $1 }
            }
            #expect(published.sorted() == Array(1...UInt64(expected)), "numbers are dense, none used twice")
            #expect(try await reader.value > 1, "the reader paged while the writers wrote")
        }
    }

    @Test("a page names what is kept; pruning keeps the numbering, and a limit below 1 is refused")
    func pagesAndPruning() async throws {
        try await withTestSchema { client, location in
            try await migratedOutbox(client, location)
            let outbox = PostgresOutbox(source: "auth")
            #expect(try await append(10, to: outbox, client: client) == Array(1...10))
            let page = try await client.withConnection { connection in
                try await PostgresOutbox.events(after: 2, limit: 3, on: connection, logger: quietLogger)
            }
            #expect(page.events.map(\.sequence) == [3, 4, 5])
            #expect(page.firstSequence == 1 && page.lastSequence == 10)
            let envelope = try #require(page.events.first?.envelope)
            #expect(try Message(topic: "auth.signedOut", body: Data(envelope.utf8)).header.sequence == 3)

            let kept = Outbox.Retention(maxAge: .seconds(3600), maxEvents: 4)
            #expect(try await PostgresOutbox.prune(kept, client: client, logger: quietLogger) == 6)
            let after = try await client.withConnection { connection in
                try await PostgresOutbox.events(after: 0, on: connection, logger: quietLogger)
            }
            #expect(after.events.map(\.sequence) == [7, 8, 9, 10] && after.firstSequence == 7)

            let none = Outbox.Retention(maxAge: .seconds(3600), maxEvents: 0)
            #expect(try await PostgresOutbox.prune(none, client: client, logger: quietLogger) == 4)
            let empty = try await client.withConnection { connection in
                try await PostgresOutbox.events(after: 0, on: connection, logger: quietLogger)
            }
            #expect(empty.events.isEmpty && empty.firstSequence == 0 && empty.lastSequence == 10)
            #expect(try await append(1, to: outbox, client: client) == [11], "numbers are never reused")

            await #expect(throws: ServiceError.self) {
                try await client.withConnection { connection in
                    try await PostgresOutbox.events(after: 0, limit: 0, on: connection, logger: quietLogger)
                }
            }
        }
    }
}

@Suite("PostgreSQL: where the database is")
struct PostgresLocationTests {
    @Test("a URL gives host, port, user, database and TLS; a socket directory comes from host=")
    func reads() throws {
        let tcp = try PostgresLocation(url: "postgresql://app:s%40cret@db.internal:6432/onboarding?sslmode=require", schema: "auth")
        #expect(tcp.host == "db.internal" && tcp.port == 6432 && tcp.username == "app" && tcp.password == "s@cret")
        #expect(tcp.database == "onboarding" && tcp.tls == .require && tcp.schema == "auth" && tcp.socketDirectory == nil)
        #expect(!tcp.description.contains("s@cret") && !tcp.description.contains("cret"), "the password is never shown")
        let socket = try PostgresLocation(url: "postgresql://onboarding@localhost:7590/onboarding?host=/run/pg", schema: "profile")
        #expect(socket.socketDirectory == "/run/pg" && socket.port == 7590 && socket.tls == .prefer)
    }

    @Test("a URL or schema that cannot be used is refused with what to write instead")
    func refuses() {
        for url in ["mysql://a@b/c", "postgresql://host/db", "postgresql://a@host/", "postgresql://a@h/db?sslmode=maybe"] {
            #expect(throws: ServiceError.self, "\(url)") { try PostgresLocation(url: url, schema: "auth") }
        }
        for schema in ["", "Auth", "1st", "a-b", "a;drop", String(repeating: "a", count: 64)] {
            #expect(throws: ServiceError.self, "\(schema)") { try PostgresLocation(url: "postgresql://a@h/db", schema: schema) }
        }
    }
}

@Suite("PostgreSQL: the store's failures", .timeLimit(.minutes(1)))
struct PostgresStoreTests {
    /// A TCP port that accepts connections and never answers: a paused server.
    final class SilentServer: Sendable {
        let fd: Int32
        let port: Int

        init() throws {
            (fd, port) = try #require(loopbackListener())
        }

        deinit { close(fd) }
    }

    @Test("a server that never answers costs a caller the store's timeout, then timeout (the change may have been made); migrating against an unreachable one fails naming it")
    func silentAndUnreachable() async throws {
        let silent = try SilentServer()
        let paused = PostgresStore(
            location: try PostgresLocation(url: "postgresql://a@127.0.0.1:\(silent.port)/db?sslmode=disable", schema: "auth"),
            applicationName: "test", timeout: .milliseconds(300), logger: quietLogger)
        let running = Task { await paused.run() }
        let started = ContinuousClock.now
        await #expect(throws: ServiceError.self) { _ = try await paused.read { _ in 1 } }
        let waited = ContinuousClock.now - started
        // Not before the timeout; the upper bound only tells "answered" from "hung" (a loaded
        // machine delays the timer, as a full parallel run beside a build once did by seconds).
        #expect(waited >= .milliseconds(290) && waited < .seconds(30), "bounded by the timeout: \(waited)")
        do {
            _ = try await paused.transaction { _ in 1 }
        } catch let error as ServiceError {
            #expect(error.code == .timeout && error.message.contains("may or may not have been made"), "\(error)")
        }
        running.cancel()

        let unreachable = PostgresStore(
            location: try PostgresLocation(url: "postgresql://a@127.0.0.1:1/db?sslmode=disable", schema: "auth"),
            applicationName: "test", timeout: .seconds(2), logger: quietLogger)
        let runningToo = Task { await unreachable.run() }
        var migrator = try PostgresMigrator(schema: "auth")
        PostgresOutbox.registerMigration(in: &migrator)
        do {
            try await unreachable.migrate(migrator, patience: .milliseconds(300))
            Issue.record("migrating against nothing succeeded")
        } catch let error as ServiceError {
            #expect(error.code == .storeUnavailable && error.message.contains("127.0.0.1:1/db"), "names where: \(error.message)")
        }
        runningToo.cancel()
    }

    @Test("an error a transaction's body throws reaches the caller as itself, and nothing of it is kept", .enabled(if: testDatabaseURL != nil))
    func bodyErrors() async throws {
        try await withTestSchema { client, location in
            try await migratedOutbox(client, location)
            let store = PostgresStore(location: location, applicationName: "test", logger: quietLogger)
            let running = Task { await store.run() }
            defer { running.cancel() }
            let outbox = PostgresOutbox(source: "auth")
            do {
                _ = try await store.transaction { connection in
                    _ = try await outbox.append([PostgresOutbox.Recording(SignedOut(uid: "u1"), uid: "u1")], on: connection, logger: quietLogger)
                    throw ServiceError(.usernameTaken, "Taken.", reason: "test")
                }
                Issue.record("the transaction succeeded")
            } catch let error as ServiceError {
                #expect(error.code == .usernameTaken && error.reason == "test", "\(error)")
            }
            let last = try await store.read { connection in try await PostgresOutbox.lastSequence(on: connection, logger: quietLogger) }
            #expect(last == 0, "rolled back")
        }
    }

    @Test("every connection plans each run of a prepared statement for its own inputs (a generic plan, made while the tables were small, slowed every batch once they grew)")
    func customPlans() async throws {
        try await withTestSchema { client, _ in
            for try await mode in try await client.query("SHOW plan_cache_mode", logger: quietLogger).decode(String.self) {
                #expect(mode == "force_custom_plan")
            }
        }
    }

    @Test("a statement whose preparation failed is prepared again on a fresh connection once the cause is gone")
    func failedPreparationRecovers() async throws {
        try await withTestSchema { client, location in
            // One connection: without a fresh one, postgres-nio would answer the failed
            // preparation's error again on every later run.
            let store = PostgresStore(location: location, applicationName: "test", maxConnections: 1, logger: quietLogger)
            let running = Task { await store.run() }
            defer { running.cancel() }
            // No outbox yet: preparing the head's lock fails at the server.
            await #expect(throws: ServiceError.self) {
                try await store.eventTransaction({ _, last in last }, afterCommit: { _ in })
            }
            try await migratedOutbox(client, location)
            #expect(try await store.eventTransaction({ _, last in last }, afterCommit: { _ in }) == 0)
        }
    }

    @Test("the retention loop prunes a PostgreSQL outbox while the service runs", .enabled(if: testDatabaseURL != nil))
    func retentionLoop() async throws {
        try await withTestSchema { client, location in
            try await migratedOutbox(client, location)
            let outbox = PostgresOutbox(source: "auth")
            _ = try await append(5, to: outbox, client: client)
            let store = PostgresStore(location: location, applicationName: "test", logger: quietLogger)
            let running = Task { await store.run() }
            defer { running.cancel() }
            let kept = Outbox.Retention(maxAge: .seconds(3600), maxEvents: 2)
            try await withEventRetention(kept, postgres: store, every: .milliseconds(20)) {
                let deadline = ContinuousClock.now + .seconds(10)
                while ContinuousClock.now < deadline {
                    let page = try await store.read { connection in
                        try await PostgresOutbox.events(after: 0, on: connection, logger: quietLogger)
                    }
                    if page.firstSequence == 4 { return }
                    try await Task.sleep(for: .milliseconds(20))
                }
                Issue.record("the outbox was not pruned to its last two events")
            }
        }
    }
}
