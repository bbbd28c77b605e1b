import Foundation
import GRDB
import Messaging
import OnboardingAPI
import PropertyBased
import ServiceRuntime
import Synchronization
import Testing

/// The outbox numbers its events itself (see `Outbox.append`). Over random runs of commits,
/// rollbacks, a second writer, pruning and restarts, the numbers must stay what subscribers
/// count on. (A number kept from one transaction to the next without asking whether the file
/// changed since, as once tried, failed this: a second writer's stale number, pruned in between,
/// was used again. It is now kept only while SQLite's data version stands still.)
@Suite("Outbox numbering over random commits, rollbacks, aborts, pruning and restarts")
struct OutboxNumberingTests {
    /// Step kinds: 0 commit one event, 1 commit three, 2 roll back a transaction that recorded
    /// two, 3 another writer (a second outbox on the same database) commits one, 4 prune all
    /// but the newest two events, 5 restart (a new outbox reads the numbering again), 6 a
    /// transaction that recorded two and that SQLite then rolls back by itself (an interrupted
    /// INSERT).
    static let steps = Gen.int(in: 0...6).array(of: 1...60)

    @Test("committed events are numbered 1, 2, 3, … with no gap and no number used twice, and only they are published, in order")
    func numbering() async throws {
        await propertyCheck(count: 200, input: Self.steps) { steps in
            let problems = try await Self.run(steps)
            #expect(problems.isEmpty, "\(problems) after steps \(steps)")
        }
    }

    @Test("another connection's commit (another process, say) between two of an outbox's transactions is numbered in")
    func anotherConnection() async throws {
        try await withTemporaryDirectory { directory in
            let path = "\(directory)/outbox.sqlite"
            let pool = try DatabasePool(path: path)
            var migrator = DatabaseMigrator()
            Outbox.registerMigration(in: &migrator)
            try migrator.migrate(pool)
            let elsewhere = try DatabaseQueue(path: path)
            let published = RecordingPublisher()
            let here = Outbox(source: "numbering", publisher: published)
            let there = Outbox(source: "numbering", publisher: published)
            func append(by outbox: Outbox, in writer: some DatabaseWriter) throws -> UInt64 {
                try writer.writeTransaction { db in try outbox.append(SignedOut(uid: "someone"), uid: "someone", in: db) }
            }
            var numbers = [try append(by: here, in: pool), try append(by: here, in: pool)]
            numbers.append(try append(by: there, in: elsewhere))
            numbers += [try append(by: here, in: pool), try append(by: there, in: elsewhere), try append(by: here, in: pool)]
            #expect(numbers == [1, 2, 3, 4, 5, 6])
            #expect(try pool.read { try Outbox.lastSequence(in: $0) } == 6)
        }
    }

    struct Rollback: Error {}

    /// Keeps what was published.
    final class RecordingPublisher: EventPublisher {
        let endpoint: Endpoint = "inproc://numbering"
        let sequences = Mutex<[UInt64]>([])
        func publish(_ message: OutgoingMessage) throws {
            let header = try JSONDecoder().decode(Envelope<SignedOut>.self, from: message.body).header
            sequences.withLock { $0.append(header.sequence) }
        }
        func close() {}
    }

    static func run(_ steps: [Int]) async throws -> [String] {
        let database = try DatabaseQueue()
        var migrator = DatabaseMigrator()
        Outbox.registerMigration(in: &migrator)
        migrator.registerMigration("t") { try $0.execute(sql: "CREATE TABLE t (x INTEGER)") }
        try migrator.migrate(database)
        // Interrupts the statement calling it: SQLite rolls back the transaction of that INSERT.
        try await database.write { db in
            db.add(function: DatabaseFunction("interrupt_now", argumentCount: 0, pure: false) { _ in
                database.interrupt()
                return 1
            })
        }
        let published = RecordingPublisher()
        var outbox = Outbox(source: "numbering", publisher: published)
        let other = Outbox(source: "numbering", publisher: published)
        var committed: [UInt64] = []
        var problems: [String] = []

        func append(_ count: Int, by writer: Outbox) throws -> [UInt64] {
            try database.writeTransaction { db in
                try (0..<count).map { _ in try writer.append(SignedOut(uid: "someone"), uid: "someone", in: db) }
            }
        }

        for (index, step) in steps.enumerated() {
            switch step {
            case 0: committed += try append(1, by: outbox)
            case 1: committed += try append(3, by: outbox)
            case 2:
                do {
                    try database.writeTransaction { db in
                        for _ in 0..<2 { try outbox.append(SignedOut(uid: "someone"), uid: "someone", in: db) }
                        throw Rollback()
                    }
                } catch is Rollback {}
            case 3: committed += try append(1, by: other)
            case 4: try await Outbox.prune(Outbox.Retention(maxEvents: 2), in: database)
            case 5: outbox = Outbox(source: "numbering", publisher: published)
            default:
                do {
                    try database.writeTransaction { db in
                        for _ in 0..<2 { try outbox.append(SignedOut(uid: "someone"), uid: "someone", in: db) }
                        try db.executeHot("INSERT INTO t (x) SELECT interrupt_now()") { _ in }
                    }
                    problems.append("step \(index): the interrupted transaction committed")
                } catch let error as DatabaseError where error.resultCode == .SQLITE_INTERRUPT {}
            }
            let last = try await database.read { try Outbox.lastSequence(in: $0) }
            if last != UInt64(committed.count) {
                problems.append("step \(index): lastSequence \(last) after \(committed.count) committed events")
            }
        }
        if committed != (0..<committed.count).map({ UInt64($0 + 1) }) {
            problems.append("committed numbers \(committed)")
        }
        let sent = published.sequences.withLock { $0 }
        if sent != committed {
            problems.append("published \(sent), committed \(committed)")
        }
        return problems
    }
}
