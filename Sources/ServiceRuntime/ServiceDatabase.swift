import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI

/// Opening the SQLite database a service keeps its state in.
public enum ServiceDatabase {
    /// Opens (creating if needed) the database at `path` in WAL mode with `synchronous=NORMAL`:
    /// a commit is durable against a process crash at once, and against power loss from the
    /// next checkpoint; there is no disk sync per commit.
    ///
    /// - Parameter path: a file path, or `nil` for a private in-memory database (tests).
    public static func open(path: String?) throws -> any DatabaseWriter {
        var configuration = GRDB.Configuration()
        configuration.busyMode = .timeout(5)
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
        }
        guard let path else {
            return try DatabaseQueue(configuration: configuration)
        }
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent()
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return try DatabasePool(path: path, configuration: configuration)
    }
}

/// Runs `body` against the store and turns a database failure into `storeUnavailable`, so a
/// caller never mistakes a failure for an answer.
///
/// The cause is logged to `logger`, not put in the reply: it can name tables and columns.
public func withStore<T: Sendable>(
    _ writer: any DatabaseWriter, write: Bool = true, logger: Logger? = nil,
    _ body: @escaping @Sendable (Database) throws -> T
) async throws -> T {
    do {
        return write ? try await writer.write(body) : try await writer.read(body)
    } catch let error as ServiceError {
        throw error
    } catch {
        logger?.error("store failure: \(error)")
        throw ServiceError(.storeUnavailable, "The store failed. Nothing was changed; try again.")
    }
}
