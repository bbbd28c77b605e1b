import AuthService
import OnboardingSettings
import PostgresSupport

extension AuthPostgresDatabase {
    /// auth's PostgreSQL database from `postgres.url` and `auth.postgresSchema`; `nil` when no
    /// URL is set (auth keeps its SQLite file).
    ///
    /// - Throws: ``SettingError`` naming the setting that cannot work.
    public init?(_ settings: Settings) throws {
        guard let location = try PostgresLocation(settings, schema: .authPostgresSchema) else { return nil }
        self.init(location: location)
    }
}
