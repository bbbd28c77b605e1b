import Messaging
import OnboardingSettings

extension Settings {
    /// Where databases, images and the service token are kept.
    public var dataDirectory: String { text(.dataDir) ?? Defaults.dataDirectory }

    /// The secret the services share: the setting, or the token file in the data directory.
    ///
    /// - Parameter create: make the file with a new random secret, readable by this user only,
    ///   when there is none (services do; tools only read it).
    /// - Returns: `nil` when `create` is false and there is neither setting nor file.
    public func serviceToken(create: Bool) throws -> String? {
        if let token = text(.serviceToken) { return token }
        let file = ServiceTokenFile(directory: dataDirectory)
        return create ? try file.readOrCreate() : file.read()
    }
}
