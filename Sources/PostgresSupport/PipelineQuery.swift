import Foundation
import NIOCore
import PostgresNIO

/// A statement for a ``PipelineTransaction``, written as postgres-nio's `PostgresQuery` is:
/// every interpolated value becomes a parameter (`$1`, `$2`, ...), sent in PostgreSQL's binary
/// form as postgres-nio's codecs encode it, never spliced into the SQL.
///
///     let query: PipelineQuery = "DELETE FROM session WHERE id = \(id) RETURNING uid"
///
/// `\(unescaped: text)` writes `text` into the SQL itself (column lists, never input).
public struct PipelineQuery: Sendable, ExpressibleByStringInterpolation {
    public var sql: String
    var parameters: [Parameter]

    /// One parameter: its type, format and bytes (`nil`: NULL).
    struct Parameter: Sendable, Hashable {
        var type: UInt32
        var format: Int32
        var bytes: [UInt8]?
    }

    public init(stringLiteral sql: String) {
        self.sql = sql
        self.parameters = []
    }

    public init(stringInterpolation: StringInterpolation) {
        self.sql = stringInterpolation.sql
        self.parameters = stringInterpolation.parameters
    }

    /// `sql` with `$1`... bound, in order, to what `bind` appends.
    public init(unsafeSQL sql: String, _ bind: (inout StringInterpolation) -> Void = { _ in }) {
        var interpolation = StringInterpolation(literalCapacity: 0, interpolationCount: 0)
        bind(&interpolation)
        self.sql = sql
        self.parameters = interpolation.parameters
    }

    public struct StringInterpolation: StringInterpolationProtocol, Sendable {
        var sql = ""
        var parameters: [Parameter] = []

        public init(literalCapacity: Int, interpolationCount: Int) {
            sql.reserveCapacity(literalCapacity + 4 * interpolationCount)
        }

        public mutating func appendLiteral(_ literal: String) {
            sql += literal
        }

        public mutating func appendInterpolation<Value: PostgresNonThrowingEncodable>(_ value: Value) {
            sql += "$\(bind(value))"
        }

        public mutating func appendInterpolation<Value: PostgresNonThrowingEncodable>(_ value: Value?) {
            guard let value else {
                parameters.append(Parameter(type: Value.psqlType.rawValue, format: Int32(Value.psqlFormat.rawValue), bytes: nil))
                sql += "$\(parameters.count)"
                return
            }
            appendInterpolation(value)
        }

        public mutating func appendInterpolation(unescaped text: String) {
            sql += text
        }

        /// Adds `value` as the next parameter, without writing its placeholder; returns its number.
        @discardableResult
        public mutating func bind<Value: PostgresNonThrowingEncodable>(_ value: Value) -> Int {
            var buffer = ByteBuffer()
            value.encode(into: &buffer, context: .default)
            parameters.append(
                Parameter(
                    type: Value.psqlType.rawValue, format: Int32(Value.psqlFormat.rawValue),
                    bytes: Array(buffer.readableBytesView)))
            return parameters.count
        }
    }
}

/// The rows a statement of a ``PipelineTransaction`` returned, copied out of libpq's result.
public struct PipelineRows: Sendable, Sequence {
    /// Each column's type.
    let types: [PostgresDataType]
    let rows: [[ByteBuffer?]]

    public var count: Int { rows.count }
    public var isEmpty: Bool { rows.isEmpty }
    public var first: PipelineRow? { rows.first.map { PipelineRow(types: types, cells: $0) } }

    public func makeIterator() -> some IteratorProtocol<PipelineRow> {
        rows.lazy.map { PipelineRow(types: types, cells: $0) }.makeIterator()
    }

    /// Each row decoded as `types` (its columns in order).
    public func decode<each Column: PostgresDecodable>(_ types: (repeat each Column).Type) throws -> [(repeat each Column)] {
        try map { try $0.decode((repeat each Column).self) }
    }
}

/// One row of ``PipelineRows``.
public struct PipelineRow: Sendable {
    let types: [PostgresDataType]
    let cells: [ByteBuffer?]

    /// The row's columns, in order, as `types` (an optional type takes NULL as `nil`).
    ///
    /// - Throws: postgres-nio's `PostgresDecodingError` when a column is not of its type, or
    ///   ``PipelineError`` when the row has fewer columns.
    public func decode<each Column: PostgresDecodable>(_ types: (repeat each Column).Type) throws -> (repeat each Column) {
        var index = 0
        func next<Value: PostgresDecodable>(_: Value.Type) throws -> Value {
            defer { index += 1 }
            guard index < cells.count else {
                throw PipelineError("a row has \(cells.count) columns; \(index + 1) were read")
            }
            var cell = cells[index]
            return try Value._decodeRaw(from: &cell, type: self.types[index], format: .binary, context: .default)
        }
        return (repeat try next((each Column).self))
    }
}

/// A failure of a ``PipelineConnection``: the connection, or a statement, with PostgreSQL's message.
public struct PipelineError: Error, CustomStringConvertible {
    public var description: String

    init(_ description: String) {
        self.description = description
    }
}
