import Foundation
import GRDB
import GRDBSQLite

/// The statements a service runs for every request or event, executed through SQLite's C API.
///
/// The statement is prepared once per connection (GRDB's statement cache), as with
/// ``GRDB/Database/executeCached(_:_:)``; binding and stepping then skip GRDB's per-execution
/// work: an array of existential arguments, and the observation of every statement (on the hot
/// path that cost more than SQLite's own insert). Use it inside a write transaction run by GRDB
/// (``GRDB/DatabaseWriter/writeTransaction(_:)``): GRDB still sees the transaction begin and end,
/// so `afterNextTransaction` works, but it does not see these statements' changes, so nothing may
/// observe the tables they write (no `ValueObservation` or region observation of them).
///
/// ```swift
/// try db.executeHot("INSERT INTO cursor (publisher, sequence) VALUES (?, ?)") { row in
///     row.bind(publisher)
///     row.bind(Int64(sequence))
/// }
/// ```
extension Database {
    /// Executes `sql` with the arguments `bind` gives, in order.
    ///
    /// - Throws: `DatabaseError` (with SQLite's extended result code) when a step fails.
    public func executeHot(_ sql: String, _ bind: (inout HotArguments) -> Void) throws {
        let statement = try cachedStatement(sql: sql)
        try HotArguments.run(statement, sql: sql, bind) { handle in
            while true {
                let code = sqlite3_step(handle)
                if code == SQLITE_DONE { return }
                if code != SQLITE_ROW { throw HotArguments.error(code, handle, sql) }
            }
        }
    }

    /// Runs the query `sql` with the arguments `bind` gives and reads its first row with `read`,
    /// or returns `nil` when there is none.
    public func fetchOneHot<T>(
        _ sql: String, _ bind: (inout HotArguments) -> Void, read: (borrowing HotRow) throws -> T
    ) throws -> T? {
        let statement = try cachedStatement(sql: sql)
        return try HotArguments.run(statement, sql: sql, bind) { handle in
            let code = sqlite3_step(handle)
            if code == SQLITE_DONE { return nil }
            if code != SQLITE_ROW { throw HotArguments.error(code, handle, sql) }
            return try read(HotRow(handle: handle))
        }
    }
}

/// The arguments of a ``GRDB/Database/executeHot(_:_:)`` statement, bound in order from the
/// first `?`. Strings and blobs are copied by SQLite.
public struct HotArguments: ~Copyable {
    fileprivate let handle: SQLiteStatement
    fileprivate var index: Int32 = 1

    /// SQLite copies the bytes before the call returns (`SQLITE_TRANSIENT`).
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    /// Binds `value` as GRDB does: as a C string, so text up to a NUL character (none, in what
    /// the services accept). Binding it whole instead once stored a text that GRDB's own
    /// statements, which stop at the NUL, then failed to find.
    public mutating func bind(_ value: String) {
        value.withCString { text in
            _ = sqlite3_bind_text(handle, index, text, -1, Self.transient)
        }
        index += 1
    }

    public mutating func bind(_ value: String?) {
        if let value { bind(value) } else { bindNull() }
    }

    public mutating func bind(_ value: Int64) {
        _ = sqlite3_bind_int64(handle, index, value)
        index += 1
    }

    public mutating func bind(_ value: Int) { bind(Int64(value)) }

    public mutating func bind(_ value: Bool) { bind(Int64(value ? 1 : 0)) }

    public mutating func bind(_ value: Data) {
        value.withUnsafeBytes { bytes in
            // A zero-length blob, not NULL, when empty.
            _ = sqlite3_bind_blob(handle, index, bytes.baseAddress ?? UnsafeRawPointer(bitPattern: 1)!, Int32(bytes.count), Self.transient)
        }
        index += 1
    }

    public mutating func bindNull() {
        _ = sqlite3_bind_null(handle, index)
        index += 1
    }

    /// Binds, checks the count, runs `body`, and leaves the statement reset with no bindings,
    /// whatever happens.
    fileprivate static func run<T>(
        _ statement: Statement, sql: String, _ bind: (inout HotArguments) -> Void, _ body: (SQLiteStatement) throws -> T
    ) throws -> T {
        let handle = statement.sqliteStatement
        defer {
            sqlite3_reset(handle)
            sqlite3_clear_bindings(handle)
        }
        var arguments = HotArguments(handle: handle)
        bind(&arguments)
        let expected = sqlite3_bind_parameter_count(handle)
        guard arguments.index - 1 == expected else {
            throw DatabaseError(
                resultCode: .SQLITE_MISUSE, message: "wrong number of arguments: \(arguments.index - 1) for \(expected)", sql: sql)
        }
        return try body(handle)
    }

    fileprivate static func error(_ code: Int32, _ handle: SQLiteStatement, _ sql: String) -> DatabaseError {
        let connection = sqlite3_db_handle(handle)
        return DatabaseError(
            resultCode: ResultCode(rawValue: sqlite3_extended_errcode(connection)),
            message: sqlite3_errmsg(connection).map { String(cString: $0) }, sql: sql)
    }
}

/// The current row of a ``GRDB/Database/fetchOneHot(_:_:read:)`` query, read by column index
/// (from 0, in the order of the `SELECT`).
public struct HotRow: ~Copyable {
    fileprivate let handle: SQLiteStatement

    public func isNull(_ column: Int32) -> Bool { sqlite3_column_type(handle, column) == SQLITE_NULL }

    public func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(handle, column) }

    public func bool(_ column: Int32) -> Bool { int64(column) != 0 }

    /// The text of `column`; "" for NULL.
    public func string(_ column: Int32) -> String {
        guard let text = sqlite3_column_text(handle, column) else { return "" }
        let count = Int(sqlite3_column_bytes(handle, column))
        return String(decoding: UnsafeBufferPointer(start: text, count: count), as: UTF8.self)
    }

    /// The text of `column`, or `nil` for NULL.
    public func optionalString(_ column: Int32) -> String? { isNull(column) ? nil : string(column) }
}
