import Foundation
import GRDB
import Logging
import ServiceRuntime
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
}
