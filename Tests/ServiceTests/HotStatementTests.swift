import Foundation
import GRDB
import ServiceRuntime
import Testing

@Suite("Hot statements (SQLite's C API)")
struct HotStatementTests {
    func database() throws -> any DatabaseWriter {
        let writer = try ServiceDatabase.open(path: nil)
        try writer.writeWithoutTransaction { db in
            try db.execute(sql: "CREATE TABLE t (id INTEGER PRIMARY KEY, text TEXT, number INTEGER, flag INTEGER, data BLOB)")
        }
        return writer
    }

    @Test("every kind of argument is stored as GRDB would store it, and read back")
    func roundTrip() throws {
        let writer = try database()
        let rows: [(Int64, String?, Int, Bool, Data)] = [
            (1, "héllo ✓", -5, true, Data([0, 1, 2, 255])),
            (2, "", Int.max, false, Data()),
            (3, nil, 0, true, Data("x".utf8)),
        ]
        try writer.writeTransaction { db in
            for row in rows {
                try db.executeHot("INSERT INTO t (id, text, number, flag, data) VALUES (?, ?, ?, ?, ?)") {
                    $0.bind(row.0)
                    $0.bind(row.1)
                    $0.bind(row.2)
                    $0.bind(row.3)
                    $0.bind(row.4)
                }
            }
        }
        try writer.read { db in
            for row in rows {
                let stored = try #require(try Row.fetchOne(db, sql: "SELECT * FROM t WHERE id = ?", arguments: [row.0]))
                #expect(stored["text"] as String? == row.1)
                #expect(stored["number"] as Int == row.2)
                #expect(stored["flag"] as Bool == row.3)
                // Empty text and blobs stay empty, not NULL.
                #expect(stored["data"] as Data? == row.4)
                #expect((stored["text"] as DatabaseValue).isNull == (row.1 == nil))
            }
        }
        try writer.writeWithoutTransaction { db in
            for row in rows {
                let read = try db.fetchOneHot("SELECT id, text, number, flag FROM t WHERE id = ?", { $0.bind(row.0) }) { stored in
                    (stored.int64(0), stored.optionalString(1), Int(stored.int64(2)), stored.bool(3), stored.isNull(1))
                }
                let found = try #require(read)
                #expect(found.0 == row.0)
                #expect(found.1 == row.1)
                #expect(found.2 == row.2)
                #expect(found.3 == row.3)
                #expect(found.4 == (row.1 == nil))
            }
            #expect(try db.fetchOneHot("SELECT id FROM t WHERE id = ?", { $0.bind(Int64(99)) }) { $0.int64(0) } == nil)
        }
    }

    @Test("text with a NUL in it is bound as GRDB binds it, so GRDB's statements find what hot ones wrote")
    func textWithNUL() throws {
        let writer = try database()
        try writer.writeTransaction { db in
            try db.executeHot("INSERT INTO t (id, text) VALUES (?, ?)") {
                $0.bind(Int64(1))
                $0.bind("a\u{0}b")
            }
        }
        // GRDB binds a String as a C string: up to the NUL.
        let found = try writer.read { db in
            try Int64.fetchOne(db, sql: "SELECT id FROM t WHERE text = ?", arguments: ["a\u{0}b"])
        }
        #expect(found == 1)
        let stored = try writer.read { db in try String.fetchOne(db, sql: "SELECT text FROM t WHERE id = 1") }
        #expect(stored == "a")
    }

    @Test("a failing step throws SQLite's extended code, and the statement is ready for the next use")
    func failures() throws {
        let writer = try database()
        try writer.writeWithoutTransaction { db in
            let insert = "INSERT INTO t (id, text) VALUES (?, ?)"
            try db.executeHot(insert) {
                $0.bind(Int64(1))
                $0.bind("first")
            }
            do {
                try db.executeHot(insert) {
                    $0.bind(Int64(1))
                    $0.bind("again")
                }
                Issue.record("a duplicate key was accepted")
            } catch let error as DatabaseError {
                #expect(error.extendedResultCode == .SQLITE_CONSTRAINT_PRIMARYKEY)
                #expect(error.sql == insert)
            }
            // Too few arguments: refused before anything runs.
            #expect(throws: DatabaseError.self) { try db.executeHot(insert) { $0.bind(Int64(2)) } }
            try db.executeHot(insert) {
                $0.bind(Int64(2))
                $0.bind("second")
            }
            #expect(try String.fetchAll(db, sql: "SELECT text FROM t ORDER BY id") == ["first", "second"])
        }
    }
}
