import Logging
import OnboardingOrchestrator
import OnboardingSettings
import PostgresNIO
import PostgresSupport
import ServiceLifecycle

/// The orchestrator's store in PostgreSQL, for production: several orchestrator replicas on
/// several hosts share it, and one of them at a time decides.
///
/// Its tables live in the schema of ``location`` (`orchestrator` by default), created and
/// migrated when the orchestrator starts. Then it waits to lead (``Leadership``): the replica
/// that holds the schema's advisory lock follows the events, answers requests and runs set-ups
/// and clean-ups; the others stand by, and the first to get the lock takes over when the leader
/// stops or dies, resuming the work it left from the store. Every decision transaction checks
/// that its replica still leads, so a replica that lost the lead without knowing it yet cannot
/// write a decision the new leader did not see.
///
/// Thread safety: an immutable value.
public struct OrchestratorPostgresDatabase: OrchestratorDatabase {
    public var location: PostgresLocation
    /// The most connections the orchestrator holds open (one of them keeps the lead).
    public var maxConnections: Int
    /// How long one transaction or read may take before its caller gets `timeout`.
    public var timeout: Duration
    /// How often a standby tries for the lead, and the leader checks it still has it.
    public var leaseCheck: Duration
    /// How long the leader waits for that check before it takes the lead as lost (longer than
    /// the database's usual hiccups: the chaos test pauses it for up to 4 s).
    public var leasePatience: Duration

    public init(
        location: PostgresLocation, maxConnections: Int = 10, timeout: Duration = .seconds(2),
        leaseCheck: Duration = .seconds(1), leasePatience: Duration = .seconds(10)
    ) {
        self.location = location
        self.maxConnections = maxConnections
        self.timeout = timeout
        self.leaseCheck = leaseCheck
        self.leasePatience = leasePatience
    }

    /// The orchestrator's PostgreSQL database from `postgres.url` and
    /// `orchestrator.postgresSchema`; `nil` when no URL is set (it keeps its SQLite file).
    ///
    /// - Throws: ``SettingError`` naming the setting that cannot work.
    public init?(_ settings: Settings) throws {
        guard let location = try PostgresLocation(settings, schema: .orchestratorPostgresSchema) else { return nil }
        self.init(location: location)
    }

    public var description: String { "PostgreSQL at \(location)" }

    public func withStorage<T: Sendable>(
        _ context: OrchestratorStorageContext, _ body: @Sendable (any OrchestratorStorage) async throws -> T
    ) async throws -> T {
        let (leaseCheck, leasePatience) = (self.leaseCheck, self.leasePatience)
        return try await PostgresStore.withMigrated(
            location, applicationName: "onboarding-orchestrator", timeout: timeout, maxConnections: maxConnections,
            migrator: try OrchestratorPostgresStore.migrator(schema: location.schema), logger: context.logger
        ) { store in
            // The lead is held by a connection of its own for as long as this replica decides.
            return try await store.client.withConnection { connection in
                // A standby asked to stop has nothing to drain: it stops at once.
                let leadership: Leadership
                do {
                    leadership = try await cancelWhenGracefulShutdown {
                        try await Leadership.take(
                            on: connection, store: store, every: leaseCheck, patience: leasePatience, logger: context.logger)
                    }
                } catch is CancellationError where Task.isShuttingDownGracefully {
                    throw StoppedWhileStandingBy()
                }
                let storage = OrchestratorPostgresStore(store: store, context: context, epoch: leadership.epoch)
                // The group waits for both tasks, so `body` never outlives this call.
                let outcome: Result<T, any Error>
                do {
                    outcome = .success(try await withoutActuallyEscaping(body) { body in
                        try await withThrowingTaskGroup(of: T?.self) { leading in
                            leading.addTask {
                                try await withEventRetention(context.retention, postgres: store) { try await body(storage) }
                            }
                            leading.addTask {
                                try await leadership.watch(on: connection, store: store, every: leaseCheck, patience: leasePatience)
                                return nil
                            }
                            defer { leading.cancelAll() }
                            // The body's result, or the watch's news that the lead is lost.
                            guard let first = try await leading.next(), let result = first else { throw CancellationError() }
                            return result
                        }
                    })
                } catch {
                    outcome = .failure(error)
                }
                // On every way out: a lead left on a connection back in the pool would stay held.
                await leadership.release(on: connection)
                let result = try outcome.get()
                return result
            }
        }
    }
}
