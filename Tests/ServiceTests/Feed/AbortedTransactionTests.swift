import Foundation
import GRDB
import Messaging
import OnboardingAPI
import ServiceRuntime
import Synchronization
import Testing

/// A statement can make SQLite roll the whole transaction back by itself (an interrupt, a full
/// disk, an I/O error). `writeTransaction` must then tell the transaction's observers that it
/// rolled back, as an explicit rollback does: otherwise the outbox would publish the lost events
/// with the next commit and number that commit's events after them.
@Suite("A transaction SQLite rolled back by itself")
struct AbortedTransactionTests {
    enum Way: String, CaseIterable, Sendable {
        case grdbStatement, hotStatement, fromTask
    }

    /// A service database in a directory of its own, with the outbox and a table `t`.
    static func openDatabase() throws -> (any DatabaseWriter, URL) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("aborted-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let database = try ServiceDatabase.open(path: directory.appendingPathComponent("t.sqlite").path)
        var migrator = DatabaseMigrator()
        Outbox.registerMigration(in: &migrator)
        migrator.registerMigration("t") { try $0.execute(sql: "CREATE TABLE t (x INTEGER)") }
        try migrator.migrate(database)
        return (database, directory)
    }

    @Test("its events are not published and their numbers are used again by the next commit", arguments: Way.allCases)
    func abortedTransaction(way: Way) async throws {
        let (database, directory) = try Self.openDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        // A function that interrupts the statement calling it: SQLite then rolls back the whole
        // transaction an INSERT runs in.
        try await database.write { db in
            db.add(function: DatabaseFunction("interrupt_now", argumentCount: 0, pure: false) { _ in
                database.interrupt()
                return 1
            })
        }
        let published = OutboxNumberingTests.RecordingPublisher()
        let outbox = Outbox(source: "aborted", publisher: published)

        switch way {
        case .grdbStatement, .hotStatement:
            #expect(throws: DatabaseError.self) {
                try database.writeTransaction { db in
                    _ = try outbox.append(SignedOut(uid: "lost"), uid: "lost", in: db)
                    if way == .hotStatement {
                        try db.executeHot("INSERT INTO t (x) SELECT interrupt_now()") { _ in }
                    } else {
                        try db.execute(sql: "INSERT INTO t (x) SELECT interrupt_now()")
                    }
                }
            }
        case .fromTask:
            // The way a service's requests that wait on others write (`withStore`).
            await #expect(throws: ServiceError.self) {
                try await withStore(database) { db in
                    _ = try outbox.append(SignedOut(uid: "lost"), uid: "lost", in: db)
                    try db.execute(sql: "INSERT INTO t (x) SELECT interrupt_now()")
                }
            }
        }
        #expect(try await database.read { try Outbox.lastSequence(in: $0) } == 0)

        let sequence = try database.writeTransaction { db in
            try outbox.append(SignedOut(uid: "kept"), uid: "kept", in: db)
        }
        #expect(sequence == 1)
        #expect(published.sequences.withLock { $0 } == [1])
        #expect(try await database.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM outbox") } == 1)
        try database.close()
    }

    @Test("a write whose task is cancelled halfway commits whole, and only what committed is published")
    func cancelledWrite() async throws {
        let (database, directory) = try Self.openDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        // A function that cancels the task whose write calls it (GRDB then interrupts a cancelled
        // task's statement, and SQLite rolls the transaction back).
        let writer = Mutex<Task<Void, any Error>?>(nil)
        try await database.write { db in
            db.add(function: DatabaseFunction("cancel_writer", argumentCount: 0, pure: false) { _ in
                writer.withLock { $0?.cancel() }
                return 1
            })
        }
        let published = OutboxNumberingTests.RecordingPublisher()
        let outbox = Outbox(source: "cancelled", publisher: published)

        writer.withLock { task in
            task = Task {
                _ = try await withStore(database) { db in
                    _ = try outbox.append(SignedOut(uid: "first"), uid: "first", in: db)
                    try db.execute(sql: "INSERT INTO t (x) SELECT cancel_writer()")
                    try db.execute(sql: "INSERT INTO t (x) VALUES (2)")
                }
            }
        }
        _ = try? await writer.withLock { $0 }?.value
        _ = try database.writeTransaction { db in try outbox.append(SignedOut(uid: "next"), uid: "next", in: db) }

        let committed = try await database.read { try UInt64.fetchAll($0, sql: "SELECT sequence FROM outbox ORDER BY sequence") }
        #expect(committed == [1, 2])
        #expect(published.sequences.withLock { $0 } == committed)
        #expect(try await database.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM t") } == 2)
        try database.close()
    }
}
