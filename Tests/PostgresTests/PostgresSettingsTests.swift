import AuthPostgres
import OnboardingSettings
import Testing

@Suite("PostgreSQL settings")
struct PostgresSettingsTests {
    @Test("without postgres.url auth keeps SQLite; with it, the URL and auth's schema pick the database")
    func choice() throws {
        #expect(try AuthPostgresDatabase(Settings(environment: [:])) == nil)
        let database = try #require(
            try AuthPostgresDatabase(
                Settings(environment: [
                    "ONBOARDING_POSTGRES_URL": "postgresql://app:pw@db.internal:6543/main?sslmode=require",
                    "ONBOARDING_AUTH_POSTGRES_SCHEMA": "auth_blue",
                ])))
        #expect(database.location.host == "db.internal" && database.location.port == 6543)
        #expect(database.location.schema == "auth_blue" && database.location.tls == .require)
        #expect(!database.description.contains("pw"), "the password never reaches a log line")
    }

    @Test("a URL that cannot work names the variable and what to write, never the password")
    func badURL() throws {
        let error = #expect(throws: SettingError.self) {
            try AuthPostgresDatabase(Settings(environment: ["ONBOARDING_POSTGRES_URL": "mysql://app:hunter2@db/main"]))
        }
        let text = error?.description ?? ""
        #expect(text.contains("ONBOARDING_POSTGRES_URL") && text.contains("postgresql://USER@HOST:PORT/DATABASE"), "\(text)")
        #expect(!text.contains("hunter2"), "\(text)")
        let schema = #expect(throws: SettingError.self) {
            try AuthPostgresDatabase(
                Settings(environment: ["ONBOARDING_POSTGRES_URL": "postgresql://app@db/main", "ONBOARDING_AUTH_POSTGRES_SCHEMA": "Auth-1"]))
        }
        #expect(schema?.description.contains("ONBOARDING_AUTH_POSTGRES_SCHEMA") == true, "\(String(describing: schema))")
    }
}
