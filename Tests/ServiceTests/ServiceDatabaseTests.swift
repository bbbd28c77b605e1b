import Foundation
import GRDB
import Logging
import ServiceRuntime
import Synchronization
import Testing

@Suite("Service databases")
struct ServiceDatabaseTests {
    func fileSize(_ path: String) -> Int {
        ((try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? Int) ?? 0
    }

    @Test("commits never checkpoint; the checkpointer moves the write-ahead log into the file")
    func checkpointsOffTheCommitPath() async throws {
        try await withTemporaryDirectory { directory in
            let path = "\(directory)/checkpoint.sqlite"
            let writer = try ServiceDatabase.open(path: path)
            try await writer.write { db in
                try db.execute(sql: "CREATE TABLE blob (id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
                for _ in 0..<2_000 {
                    try db.execute(sql: "INSERT INTO blob (data) VALUES (?)", arguments: [Data(count: 1024)])
                }
            }
            // Two thousand 1 KiB rows, well past SQLite's usual 1,000-page automatic checkpoint:
            // with automatic checkpoints off they are all still in the log.
            #expect(fileSize(path) < 64 * 1024)
            #expect(fileSize(path + "-wal") > 2 * 1024 * 1024)

            try await withCheckpoints(path: path, every: .seconds(3600), logger: quietLogger) {}
            #expect(fileSize(path) > 2 * 1024 * 1024, "the final checkpoint copied the rows into the file")
            let count = try await writer.read { try Int.fetchOne($0, sql: "SELECT COUNT(*) FROM blob") }
            #expect(count == 2_000)

            // Past the size limit, the log is truncated.
            try await withCheckpoints(path: path, every: .seconds(3600), walLimit: 1024, logger: quietLogger) {}
            #expect(fileSize(path + "-wal") == 0)
        }
    }

    @Test("under steady writes the log starts over instead of growing, with no truncation")
    func logStartsOver() async throws {
        try await withTemporaryDirectory { directory in
            let path = "\(directory)/restart.sqlite"
            let writer = try ServiceDatabase.open(path: path)
            try await writer.write { try $0.execute(sql: "CREATE TABLE blob (id INTEGER PRIMARY KEY, data BLOB NOT NULL)") }
            // 8 MiB in 2,000 small transactions, while the checkpointer runs every 5 ms and lets
            // the log hold 256 KiB before it has the writer start it over.
            try await withCheckpoints(
                path: path, writer: writer, every: .milliseconds(5), restartAfter: 256 * 1024, walLimit: .max, logger: quietLogger
            ) {
                // Paced like traffic (50 transactions, then a pause), so that a loaded machine
                // still gives the checkpointer its turns.
                for round in 0..<40 {
                    for _ in 0..<50 {
                        try await writer.write { try $0.execute(sql: "INSERT INTO blob (data) VALUES (?)", arguments: [Data(count: 4096)]) }
                    }
                    if round < 39 { try await Task.sleep(for: .milliseconds(20)) }
                }
            }
            #expect(fileSize(path + "-wal") < 4 * 1024 * 1024, "the log was reused, not grown to hold all 8 MiB")
            let count = try await writer.read { try Int.fetchOne($0, sql: "SELECT COUNT(*) FROM blob") }
            #expect(count == 2_000)
        }
    }

    @Test("when the checkpointer stops, its connection is closed: the next process finds the file free")
    func checkpointerLetsGo() async throws {
        try await withTemporaryDirectory { directory in
            let path = "\(directory)/free.sqlite"
            do {
                let writer = try ServiceDatabase.open(path: path)
                try await withCheckpoints(path: path, writer: writer, every: .milliseconds(5), logger: quietLogger) {
                    for value in 0..<20 {
                        try await writer.write { db in
                            try db.execute(sql: "CREATE TABLE IF NOT EXISTS t (x)")
                            try db.execute(sql: "INSERT INTO t VALUES (?)", arguments: [value])
                        }
                    }
                }
                try writer.close()
            }
            // Leaving WAL mode needs the only connection to the file: no busy timeout, so any
            // connection left open would make this fail at once.
            let alone = try DatabaseQueue(path: path)
            let mode = try await alone.writeWithoutTransaction { try String.fetchOne($0, sql: "PRAGMA journal_mode = DELETE") }
            #expect(mode == "delete")
            #expect(try await alone.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM t") } == 20)
        }
    }

    @Test("writeTransaction commits what its body wrote, and rolls all of it back when the body throws")
    func writeTransaction() throws {
        struct Refused: Error {}
        let writer = try ServiceDatabase.open(path: nil)
        try writer.writeWithoutTransaction { try $0.execute(sql: "CREATE TABLE t (x INTEGER PRIMARY KEY)") }
        let outcomes = Mutex<[String]>([])
        for round in 1...3 {
            // The statements are prepared once and reused: each round runs the same BEGIN and COMMIT.
            let inserted = try writer.writeTransaction { db in
                db.afterNextTransaction(
                    onCommit: { _ in outcomes.withLock { $0.append("commit") } },
                    onRollback: { _ in outcomes.withLock { $0.append("rollback") } })
                try db.execute(sql: "INSERT INTO t VALUES (?)", arguments: [round])
                return round
            }
            #expect(inserted == round)
        }
        #expect(throws: Refused.self) {
            try writer.writeTransaction { db in
                db.afterNextTransaction(
                    onCommit: { _ in outcomes.withLock { $0.append("commit") } },
                    onRollback: { _ in outcomes.withLock { $0.append("rollback") } })
                try db.execute(sql: "INSERT INTO t VALUES (4)")
                throw Refused()
            }
        }
        // A failing statement inside the body: the error is the caller's, and nothing stays.
        #expect(throws: DatabaseError.self) {
            try writer.writeTransaction { db in
                try db.execute(sql: "INSERT INTO t VALUES (5)")
                try db.execute(sql: "INSERT INTO t VALUES (1)")
            }
        }
        let rows = try writer.read { try Int.fetchAll($0, sql: "SELECT x FROM t ORDER BY x") }
        #expect(rows == [1, 2, 3])
        #expect(outcomes.withLock { $0 } == ["commit", "commit", "commit", "rollback"])
        #expect(writer.writeWithoutTransaction { $0.isInsideTransaction } == false)
        try writer.writeTransaction { try $0.execute(sql: "INSERT INTO t VALUES (6)") }
        #expect(try writer.read { try Int.fetchAll($0, sql: "SELECT x FROM t ORDER BY x") } == [1, 2, 3, 6])
    }

    @Test("a new database and its -wal and -shm files are readable by their owner only")
    func newDatabaseModes() async throws {
        try await withTemporaryDirectory { directory in
            let path = "\(directory)/data/new.sqlite"
            let writer = try ServiceDatabase.open(path: path)
            try await writer.write { try $0.execute(sql: "CREATE TABLE t (x)") }
            let reader = try await writer.read { try Int.fetchOne($0, sql: "SELECT COUNT(*) FROM t") }
            #expect(reader == 0)
            for file in [path, path + "-wal", path + "-shm"] {
                #expect(mode(of: file) == 0o600, "\(file)")
            }
        }
    }

    @Test("an existing database that others could read is tightened to 0600 when opened")
    func existingDatabaseIsTightened() async throws {
        try await withTemporaryDirectory { directory in
            let path = "\(directory)/old.sqlite"
            do {
                let writer = try DatabasePool(path: path)
                try await writer.write { try $0.execute(sql: "CREATE TABLE t (x)") }
                try writer.close()
            }
            // Closing removed the -wal and -shm files; an earlier version's crash leaves them.
            for file in [path, path + "-wal", path + "-shm"] {
                if !FileManager.default.fileExists(atPath: file) {
                    #expect(FileManager.default.createFile(atPath: file, contents: nil))
                }
                chmod(file, 0o644)
                #expect(mode(of: file) == 0o644)
            }
            let writer = try ServiceDatabase.open(path: path)
            try await writer.write { try $0.execute(sql: "INSERT INTO t VALUES (1)") }
            for file in [path, path + "-wal", path + "-shm"] {
                #expect(mode(of: file) == 0o600, "\(file)")
            }
        }
    }
}

/// The permission bits of `path` (not following a symbolic link), or `nil` when it is gone.
func mode(of path: String) -> mode_t? {
    var status = stat()
    guard lstat(path, &status) == 0 else { return nil }
    return status.st_mode & 0o777
}
