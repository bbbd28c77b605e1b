import Logging
import Messaging
import PostgresNIO

/// Versioned migrations of one service's schema, run at start.
///
/// Every migration runs once, in the order registered, and is recorded by name in the schema's
/// `migration` table. ``migrate(_:logger:)`` applies the missing ones in one transaction that
/// first takes a transaction-level advisory lock named after the schema: replicas that start at
/// once take turns, the first applies, the others find everything applied. A failed migration
/// rolls back with all the others of that run.
public struct PostgresMigrator: Sendable {
    public struct Migration: Sendable {
        public var name: String
        /// Statements run in order (postgres-nio sends one statement per query).
        public var statements: [String]
    }

    public let schema: String
    public private(set) var migrations: [Migration] = []

    /// - Throws: ``ServiceError`` `invalidRequest` when `schema` is not a plain identifier.
    public init(schema: String) throws(ServiceError) {
        self.schema = try PostgresLocation.checkedSchema(schema)
    }

    /// Adds a migration after those already registered; names must be unique.
    public mutating func register(_ name: String, _ statements: [String]) {
        precondition(!migrations.contains { $0.name == name }, "Two PostgreSQL migrations are named \(name)")
        migrations.append(Migration(name: name, statements: statements))
    }

    /// Applies the migrations that `client`'s database has not recorded yet.
    ///
    /// - Parameter began: given the server process of the migration's connection
    ///   (`pg_backend_pid()`, and when it started) once its transaction has begun, before it
    ///   waits for the lock (``PostgresStore/migrate(_:patience:)`` watches that process).
    /// - Returns: the names of those applied now, in order (empty when none was missing).
    @discardableResult
    public func migrate(
        _ client: PostgresClient, logger: Logger,
        began: @escaping @Sendable (_ backend: Int32, _ since: String) -> Void = { _, _ in }
    ) async throws -> [String] {
        let schema = self.schema
        let migrations = self.migrations
        return try await client.withTransaction(logger: logger) { connection -> [String] in
            for try await (backend, since) in try await connection.query(
                "SELECT pid, backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid()", logger: logger
            ).decode((Int32, String).self) {
                began(backend, since)
            }
            try await connection.query("SELECT pg_advisory_xact_lock(hashtextextended(\("onboarding.migrate." + schema), 0))", logger: logger)
            try await connection.query(PostgresQuery(unsafeSQL: "CREATE SCHEMA IF NOT EXISTS \(schema)"), logger: logger)
            try await connection.query(PostgresQuery(unsafeSQL: "SET LOCAL search_path TO \(schema)"), logger: logger)
            try await connection.query(
                "CREATE TABLE IF NOT EXISTS migration (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
                logger: logger)
            var applied: Set<String> = []
            for try await name in try await connection.query("SELECT name FROM migration", logger: logger).decode(String.self) {
                applied.insert(name)
            }
            var now: [String] = []
            for migration in migrations where !applied.contains(migration.name) {
                for statement in migration.statements {
                    try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                try await connection.query("INSERT INTO migration (name) VALUES (\(migration.name))", logger: logger)
                now.append(migration.name)
            }
            return now
        }
    }
}
