import AuthService
import Logging
import PostgresSupport

/// auth's store in PostgreSQL, for production: several auth replicas on several hosts share it.
///
/// Its tables live in the schema of ``location`` (`auth` by default), created and migrated when
/// auth starts (two replicas starting at once take turns; see ``PostgresMigrator``).
///
/// Thread safety: an immutable value.
public struct AuthPostgresDatabase: AuthDatabase {
    public var location: PostgresLocation
    /// The most connections auth holds open.
    public var maxConnections: Int
    /// How long one transaction may take before its callers get `storeUnavailable`: under the
    /// 3 s that callers give a request, so that they hear why (and retry) instead of timing out.
    public var timeout: Duration

    public init(location: PostgresLocation, maxConnections: Int = 20, timeout: Duration = .seconds(2)) {
        self.location = location
        self.maxConnections = maxConnections
        self.timeout = timeout
    }

    public var description: String { "PostgreSQL at \(location)" }

    public func withStorage<T: Sendable>(
        _ context: AuthStorageContext, _ body: @Sendable (any AuthStorage) async throws -> T
    ) async throws -> T {
        let store = PostgresStore(
            location: location, applicationName: "onboarding-auth", timeout: timeout, maxConnections: maxConnections,
            logger: context.logger)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await store.run() }
            defer { group.cancelAll() }
            try await store.migrate(try AuthPostgresStore.migrator(schema: location.schema))
            let storage = AuthPostgresStore(store: store, context: context)
            return try await withEventRetention(context.eventRetention, postgres: store) { try await body(storage) }
        }
    }
}
