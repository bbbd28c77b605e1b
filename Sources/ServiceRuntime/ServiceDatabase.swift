import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import Synchronization

/// Opening the SQLite database a service keeps its state in.
public enum ServiceDatabase {
    /// Opens (creating if needed) the database at `path` in WAL mode with `synchronous=NORMAL`:
    /// a commit is durable against a process crash at once, and against power loss from the
    /// next checkpoint; there is no disk sync per commit.
    ///
    /// Commits never checkpoint (`wal_autocheckpoint=0`): an automatic checkpoint would sync the
    /// database file inside whichever commit crossed the threshold, a stall of milliseconds on
    /// the request that made it. Run ``withCheckpoints(path:logger:_:)`` beside the service so a
    /// connection of its own does that work in the background.
    ///
    /// Only the owner can read the files: the database is created 0600 before SQLite opens it
    /// (SQLite gives its `-wal` and `-shm` files the database's mode), and an existing database
    /// and its `-wal`/`-shm` are tightened to 0600 first.
    ///
    /// - Parameter path: a file path, or `nil` for a private in-memory database (tests).
    public static func open(path: String?) throws -> any DatabaseWriter {
        var configuration = GRDB.Configuration()
        configuration.busyMode = .timeout(5)
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            try db.execute(sql: "PRAGMA wal_autocheckpoint = 0")
            try db.execute(sql: "PRAGMA journal_size_limit = \(64 * 1024 * 1024)")
            if !db.configuration.readonly {
                // The writer's page cache: 64 MiB instead of SQLite's 2 MiB, so the pages a
                // batch of inserts touches stay in memory instead of being read back from the
                // file system for each transaction (not a durability setting).
                try db.execute(sql: "PRAGMA cache_size = -65536")
            }
        }
        guard let path else {
            return try DatabaseQueue(configuration: configuration)
        }
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent()
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try restrictToOwner(databaseAt: path)
        return try DatabasePool(path: path, configuration: configuration)
    }

    /// Closes a service's database when the service stops, so that its files are released
    /// then and there rather than whenever the last reference to it goes (a request handler
    /// left registered on a bus, say). A database closed late can hold its file when the
    /// service is started again in the same process: its last connection checkpoints and
    /// removes the log under an exclusive lock while the new one opens it.
    ///
    /// Call it once nothing will use the database any more: most accesses after it fail
    /// (`SQLITE_MISUSE`), and some of GRDB's (`totalChangesCount`) are not checked at all. A
    /// failure to close is logged: SQLite then closes the database when its last reference is
    /// released.
    public static func close(_ database: any DatabaseWriter, logger: Logger) async {
        do {
            // Closing waits for the writer and the readers and checkpoints the log: off the
            // cooperative pool, as opening is.
            try await offPool { try database.close() }
        } catch {
            logger.warning("closing the database at \(database.path) failed: \(error); it closes when nothing uses it any more")
        }
    }

    /// Runs `body`, then closes `database` (``close(_:logger:)``) however `body` ended.
    public static func closing<T>(
        _ database: any DatabaseWriter, logger: Logger, _ body: () async throws -> T
    ) async throws -> T {
        try await withCleanup(body) { await close(database, logger: logger) }
    }

    /// Runs `work` (opening and migrating a database: file I/O and fsyncs that can take a while
    /// on a busy disk) on a thread of its own and waits for it without blocking a thread of
    /// Swift's cooperative pool, which the rest of the process needs meanwhile.
    public static func offPool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            let thread = Thread { continuation.resume(with: Result { try work() }) }
            thread.name = "database"
            thread.start()
        }
    }

    /// The mode of database files: read and written by their owner only.
    public static let fileMode: mode_t = 0o600

    /// Creates the database file 0600 when it does not exist, and sets the database and its
    /// `-wal`, `-shm` and `-journal` files that exist to 0600.
    static func restrictToOwner(databaseAt path: String) throws {
        let descriptor = Foundation.open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, fileMode)
        if descriptor >= 0 {
            Foundation.close(descriptor)
        } else if errno != EEXIST {
            throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
        }
        for file in [path, path + "-wal", path + "-shm", path + "-journal"] where chmod(file, fileMode) != 0 {
            if errno == ENOENT { continue }
            throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
        }
    }
}

extension Database {
    /// Executes `sql` with a statement prepared once per connection and reused: for the
    /// statements a service runs on every request or event.
    public func executeCached(_ sql: String, _ arguments: StatementArguments = StatementArguments()) throws {
        try cachedStatement(sql: sql).execute(arguments: arguments)
    }
}

extension DatabaseWriter {
    /// Runs `body` in one `IMMEDIATE` write transaction, like `write(_:)`, with its `BEGIN` and
    /// `COMMIT` statements prepared once per connection instead of once per transaction (GRDB
    /// compiles them each time: on the hot path that cost as much as the commit's own work in
    /// SQLite's B-trees). For the transactions a service runs on every batch.
    ///
    /// When `body` throws, or the commit fails, the transaction is rolled back and the error
    /// rethrown; transaction observers (`afterNextTransaction`) see the commit or the rollback
    /// as they do with `write(_:)`, and also see a rollback SQLite made by itself.
    public func writeTransaction<T>(_ body: (Database) throws -> T) throws -> T {
        try writeWithoutTransaction { db in try db.serviceTransaction(body) }
    }

    /// ``writeTransaction(_:)`` from a task, run to its end even when the task is cancelled.
    ///
    /// GRDB interrupts the statement of a cancelled task's access, and SQLite then rolls the
    /// whole transaction back in a way that leaves its observers untold and the database
    /// refusing statements until the access ends: the outbox would publish the lost events with
    /// the next commit. A write a task has started is short; it commits or rolls back whole.
    public func writeTransactionToCompletion<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await Task { try await writeWithoutTransaction { db in try db.serviceTransaction(body) } }.value
    }
}

extension Database {
    /// The transaction of ``GRDB/DatabaseWriter/writeTransaction(_:)``, on this connection.
    fileprivate func serviceTransaction<T>(_ body: (Database) throws -> T) throws -> T {
        try cachedStatement(sql: "BEGIN IMMEDIATE TRANSACTION").execute()
        do {
            let result = try body(self)
            try cachedStatement(sql: "COMMIT TRANSACTION").execute()
            return result
        } catch {
            if isInsideTransaction {
                try? rollback()
            } else {
                // SQLite rolled the transaction back by itself (an interrupt, a full disk, an
                // I/O error), and GRDB does not tell the transaction's observers then: an
                // empty transaction rolled back does, so that the outbox, for one, forgets
                // the events it recorded instead of publishing them with the next commit.
                try? execute(sql: "BEGIN DEFERRED TRANSACTION")
                try? rollback()
            }
            throw error
        }
    }
}

/// Runs `body`, then `cleanup`, however `body` ended, and returns or rethrows what `body` did:
/// a `defer` that can wait.
public func withCleanup<T>(_ body: () async throws -> T, cleanup: () async -> Void) async throws -> T {
    let outcome: Result<T, any Error>
    do {
        outcome = .success(try await body())
    } catch {
        outcome = .failure(error)
    }
    await cleanup()
    return try outcome.get()
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
        return write ? try await writer.writeTransactionToCompletion(body) : try await writer.read(body)
    } catch let error as ServiceError {
        throw error
    } catch {
        logger?.error("store failure: \(error)")
        throw ServiceError(.storeUnavailable, "The store failed. Nothing was changed; try again.")
    }
}

/// Runs `body` while a checkpointer copies the database's write-ahead log into the file every
/// `interval`, on a connection and a thread of its own, and once more when `body` returns.
///
/// Passive checkpoints never wait for readers or writers, so requests do not stall on them.
/// Under steady writes, though, they never quite catch up, and SQLite only starts the log over
/// (rewriting it in place rather than growing it) once one has. So when the log passes
/// `restartAfter` bytes and `writer` (the service's own connection) is given, the few frames
/// written since the last checkpoint are copied on the writer's connection, between two of its
/// transactions: the next transaction then starts the log over. That holds the writer back only
/// for those few frames. Without `writer`, a log past `walLimit` bytes is truncated instead,
/// which holds writers back for as long as it takes; with it, never (a service's writer runs
/// on its bus's thread, which must not stop for seconds).
/// `path` `nil` (an in-memory database) runs `body` alone.
///
/// The checkpointer's thread runs at the lowest priority (nice 19): on a machine with few cores
/// its bursts of copying wait for the threads that answer requests instead of delaying them.
/// What it does on the writer's connection runs on the writer's queue, at the writer's priority.
///
/// The defaults were chosen with `./compose/onboarding bench sign-in --rate 1000` (p99): a
/// checkpoint's disk sync holds the writer's next write to the log for a while (the file
/// system's journal), so small checkpoints often (every 50 ms) stall it less than large ones
/// rarely (200 ms: p99 2.3–2.7 ms; 50 ms: 1.5–1.9 ms); a log started over every 64 MiB beat both
/// 4 MiB and 16 MiB (more tail checkpoints on the writer) and 256 MiB (a log that keeps growing).
/// The lower priority took p99 from 1.6–2.0 ms to 1.1–1.5 ms on most runs.
public func withCheckpoints<T: Sendable>(
    path: String?, writer: (any DatabaseWriter)? = nil, every interval: Duration = .milliseconds(50),
    restartAfter: Int = 64 * 1024 * 1024, walLimit: Int = 64 * 1024 * 1024, logger: Logger,
    _ body: () async throws -> T
) async throws -> T {
    guard let path else { return try await body() }
    var configuration = GRDB.Configuration()
    configuration.busyMode = .timeout(5)
    @Sendable func checkpoint(_ connection: DatabaseQueue, _ writer: (any DatabaseWriter)?) {
        var mode = "passive"
        do {
            // How much the log holds now (its file may be larger: SQLite reuses it in place).
            let size = try connection.writeWithoutTransaction { db in
                let frames = try db.checkpoint(.passive).walFrameCount
                let pageSize = try Int.fetchOne(db, sql: "PRAGMA page_size") ?? 4096
                return max(0, frames) * (pageSize + 24)
            }
            if let writer, size > restartAfter {
                // The tail, between two of the writer's transactions: the log starts over next.
                // On the writer's own queue, at its priority: run from this low-priority thread,
                // it would hold the writer back for as long as this thread waits for a core.
                mode = "passive, on the writer's connection"
                let finished = DispatchSemaphore(value: 0)
                let failure = Mutex<(any Error)?>(nil)
                writer.asyncWriteWithoutTransaction { db in
                    do { _ = try db.checkpoint(.passive) } catch { failure.withLock { $0 = error } }
                    finished.signal()
                }
                finished.wait()
                if let error = failure.withLock({ $0 }) { throw error }
            }
            if writer == nil, size > walLimit {
                mode = "truncate"
                logger.warning(
                    "the write-ahead log of \(path) is \(size / 1_048_576) MiB; truncating it holds writers back until it is done")
                _ = try connection.writeWithoutTransaction { try $0.checkpoint(.truncate) }
            }
            StoreFigures.checkpoint(succeeded: size)
        } catch {
            StoreFigures.checkpoint(succeeded: nil)
            logger.warning("checkpoint (\(mode)) of \(path) failed: \(error); the write-ahead log grows until a later one succeeds")
        }
    }
    let (seconds, attoseconds) = interval.components
    let pause = DispatchTimeInterval.nanoseconds(Int(clamping: min(seconds, 86_400_000) * 1_000_000_000 + attoseconds / 1_000_000_000))
    let stop = DispatchSemaphore(value: 0)
    let connection = try DatabaseQueue(path: path, configuration: configuration)
    // Waited for with a continuation, which cancellation does not end: the service is stopping
    // because its task was cancelled, and must not go on before the checkpointer's connection
    // is closed (an `AsyncStream` would end at once). A connection still open when the service
    // is started again in the same process holds the file, and keeps the service's own closed
    // connections' descriptors open with it (SQLite keeps them while another connection of the
    // process holds a lock on the file).
    async let stopped: Void = withCheckedContinuation { (finished: CheckedContinuation<Void, Never>) in
        let thread = Thread {
            // Linux: the nice value of the calling thread only.
            _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, 19)
            while stop.wait(timeout: .now() + pause) == .timedOut {
                checkpoint(connection, writer)
            }
            // The last one, when `body` has returned; then the connection closes here and now.
            checkpoint(connection, writer)
            do {
                try connection.close()
            } catch {
                logger.warning("closing the checkpointer's connection to \(path) failed: \(error)")
            }
            finished.resume()
        }
        thread.name = "checkpointer"
        thread.start()
    }
    let result: T
    do {
        result = try await body()
    } catch {
        stop.signal()
        await stopped
        throw error
    }
    stop.signal()
    await stopped
    return result
}

/// A service's SQLite store for as long as it runs: opens the database at `path` (`nil`: in
/// memory) with `open` (which also migrates it) off the cooperative pool, runs `body` with it while
/// old events are pruned to `retention` and the write-ahead log is checkpointed in the
/// background, and closes it once `body` has returned or thrown.
///
/// - Throws: what `open` or `body` throw.
public func withSQLiteStore<T: Sendable>(
    path: String?, retention: Outbox.Retention, logger: Logger,
    open: @escaping @Sendable (String?) throws -> any DatabaseWriter,
    _ body: (any DatabaseWriter) async throws -> T
) async throws -> T {
    let database = try await ServiceDatabase.offPool { try open(path) }
    return try await ServiceDatabase.closing(database, logger: logger) {
        try await withEventRetention(retention, database: database, logger: logger) {
            try await withCheckpoints(path: path, writer: database, logger: logger) { try await body(database) }
        }
    }
}
