import AuthService
import Messaging
import OnboardingSettings
import PostgresSupport

extension AuthPostgresDatabase {
    /// auth's PostgreSQL database from `postgres.url` and `auth.postgresSchema`; `nil` when no
    /// URL is set (auth keeps its SQLite file).
    ///
    /// - Throws: ``SettingError`` naming the setting that cannot work.
    public init?(_ settings: Settings) throws {
        guard let url = settings.text(.postgresURL), !url.isEmpty else { return nil }
        let schema = settings.text(.authPostgresSchema) ?? "auth"
        do {
            self.init(location: try PostgresLocation(url: url, schema: schema))
        } catch {
            // The schema's problem, or the URL's (never echoed: it may hold a password).
            let setting: Setting = error.message.contains("schema name") ? .authPostgresSchema : .postgresURL
            throw settings.invalid(setting, setting == .postgresURL ? url : schema, reason: error.message)
        }
    }
}
