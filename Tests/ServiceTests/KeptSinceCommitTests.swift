import Foundation
import GRDB
import ServiceRuntime
import Testing

@Suite("KeptSinceCommit: a value kept from a commit until the file changes")
struct KeptSinceCommitTests {
    @Test("kept across this writer's transactions; dropped once another connection commits, or on forget")
    func keptUntilTheFileChanges() async throws {
        try await withTemporaryDirectory { directory in
            let path = "\(directory)/kept.sqlite"
            let pool = try DatabasePool(path: path)
            try pool.write { try $0.execute(sql: "CREATE TABLE t (x INTEGER)") }
            let other = try DatabaseQueue(path: path)
            let kept = KeptSinceCommit<Int>()
            func commit(keeping value: Int) throws {
                try pool.writeTransaction { db in
                    try db.execute(sql: "INSERT INTO t (x) VALUES (?)", arguments: [value])
                    db.afterNextTransaction(onCommit: { kept.keep(value, committedIn: $0) })
                }
            }
            func seen() throws -> Int? { try pool.writeTransaction { kept.value(in: $0) } }

            #expect(try seen() == nil)
            try commit(keeping: 1)
            #expect(try seen() == 1)
            // That look was a transaction of this writer's own, empty but committed: it moved the
            // version too, and nothing was kept at its commit.
            #expect(try seen() == nil)
            try commit(keeping: 2)
            try other.write { try $0.execute(sql: "INSERT INTO t (x) VALUES (3)") }
            #expect(try seen() == nil)
            try commit(keeping: 4)
            kept.forget()
            #expect(try seen() == nil)
        }
    }
}
