import OnboardingSettings

extension PostgresLocation {
    /// The database `postgres.url` names, for the tables of the schema that `schemaSetting`
    /// names (its default when unset); `nil` when no URL is set (the service keeps SQLite).
    ///
    /// - Throws: ``SettingError`` naming the setting that cannot work. The URL itself is never
    ///   shown: it may hold a password.
    public init?(_ settings: Settings, schema schemaSetting: Setting) throws(SettingError) {
        guard let url = settings.text(.postgresURL), !url.isEmpty else { return nil }
        let schema = settings.text(schemaSetting) ?? schemaSetting.defaultText
        do {
            _ = try Self.checkedSchema(schema)
        } catch {
            throw settings.invalid(schemaSetting, schema, reason: error.message)
        }
        do {
            try self.init(url: url, schema: schema)
        } catch {
            throw settings.invalid(.postgresURL, url, reason: error.message)
        }
    }
}
