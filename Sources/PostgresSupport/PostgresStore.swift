import Logging
import Messaging
import NIOCore
import OnboardingAPI
import PostgresNIO
import Tracing
import ServiceRuntime
import Synchronization

/// A service's PostgreSQL database: a connection pool, the migrations run at start, and
/// transactions whose failures reach callers as `storeUnavailable` (nothing was changed) or,
/// past the time limit, `timeout` (it may have been), never as a wrong answer and never as a hang.
///
/// Run it (``run()``) for as long as the service uses it, in the service's `ServiceGroup` or a
/// task of its own: the pool opens connections only while it runs.
///
/// Thread safety: any task may use it.
public final class PostgresStore: Sendable {
    public let location: PostgresLocation
    public let client: PostgresClient
    /// How long one transaction or read may take: past it, the caller gets `timeout` (the change
    /// may or may not have been made)
    /// (a paused or unreachable server must not hold requests forever; the server's own
    /// `statement_timeout` cannot help when it does not answer at all).
    public let timeout: Duration
    let logger: Logger
    /// Where every connection of the pool does its I/O and where transactions run: on one
    /// thread, so a statement's round trip wakes no other thread.
    let executor: EventLoopTaskExecutor
    /// The connection of ``pipelinedEventTransaction(_:afterCommit:)``.
    let pipeline: PipelineConnection

    public init(
        location: PostgresLocation, applicationName: String, timeout: Duration = .seconds(5), maxConnections: Int = 20,
        logger: Logger
    ) {
        var configuration = location.clientConfiguration(applicationName: applicationName)
        configuration.options.maximumConnections = maxConnections
        configuration.options.connectTimeout = timeout
        // The pool starts two timer tasks for every connection it takes back while it holds
        // more than its minimum or pings idle connections, and stops them at the next lease: a
        // few tasks and a dispatch timer per transaction. Two connections (what a store's one
        // committing task and a read mostly need) stay open without either; a dead one is
        // found by the next statement on it.
        configuration.options.minimumConnections = min(2, maxConnections)
        configuration.options.keepAliveBehavior = nil
        self.location = location
        self.executor = EventLoopTaskExecutor(MultiThreadedEventLoopGroup.singleton.next())
        self.client = PostgresClient(configuration: configuration, eventLoopGroup: executor.loop, backgroundLogger: logger)
        self.pipeline = PipelineConnection(
            location: location, applicationName: applicationName, timeout: timeout, logger: logger)
        self.timeout = timeout
        self.logger = logger
    }

    /// Keeps the pool open until the task is cancelled.
    ///
    /// Not when the service's graceful shutdown begins: `PostgresClient.run()` closes the pool
    /// then, while the service still drains what it accepted (a detached task does not inherit
    /// the service group's shutdown signal; cancellation is passed on).
    public func run() async {
        let pool = Task.detached { [client, started] in
            // Said just before the pool starts, in the same synchronous stretch: whoever waits
            // (``migrate(_:patience:)``) resumes on another thread after it has.
            started.open()
            await client.run()
        }
        await withTaskCancellationHandler {
            await pool.value
        } onCancel: {
            pool.cancel()
        }
        closed.store(true, ordering: .releasing)
        pipeline.close()
    }

    /// Whether ``run()`` has returned: the pool is shut and nothing will be answered again.
    public var isClosed: Bool { closed.load(ordering: .acquiring) }
    private let closed = Atomic<Bool>(false)
    /// Opened when ``run()`` starts the pool (leasing a connection before warns).
    private let started = Latch()

    /// Applies `migrator`'s missing migrations (once ``run()`` has started the pool), waiting up
    /// to `patience` for the server to answer (a service and its database often start together,
    /// and a database may restart while the service starts).
    ///
    /// A migration may take as long as it needs while its connection's server process is alive
    /// (``watchedMigration(_:backend:)``). When the server cannot be reached, or the migration's
    /// connection is lost, the migration is tried again (its transaction was rolled back) until
    /// `patience` has passed since the server last answered. A migration that fails at the server
    /// (bad SQL, a missing privilege) fails at once.
    ///
    /// - Throws: ``ServiceError`` `storeUnavailable` naming the database.
    @discardableResult
    public func migrate(_ migrator: PostgresMigrator, patience: Duration = .seconds(30)) async throws -> [String] {
        await started.wait()
        let clock = ContinuousClock()
        var deadline = clock.now + patience
        var delay = Duration.milliseconds(100)
        while true {
            let backend = ServerProcess()
            do {
                let applied = try await watchedMigration(migrator, backend: backend)
                if !applied.isEmpty { logger.notice("PostgreSQL migrations applied: \(applied.joined(separator: ", "))") }
                return applied
            } catch let error where Self.isConnectionFailure(error) {
                // A try that reached the server (a long migration, say) starts the patience again.
                if backend.known != nil { deadline = clock.now + patience }
                guard clock.now + delay < deadline, !Task.isCancelled else {
                    throw ServiceError(
                        .storeUnavailable,
                        "Cannot reach the database at \(location): \(Self.describe(error)). Is PostgreSQL running there?")
                }
                logger.warning("PostgreSQL at \(location) is not ready (\(Self.describe(error))); trying again in \(delay)")
                try await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(2))
            } catch is CancellationError {
                throw CancellationError()
            } catch {
                throw ServiceError(
                    .storeUnavailable,
                    "Cannot migrate the database at \(location): \(Self.describe(error)). May this user create the schema?")
            }
        }
    }

    /// `migrator`'s run, given up on once nothing can come of it: when it has not begun within
    /// ``timeout`` (no connection), or when a look every ``timeout`` finds its connection's
    /// server process gone, or gets no answer three times in a row. postgres-nio 1.33 can leave
    /// a query unanswered forever on a connection the server ended, and a migration left waiting
    /// would hold the service's start (and its stop) for good.
    ///
    /// Given up, the migration's task is cancelled and left behind, with its connection; if it
    /// commits after all, the next try finds its migrations applied.
    ///
    /// - Parameter backend: filled in with the migration's server process once it has begun.
    /// - Throws: what the migration threw; ``ServiceError`` `timeout` when it was given up on.
    private func watchedMigration(_ migrator: PostgresMigrator, backend: ServerProcess) async throws -> [String] {
        let race = FirstResult<[String]>()
        let worker = Task(executorPreference: executor) { [client, logger] in
            do {
                race.finish(.success(try await migrator.migrate(client, logger: logger) { backend.known = ($0, $1) }))
            } catch {
                race.finish(.failure(error))
            }
        }
        let limit = timeout
        let watchdog = Task {
            var unanswered = 0
            while true {
                do { try await Task.sleep(for: limit) } catch { return }
                let problem: String
                if let process = backend.known {
                    switch try? await isRunning(process) {
                    case true?: unanswered = 0; continue
                    case false?: problem = "the migration's connection (server process \(process.pid)) was lost"
                    case nil:
                        unanswered += 1
                        guard unanswered == 3 else { continue }
                        problem = "the server did not say within \(limit), three times, whether the migration still runs"
                    }
                } else {
                    problem = "no connection within \(limit)"
                }
                race.finish(.failure(ServiceError(.timeout, problem)))
                worker.cancel()
                return
            }
        }
        defer { watchdog.cancel() }
        return try await withTaskCancellationHandler {
            try await race.value()
        } onCancel: {
            race.finish(.failure(CancellationError()))
            worker.cancel()
        }
    }

    /// A migration's server process, once known: its number and when it started (numbers are
    /// used again after a restart).
    final class ServerProcess: Sendable {
        private let process = Mutex<(pid: Int32, since: String)?>(nil)
        var known: (pid: Int32, since: String)? {
            get { process.withLock { $0 } }
            set { process.withLock { $0 = newValue } }
        }
    }

    /// Whether the server still runs `process` (a connection's backend).
    private func isRunning(_ process: (pid: Int32, since: String)) async throws -> Bool {
        try await read { connection in
            let rows = try await connection.query(
                "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = \(process.pid) AND backend_start::text = \(process.since))",
                logger: self.logger)
            for try await running in rows.decode(Bool.self) { return running }
            return false
        }
    }

    /// Whether `error` says the server could not be reached or the connection was lost (worth
    /// another try) rather than that the server refused what was sent.
    static func isConnectionFailure(_ error: any Error) -> Bool {
        let transaction = error as? PostgresTransactionError
        // BEGIN and COMMIT failing are connection failures too (a migration applied twice is not:
        // the next try finds it recorded).
        let cause = transaction?.beginError ?? transaction?.closureError ?? transaction?.commitError ?? error
        if let error = cause as? ServiceError { return error.code == .timeout }
        guard let error = cause as? PSQLError else { return false }
        guard error.code == .server else { return true }
        // Connection exceptions (08…), and a server shutting down or starting (57P01–57P03).
        let state = error.serverInfo?[.sqlState] ?? ""
        return state.hasPrefix("08") || ["57P01", "57P02", "57P03"].contains(state)
    }

    /// Runs `body` in one transaction: committed when it returns, rolled back when it throws.
    ///
    /// - Throws: what `body` throws when it is a ``ServiceError``; `storeUnavailable` for any
    ///   database failure, `timeout` when the transaction takes longer than ``timeout`` (logged with its
    ///   cause, which the reply leaves out: it can name tables and columns).
    public func transaction<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await bounded {
            try await self.client.withTransaction(logger: self.logger) { connection in
                try await Self.discardingOnFailure(connection, body)
            }
        }
    }

    /// Runs `body` in one transaction that records events in `PostgresOutbox`: its first
    /// statement takes the outbox's head lock (``PostgresOutbox/lockHead``), and `body` gets the
    /// last sequence number assigned. When it has committed, `afterCommit` gets `body`'s result
    /// at once, even when the caller has stopped waiting (past ``timeout``): a late commit's
    /// events are still published.
    ///
    /// - Throws: as ``transaction(_:)``; and `timeout` when the connection fails during the
    ///   commit, whose outcome is then unknown.
    public func eventTransaction<T: Sendable>(
        _ body: @escaping @Sendable (PostgresConnection, _ lastSequence: Int64) async throws -> T,
        afterCommit: @escaping @Sendable (T) -> Void
    ) async throws -> T {
        let logger = self.logger
        return try await bounded {
            try await self.client.withConnection { connection in
                let result: T
                do {
                    try await connection.query("BEGIN", logger: logger)
                    let last = try await PostgresOutbox.lockedHead(on: connection, logger: logger)
                    result = try await body(connection, last)
                } catch {
                    _ = try? await connection.query("ROLLBACK", logger: logger)
                    Self.discard(connection, after: error)
                    throw error
                }
                do {
                    try await connection.query("COMMIT", logger: logger)
                } catch {
                    logger.error("the connection failed while committing: \(String(reflecting: error))")
                    throw ServiceError(
                        .timeout,
                        "The store's connection failed while committing: the change may or may not have been made. Try again "
                            + "(a request with an idempotency key is safe to repeat).")
                }
                afterCommit(result)
                return result
            }
        }
    }

    /// ``eventTransaction(_:afterCommit:)`` with its statements pipelined, for the transactions
    /// a service runs most: `BEGIN`, the head's lock and the statements up to the first read go to
    /// the server together, and the rest with `COMMIT` (see ``PipelineConnection``). `body` runs
    /// synchronously on the pipeline's own thread, and so does `afterCommit`.
    ///
    /// - Throws: as ``eventTransaction(_:afterCommit:)``.
    public func pipelinedEventTransaction<T: Sendable>(
        _ body: @escaping @Sendable (PipelineTransaction) throws -> T, afterCommit: @escaping @Sendable (T) -> Void
    ) async throws -> T {
        let race = FirstResult<T>()
        // The caller's trace goes with the body to the pipeline's thread (events recorded there
        // carry it, as they would in a task).
        let context = ServiceContext.current
        pipeline.run(
            deadline: .now + timeout, { transaction in try ServiceContext.withValue(context) { try body(transaction) } },
            afterCommit: afterCommit
        ) { race.finish($0) }
        let limit = timeout
        let timer = executor.loop.scheduleTask(in: TimeAmount(limit)) { race.finish(.failure(Self.timedOut(limit))) }
        defer { timer.cancel() }
        do {
            return try await withTaskCancellationHandler {
                try await race.value()
            } onCancel: {
                race.finish(.failure(CancellationError()))
            }
        } catch {
            throw storeFailure(error)
        }
    }

    /// Runs `body` on a connection outside a transaction (each statement sees its own snapshot),
    /// with the failures of ``transaction(_:)``.
    public func read<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await bounded {
            try await self.client.withConnection { connection in try await Self.discardingOnFailure(connection, body) }
        }
    }

    /// Closes `connection` when `error` came from the database, so that the pool opens a fresh
    /// one for the next lease. postgres-nio keeps what went wrong with a prepared statement on
    /// its connection for good: a statement whose preparation failed (a lock or statement
    /// timeout, a cancelled backend) fails again at once on every later run there, and one whose
    /// result columns a migration changed fails at the server every time ("cached plan must not
    /// change result type"). A new connection prepares it again. What the store's own code
    /// throws on purpose (a ``ServiceError``) or a cancellation leaves the connection open.
    static func discard(_ connection: PostgresConnection, after error: any Error) {
        guard error is PSQLError else { return }
        let _: EventLoopFuture<Void> = connection.close()
    }

    /// `body(connection)`, with ``discard(_:after:)`` when it throws.
    private static func discardingOnFailure<T>(
        _ connection: PostgresConnection, _ body: (PostgresConnection) async throws -> T
    ) async throws -> T {
        do {
            return try await body(connection)
        } catch {
            discard(connection, after: error)
            throw error
        }
    }

    /// `work`'s result; what it threw on purpose (a ``ServiceError``, cancellation), even from
    /// inside a transaction; `storeUnavailable` for a database failure (logged with its cause);
    /// `timeout` when ``timeout`` passes without a result.
    private func bounded<T: Sendable>(_ work: @escaping @Sendable () async throws -> T) async throws -> T {
        do {
            return try await withinTimeout(timeout, work)
        } catch {
            throw storeFailure(error)
        }
    }

    /// What the caller gets for `error`: a ``ServiceError`` or a cancellation as it is, even from
    /// inside a transaction; `storeUnavailable` for a database failure (logged with its cause).
    private func storeFailure(_ error: any Error) -> any Error {
        // postgres-nio wraps what a transaction's body threw in PostgresTransactionError.
        let cause = (error as? PostgresTransactionError)?.closureError ?? error
        if let error = cause as? ServiceError { return error }
        if cause is CancellationError { return CancellationError() }
        logger.error("store failure: \(String(reflecting: error))")
        return ServiceError(.storeUnavailable, "The store failed. Nothing was changed; try again.")
    }

    private static func timedOut(_ limit: Duration) -> ServiceError {
        ServiceError(
            .timeout,
            "The store did not answer within \(limit): the change may or may not have been made. Try again "
                + "(a request with an idempotency key is safe to repeat).")
    }

    /// `work`'s result or error, or `timeout` once `limit` has passed without one: the caller
    /// does not wait for `work` to notice it was cancelled (a query on a connection the server
    /// ended may never answer).
    ///
    /// `work` runs on the pool's event loop (``executor``).
    ///
    /// On timeout, or when the caller is cancelled, `work` is cancelled: a lease still waiting
    /// for a connection is withdrawn. A statement already sent cannot be taken back
    /// (postgres-nio), so a transaction that commits late has still committed: hence "may have
    /// been made" in the message.
    public func withinTimeout<T: Sendable>(
        _ limit: Duration, _ work: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        let race = FirstResult<T>()
        let worker = Task(executorPreference: executor) {
            do { race.finish(.success(try await work())) } catch { race.finish(.failure(error)) }
        }
        // A timer of the loop's own: it needs no task and no thread of its own.
        let timer = executor.loop.scheduleTask(in: TimeAmount(limit)) {
            race.finish(.failure(Self.timedOut(limit)))
            worker.cancel()
        }
        defer { timer.cancel() }
        return try await withTaskCancellationHandler {
            try await race.value()
        } onCancel: {
            race.finish(.failure(CancellationError()))
            worker.cancel()
        }
    }

    static func describe(_ error: any Error) -> String {
        if let error = error as? ServiceError { return error.message }
        return String(reflecting: (error as? PostgresTransactionError)?.closureError ?? error)
    }
}

/// The first result given to it, for whoever waits (once); later ones are dropped.
private final class FirstResult<T: Sendable>: Sendable {
    private let state = Mutex<(result: Result<T, any Error>?, waiter: CheckedContinuation<T, any Error>?)>((nil, nil))

    func finish(_ result: Result<T, any Error>) {
        let waiter = state.withLock { state -> CheckedContinuation<T, any Error>? in
            guard state.result == nil else { return nil }
            state.result = result
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(with: result)
    }

    func value() async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            let ready = state.withLock { state -> Result<T, any Error>? in
                if let result = state.result { return result }
                state.waiter = continuation
                return nil
            }
            if let ready { continuation.resume(with: ready) }
        }
    }
}

extension RequestDispatcher {
    /// Answers `events.after` from the outbox in `store`, as ``onEventsAfter(database:)`` does
    /// from SQLite: the page after the request's `sequence`, from one snapshot.
    public mutating func onEventsAfter(postgres store: PostgresStore) {
        on(EventsAfter.self, access: .serviceWithoutUID) { request, _ in
            try await store.read { connection in
                try await PostgresOutbox.events(after: request.sequence, limit: request.limit, on: connection, logger: store.logger)
            }
        }
    }
}

/// Runs `body` while the outbox in `store` is pruned to `retention` (see
/// ``withEventRetention(_:every:logger:prune:_:)``).
public func withEventRetention<T: Sendable>(
    _ retention: Outbox.Retention, postgres store: PostgresStore, every interval: Duration = .seconds(60),
    _ body: () async throws -> T
) async throws -> T {
    try await withEventRetention(
        retention, every: interval, logger: store.logger,
        prune: { try await PostgresOutbox.prune(retention, client: store.client, logger: store.logger) },
        measure: { try await store.read { try await PostgresOutbox.shape(on: $0, logger: store.logger) } }, body)
}

extension PostgresStore {
    /// Opens a pool to `location` for `applicationName`, brings its schema up to date with
    /// `migrator`, runs `body` with the store, and shuts the pool once `body` has returned: a
    /// service's PostgreSQL database for as long as it runs.
    ///
    /// The pool is shut only after the migrations and `body` have ended, also when the caller is
    /// cancelled meanwhile (a stop during start-up): postgres-nio 1.33 leaves a query unanswered
    /// forever when its connection is closed under a transaction that is still sending
    /// statements, so shutting the pool under a migration would hang the stop. Even so, the
    /// pool is waited for at most ``timeout`` once it is told to shut (a migration given up on
    /// keeps its connection): past that, a warning, and the service stops without it.
    ///
    /// - Throws: ``ServiceError`` `storeUnavailable` when the database cannot be reached or
    ///   migrated; what `body` throws.
    public static func withMigrated<T: Sendable>(
        _ location: PostgresLocation, applicationName: String, timeout: Duration, maxConnections: Int,
        migrator: PostgresMigrator, logger: Logger, _ body: (PostgresStore) async throws -> T
    ) async throws -> T {
        let store = PostgresStore(
            location: location, applicationName: applicationName, timeout: timeout, maxConnections: maxConnections,
            logger: logger)
        // Not a child task: the caller's cancellation reaches the pool only through `shut`.
        let pool = Task { await store.run() }
        func shut() async {
            pool.cancel()
            // In a task of its own: a caller that was cancelled (a stop) still waits, up to the timeout.
            await Task {
                do {
                    try await store.withinTimeout(timeout) { await pool.value }
                } catch {
                    logger.warning(
                        "The PostgreSQL pool for \(location) did not close within \(timeout) (a connection is still busy); stopping without it")
                }
            }.value
        }
        do {
            try await store.migrate(migrator)
            let result = try await body(store)
            await shut()
            return result
        } catch {
            await shut()
            throw error
        }
    }
}
