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

    /// The most pixels an image may have: `--max-image-pixels`, `ONBOARDING_MAX_IMAGE_PIXELS`,
    /// or 40,000,000.
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` unless it is from 1 to 1,000,000,000.
    public static func imagePixelLimit(_ flag: Int?) throws -> Int {
        try ranged(
            flag, env: "ONBOARDING_MAX_IMAGE_PIXELS", default: Defaults.maxImagePixels, 1...1_000_000_000,
            "The image pixel limit")
    }

    /// The longest side an image may have: `--max-image-side`, `ONBOARDING_MAX_IMAGE_SIDE`, or
    /// 10,000 pixels.
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` unless it is from 1 to 100,000.
    public static func imageSideLimit(_ flag: Int?) throws -> Int {
        try ranged(flag, env: "ONBOARDING_MAX_IMAGE_SIDE", default: Defaults.maxImageSide, 1...100_000, "The image side limit")
    }

    /// How many images are decoded at once: `--image-decode-threads`,
    /// `ONBOARDING_IMAGE_DECODE_THREADS`, or 2.
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` unless it is from 1 to 64.
    public static func imageDecodeThreads(_ flag: Int?) throws -> Int {
        try ranged(
            flag, env: "ONBOARDING_IMAGE_DECODE_THREADS", default: Defaults.imageDecodeThreads, 1...64,
            "The number of image decode threads")
    }

    private static func ranged(
        _ flag: Int?, env: String, default value: Int, _ range: ClosedRange<Int>, _ what: String
    ) throws -> Int {
        let number = try integer(flag, env: env, default: value)
        guard range.contains(number) else {
            throw ServiceError(
                .invalidRequest,
                "\(what) (\(flag == nil ? env : "its flag, or \(env)")) must be from \(range.lowerBound) to \(range.upperBound), not \(number).")
        }
        return number
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
