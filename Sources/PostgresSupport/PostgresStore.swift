import Logging
import Messaging
import OnboardingAPI
import PostgresNIO
import ServiceRuntime
import Synchronization

/// A service's PostgreSQL database: a connection pool, the migrations run at start, and
/// transactions whose failures reach callers as `storeUnavailable`, never as an answer and
/// never as a hang.
///
/// Run it (``run()``) for as long as the service uses it, in the service's `ServiceGroup` or a
/// task of its own: the pool opens connections only while it runs.
///
/// Thread safety: any task may use it.
public final class PostgresStore: Sendable {
    public let location: PostgresLocation
    public let client: PostgresClient
    /// How long one transaction or read may take: past it, the caller gets `storeUnavailable`
    /// (a paused or unreachable server must not hold requests forever; the server's own
    /// `statement_timeout` cannot help when it does not answer at all).
    public let timeout: Duration
    let logger: Logger

    public init(
        location: PostgresLocation, applicationName: String, timeout: Duration = .seconds(5), maxConnections: Int = 20,
        logger: Logger
    ) {
        var configuration = location.clientConfiguration(applicationName: applicationName)
        configuration.options.maximumConnections = maxConnections
        configuration.options.connectTimeout = timeout
        self.location = location
        self.client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        self.timeout = timeout
        self.logger = logger
    }

    /// Keeps the pool open until the task is cancelled.
    public func run() async {
        await client.run()
    }

    /// Applies `migrator`'s missing migrations, waiting up to `patience` for the server to
    /// answer (a service and its database often start together).
    ///
    /// - Throws: ``ServiceError`` `storeUnavailable` naming the database when it never answered,
    ///   or a migration failed.
    @discardableResult
    public func migrate(_ migrator: PostgresMigrator, patience: Duration = .seconds(30)) async throws -> [String] {
        let clock = ContinuousClock()
        let deadline = clock.now + patience
        var delay = Duration.milliseconds(100)
        while true {
            do {
                let applied = try await withinTimeout { try await migrator.migrate(self.client, logger: self.logger) }
                if !applied.isEmpty { logger.notice("PostgreSQL migrations applied: \(applied.joined(separator: ", "))") }
                return applied
            } catch {
                guard clock.now + delay < deadline, !Task.isCancelled else {
                    throw ServiceError(
                        .storeUnavailable,
                        "Cannot migrate the database at \(location): \(String(reflecting: error)). Is PostgreSQL running, "
                            + "and may this user create the schema?")
                }
                logger.warning("PostgreSQL at \(location) is not ready (\(error)); trying again in \(delay)")
                try await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(2))
            }
        }
    }

    /// Runs `body` in one transaction: committed when it returns, rolled back when it throws.
    ///
    /// - Throws: what `body` throws when it is a ``ServiceError``; `storeUnavailable` for any
    ///   database failure or when the transaction takes longer than ``timeout`` (logged with its
    ///   cause, which the reply leaves out: it can name tables and columns).
    public func transaction<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await bounded {
            try await self.client.withTransaction(logger: self.logger) { connection in try await body(connection) }
        }
    }

    /// Runs `body` on a connection outside a transaction (each statement sees its own snapshot),
    /// with the failures of ``transaction(_:)``.
    public func read<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await bounded {
            try await self.client.withConnection { connection in try await body(connection) }
        }
    }

    /// `work`'s result; `storeUnavailable` for a database failure (logged with its cause) or
    /// when ``timeout`` passes without a result.
    private func bounded<T: Sendable>(_ work: @escaping @Sendable () async throws -> T) async throws -> T {
        do {
            return try await withinTimeout(work)
        } catch let error as ServiceError {
            throw error
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            logger.error("store failure: \(String(reflecting: error))")
            throw ServiceError(.storeUnavailable, "The store failed. Nothing was changed; try again.")
        }
    }

    /// `work`'s result or error, or `storeUnavailable` once ``timeout`` has passed without one.
    ///
    /// postgres-nio cannot take back a statement it has sent, and waits for a connection as long
    /// as the server is unreachable, so work past its time is left to finish (or fail) on its own;
    /// its result is dropped. A transaction that commits late has still committed: hence "may
    /// have been made" in the message.
    private func withinTimeout<T: Sendable>(_ work: @escaping @Sendable () async throws -> T) async throws -> T {
        let timeout = self.timeout
        return try await withCheckedThrowingContinuation { continuation in
            let race = FirstResult(continuation)
            let timer = Task {
                try await Task.sleep(for: timeout)
                race.finish(.failure(ServiceError(
                    .storeUnavailable,
                    "The store did not answer within \(timeout): the change may or may not have been made. Try "
                        + "again (a request with an idempotency key is safe to repeat).")))
            }
            Task {
                do { race.finish(.success(try await work())) } catch { race.finish(.failure(error)) }
                timer.cancel()
            }
        }
    }
}

/// Resumes a continuation with the first result given to it; later ones are dropped.
private final class FirstResult<T: Sendable>: Sendable {
    private let continuation: Mutex<CheckedContinuation<T, any Error>?>

    init(_ continuation: CheckedContinuation<T, any Error>) {
        self.continuation = Mutex(continuation)
    }

    func finish(_ result: Result<T, any Error>) {
        continuation.withLock { $0.take() }?.resume(with: result)
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
    try await withEventRetention(retention, every: interval, logger: store.logger, prune: {
        try await PostgresOutbox.prune(retention, client: store.client, logger: store.logger)
    }, body)
}
