import OnboardingAPI
import OnboardingSettings

extension Outbox.Retention {
    /// How long events stay replayable: `ONBOARDING_EVENT_RETENTION_HOURS`.
    ///
    /// - Throws: ``SettingError`` when the hours are out of range.
    public init(_ settings: Settings) throws {
        self.init(maxAge: .seconds(try settings.integer(.eventRetentionHours) * 3600))
    }
}

extension Settings {
    /// A database path: the setting, or `name` in the data directory.
    public func databasePath(_ setting: Setting, name: String) -> String {
        path(setting, derived: dataDirectory + "/" + name)
    }
}
