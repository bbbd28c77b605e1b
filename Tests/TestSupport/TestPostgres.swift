import Foundation
import Logging
import PostgresNIO
import PostgresSupport

/// The PostgreSQL database tests use: `./compose/onboarding test` starts a private cluster and
/// sets `ONBOARDING_TEST_POSTGRES_URL`. Without it, tests run on SQLite alone.
public enum TestPostgres {
    public static let url = ProcessInfo.processInfo.environment["ONBOARDING_TEST_POSTGRES_URL"]

    static let logger: Logger = {
        var logger = Logger(label: "test.postgres")
        logger.logLevel = .critical
        return logger
    }()

    /// At most two tests use the database at once: each opens a pool of connections (a server
    /// process each), and dozens starting together on two cores starve the timing-sensitive
    /// tests beside them.
    static let turns = Turns(2)

    /// Runs `body` with a location in a fresh schema of the test database, dropped afterwards.
    public static func withSchema<T: Sendable>(_ body: (PostgresLocation) async throws -> T) async throws -> T {
        try await withSchemas(1) { locations in try await body(locations[0]) }
    }

    /// Runs `body` with `count` locations, each in a fresh schema of the test database (one per
    /// service of a whole system), dropped afterwards.
    public static func withSchemas<T: Sendable>(_ count: Int, _ body: ([PostgresLocation]) async throws -> T) async throws -> T {
        guard let url else { throw TestPostgresMissing() }
        await turns.acquire()
        defer { Task { await turns.release() } }
        // A test whose time ran out while it waited for its turn starts nothing.
        try Task.checkCancellation()
        let schemas = (0..<count).map { _ in "t_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(24) }
        let locations = try schemas.map { try PostgresLocation(url: url, schema: String($0)) }
        let result: Result<T, any Error>
        do { result = .success(try await body(locations)) } catch { result = .failure(error) }
        let client = PostgresClient(
            configuration: locations[0].clientConfiguration(applicationName: "onboarding-tests"), backgroundLogger: logger)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            for schema in schemas {
                try await client.query(PostgresQuery(unsafeSQL: "DROP SCHEMA IF EXISTS \(schema) CASCADE"), logger: logger)
            }
        }
        return try result.get()
    }
}

/// A counting semaphore for tasks: ``acquire()`` waits while `limit` holders have not released.
actor Turns {
    private var free: Int
    private var waiting: [CheckedContinuation<Void, Never>] = []

    init(_ limit: Int) { free = limit }

    func acquire() async {
        if free > 0 {
            free -= 1
            return
        }
        await withCheckedContinuation { waiting.append($0) }
    }

    func release() {
        if waiting.isEmpty { free += 1 } else { waiting.removeFirst().resume() }
    }
}

public struct TestPostgresMissing: Error, CustomStringConvertible {
    public var description: String { "ONBOARDING_TEST_POSTGRES_URL is not set: ./compose/onboarding test sets it" }
}

/// Which store a test runs on: SQLite always, PostgreSQL when the test database is set.
public enum StoreKind: String, Sendable, CaseIterable, CustomStringConvertible {
    case sqlite, postgres

    public static var available: [StoreKind] { TestPostgres.url == nil ? [.sqlite] : [.sqlite, .postgres] }

    public var description: String { rawValue }
}
