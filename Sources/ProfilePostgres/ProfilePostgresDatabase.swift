import Logging
import OnboardingSettings
import PostgresSupport
import ProfileService

/// profile's store in PostgreSQL, for production: several profile replicas on several hosts
/// share it.
///
/// Its tables live in the schema of ``location`` (`profile` by default), created and migrated
/// when profile starts (two replicas starting at once take turns; see ``PostgresMigrator``).
/// Each replica's cache hears of the others' changes through PostgreSQL's `LISTEN`/`NOTIFY`, and
/// keeps nothing while it cannot (see ``ProfilePostgresStore/followChanges()``).
///
/// Thread safety: an immutable value.
public struct ProfilePostgresDatabase: ProfileDatabase {
    public var location: PostgresLocation
    /// The most connections profile holds open (one of them listens for other replicas' changes).
    public var maxConnections: Int
    /// How long one transaction or read may take before its caller gets `timeout`: under the
    /// 3 s that callers give a request, so that they hear why (and retry) instead of timing out.
    public var timeout: Duration

    public init(location: PostgresLocation, maxConnections: Int = 20, timeout: Duration = .seconds(2)) {
        self.location = location
        self.maxConnections = maxConnections
        self.timeout = timeout
    }

    /// profile's PostgreSQL database from `postgres.url` and `profile.postgresSchema`; `nil`
    /// when no URL is set (profile keeps its SQLite file).
    ///
    /// - Throws: ``SettingError`` naming the setting that cannot work.
    public init?(_ settings: Settings) throws {
        guard let location = try PostgresLocation(settings, schema: .profilePostgresSchema) else { return nil }
        self.init(location: location)
    }

    public var description: String { "PostgreSQL at \(location)" }

    public func withStorage<T: Sendable>(
        _ context: ProfileStorageContext, _ body: @Sendable (any ProfileStorage) async throws -> T
    ) async throws -> T {
        // Nothing is cached until this replica hears of the others' changes.
        context.cache.isTracking = false
        return try await PostgresStore.withMigrated(
            location, applicationName: "onboarding-profile", timeout: timeout, maxConnections: maxConnections,
            migrator: try ProfilePostgresStore.migrator(schema: location.schema), logger: context.logger
        ) { store in
            let storage = ProfilePostgresStore(store: store, context: context)
            return try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { await storage.followChanges() }
                defer { group.cancelAll() }
                return try await withEventRetention(context.eventRetention, postgres: store) { try await body(storage) }
            }
        }
    }
}
