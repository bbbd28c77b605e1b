import Foundation
import Messaging
import OnboardingAPI
import PostgresNIO
import PostgresSupport
import ServiceRuntime
import Synchronization
import Testing

@Suite("PostgreSQL: pipelined event transactions", .enabled(if: testDatabaseURL != nil), .timeLimit(.minutes(1)))
struct PipelinedTransactionTests {
    /// Runs `body` with a store on a fresh schema holding the outbox and a table `thing`.
    private func withStore(
        timeout: Duration = .seconds(5), applicationName: String = "test",
        _ body: @Sendable (PostgresStore, PostgresClient) async throws -> Void
    ) async throws {
        try await withTestSchema { client, location in
            try await migratedOutbox(client, location)
            try await client.query("CREATE TABLE thing (id bigint PRIMARY KEY, name text, tags text[])", logger: quietLogger)
            let store = PostgresStore(location: location, applicationName: applicationName, timeout: timeout, logger: quietLogger)
            let running = Task { await store.run() }
            defer { running.cancel() }
            try await body(store, client)
        }
    }

    private func things(_ client: PostgresClient) async throws -> [Int64] {
        var ids: [Int64] = []
        for try await id in try await client.query("SELECT id FROM thing ORDER BY id", logger: quietLogger).decode(Int64.self) {
            ids.append(id)
        }
        return ids
    }

    @Test("statements run in the order sent: a read sees the writes queued before it; values, NULLs and empty text come back as sent")
    func orderAndValues() async throws {
        try await withStore { store, client in
            let read = try await store.pipelinedEventTransaction({ transaction in
                try transaction.send("INSERT INTO thing VALUES (\(Int64(1)), \("one"), \(["a", "b"]))")
                try transaction.send("INSERT INTO thing VALUES (\(Int64(2)), \(String?.none), \([String]()))")
                try transaction.send("INSERT INTO thing VALUES (\(Int64(3)), \(""), \([""]))")
                return try transaction.rows("SELECT id, name, tags FROM thing WHERE id <= \(Int64(3)) ORDER BY id")
                    .decode((Int64, String?, [String]).self)
                    .map { "\($0.0):\($0.1 ?? "NULL"):\($0.2)" }
            }, afterCommit: { _ in })
            #expect(read == ["1:one:[\"a\", \"b\"]", "2:NULL:[]", "3::[\"\"]"])
            #expect(try await things(client) == [1, 2, 3], "committed")
        }
    }

    @Test("events are numbered on from the outbox head, and published once committed; a failed statement keeps nothing, publishes nothing, and the next transaction runs")
    func outboxAndFailures() async throws {
        try await withStore { store, client in
            let outbox = PostgresOutbox(source: "auth")
            let published = Mutex<[UInt64]>([])
            @Sendable func record(_ count: Int, failing: Bool) async throws {
                _ = try await store.pipelinedEventTransaction({ transaction in
                    try transaction.send("INSERT INTO thing (id) VALUES (\(Int64(10 + count)))")
                    if failing { try transaction.send("INSERT INTO thing (id) VALUES (\(Int64(10 + count)))") }
                    return try outbox.record(
                        (0..<count).map { _ in PostgresOutbox.Recording(SignedOut(uid: "u1"), uid: "u1") }, in: transaction)
                }, afterCommit: { messages in
                    published.withLock { $0 += messages.compactMap { try? Message(topic: $0.topic, body: $0.body).header.sequence } }
                })
            }
            try await record(2, failing: false)
            await #expect(throws: ServiceError.self, "a duplicate key fails the commit's flight") {
                try await record(3, failing: true)
            }
            try await record(1, failing: false)
            #expect(published.withLock { $0 } == [1, 2, 3], "the failed transaction's numbers were given back")
            #expect(try await things(client) == [11, 12])
            let page = try await store.read { try await PostgresOutbox.events(after: 0, on: $0, logger: quietLogger) }
            #expect(page.events.map(\.sequence) == [1, 2, 3])
        }
    }

    @Test("an error the body throws reaches the caller as itself, and nothing it sent is kept")
    func bodyErrors() async throws {
        try await withStore { store, client in
            do {
                _ = try await store.pipelinedEventTransaction({ transaction in
                    _ = try transaction.rows("INSERT INTO thing (id) VALUES (\(Int64(1))) RETURNING id")
                    throw ServiceError(.usernameTaken, "Taken.", reason: "test")
                }, afterCommit: { (_: Void) in Issue.record("committed") })
                Issue.record("the transaction succeeded")
            } catch let error as ServiceError {
                #expect(error.code == .usernameTaken && error.reason == "test", "\(error)")
            }
            #expect(try await things(client).isEmpty, "rolled back")
            #expect(try await store.pipelinedEventTransaction({ try $0.lastSequence() }, afterCommit: { _ in }) == 0)
        }
    }

    @Test("a statement past the store's time limit fails its caller; the server ends it (statement_timeout), so the outbox's lock it held is free for the next")
    func timeLimit() async throws {
        try await withStore(timeout: .milliseconds(500)) { store, _ in
            do {
                try await store.pipelinedEventTransaction({ transaction in
                    _ = try transaction.rows("SELECT pg_sleep(2)")
                }, afterCommit: { _ in })
                Issue.record("a two-second statement finished within half a second")
            } catch let error as ServiceError {
                // Whichever comes first: the caller's timer, or the server ending the statement.
                #expect([.timeout, .storeUnavailable].contains(error.code), "\(error)")
            }
            #expect(try await store.pipelinedEventTransaction({ try $0.lastSequence() }, afterCommit: { _ in }) == 0)
        }
    }

    @Test("transactions one after another share the connection; one the server ended while idle is replaced before the next is sent")
    func reuseAndReplace() async throws {
        let name = "pipeline-test-\(UInt32.random(in: 0...UInt32.max))"
        try await withStore(applicationName: name) { store, client in
            for id in Int64(1)...5 {
                try await store.pipelinedEventTransaction({ try $0.send("INSERT INTO thing (id) VALUES (\(id))") }, afterCommit: { _ in })
            }
            // As a restart or an administrator would: every connection of the store ends.
            var ended: [Int32] = []
            // (In the select list: a function in WHERE may run before the other condition.)
            let terminated = try await client.query(
                "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = \(name)", logger: quietLogger)
            for try await (pid, _) in terminated.decode((Int32, Bool).self) { ended.append(pid) }
            // Until they are gone (a backend leaves pg_stat_activity after it has told its client
            // why); the store's pool opens new ones meanwhile.
            let deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline {
                let rows = try await client.query(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(\(ended))", logger: quietLogger)
                var left: Int64 = 0
                for try await count in rows.decode(Int64.self) { left = count }
                if left == 0 { break }
                try await Task.sleep(for: .milliseconds(10))
            }
            try await store.pipelinedEventTransaction({ try $0.send("INSERT INTO thing (id) VALUES (\(Int64(6)))") }, afterCommit: { _ in })
            #expect(try await things(client) == [1, 2, 3, 4, 5, 6])
        }
    }

    @Test("a statement error the body catches still fails the transaction: nothing is committed or published")
    func caughtErrorsStillFail() async throws {
        try await withStore { store, client in
            do {
                try await store.pipelinedEventTransaction({ transaction in
                    try transaction.send("INSERT INTO thing (id) VALUES (\(Int64(1)))")
                    _ = try? transaction.rows("INSERT INTO thing (id) VALUES (\(Int64(1))) RETURNING id")
                    _ = try? transaction.rows("SELECT id FROM thing")
                    try transaction.send("INSERT INTO thing (id) VALUES (\(Int64(2)))")
                }, afterCommit: { _ in Issue.record("published") })
                Issue.record("the transaction committed")
            } catch let error as ServiceError {
                #expect(error.code == .storeUnavailable, "\(error)")
            }
            #expect(try await things(client).isEmpty)
        }
    }
}
