import Foundation
import Messaging

/// Reading configuration: a flag wins, then the environment, then the documented default.
public enum Settings {
    public static func environment(_ name: String) -> String? {
        guard let value = ProcessInfo.processInfo.environment[name], !value.isEmpty else { return nil }
        return value
    }

    public static func endpoint(_ flag: String?, env: String, default value: Endpoint) -> Endpoint {
        if let flag { return Endpoint(flag) }
        if let text = environment(env) { return Endpoint(text) }
        return value
    }

    /// - Throws: ``ServiceError`` `invalidRequest` when the environment variable is not a number.
    public static func integer(_ flag: Int?, env: String, default value: Int) throws -> Int {
        if let flag { return flag }
        guard let text = environment(env) else { return value }
        guard let number = Int(text) else {
            throw ServiceError(.invalidRequest, "\(env) must be a whole number, not '\(text)'.")
        }
        return number
    }

    /// The largest image accepted: `--max-image-bytes`, `ONBOARDING_MAX_IMAGE_BYTES`, or 5 MiB.
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` unless it is from 1 byte to 1 GiB.
    public static func imageLimit(_ flag: Int?) throws -> Int {
        let limit = try integer(flag, env: "ONBOARDING_MAX_IMAGE_BYTES", default: Defaults.maxImageBytes)
        guard (1...(1 << 30)).contains(limit) else {
            throw ServiceError(
                .invalidRequest, "The image limit must be from 1 byte to 1 GiB (1073741824), not \(limit).")
        }
        return limit
    }

    /// How many hours of events a publisher keeps for replay: `--event-retention-hours`,
    /// `ONBOARDING_EVENT_RETENTION_HOURS`, or 24.
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` unless it is from 1 hour to 10 years (87600).
    public static func eventRetentionHours(_ flag: Int?) throws -> Int {
        let hours = try integer(flag, env: "ONBOARDING_EVENT_RETENTION_HOURS", default: Defaults.eventRetentionHours)
        guard (1...87_600).contains(hours) else {
            throw ServiceError(.invalidRequest, "The event retention must be from 1 to 87600 hours, not \(hours).")
        }
        return hours
    }
}
