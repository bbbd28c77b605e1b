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
        try await PostgresStore.withMigrated(
            location, applicationName: "onboarding-auth", timeout: timeout, maxConnections: maxConnections,
            migrator: try AuthPostgresStore.migrator(schema: location.schema), logger: context.logger
        ) { store in
            let storage = AuthPostgresStore(store: store, context: context)
            return try await withEventRetention(context.eventRetention, postgres: store) { try await body(storage) }
        }
    }
}
