/// A stable, machine-readable reason. It travels on the wire unchanged, so a client in any
/// language sees the same code the Swift client does.
public struct ErrorCode: RawRepresentable, Codable, Hashable, Sendable, ExpressibleByStringLiteral,
    CustomStringConvertible
{
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(stringLiteral value: String) { self.rawValue = value }
    public init(from decoder: any Decoder) throws {
        self.rawValue = try decoder.singleValueContainer().decode(String.self)
    }
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }
    public var description: String { rawValue }
}

extension ErrorCode {
    // Raised by the caller's own bus, never sent by a service.
    /// No reply came within the deadline. The service may or may not have acted.
    public static let timeout: ErrorCode = "timeout"
    /// Nothing is listening at the endpoint, so the request was never delivered.
    public static let noResponder: ErrorCode = "noResponder"
    /// The bus was shut down while the call was in flight.
    public static let closed: ErrorCode = "closed"

    // Sent by a service's bus or dispatcher about the request itself.
    /// The request is not a JSON envelope the service can read.
    public static let invalidMessage: ErrorCode = "invalidMessage"
    /// The envelope's `version` is one this service does not speak.
    public static let unsupportedVersion: ErrorCode = "unsupportedVersion"
    /// The envelope's `type` is not one this service answers.
    public static let unknownType: ErrorCode = "unknownType"
    /// The request has a binary frame it should not have, lacks one it needs, or has too many.
    public static let unexpectedFrames: ErrorCode = "unexpectedFrames"
    /// A frame is larger than the endpoint accepts.
    public static let messageTooLarge: ErrorCode = "messageTooLarge"
    /// The service has too much in flight; try again shortly.
    public static let overloaded: ErrorCode = "overloaded"
    /// The service is stopping and takes no new work; try again in a moment (a restarted or
    /// another instance will answer).
    public static let shuttingDown: ErrorCode = "shuttingDown"
    /// A fault inside the service; it has been logged there.
    public static let internalError: ErrorCode = "internalError"
}

/// A failed call: a local failure (`timeout`, `noResponder`, `closed`) or a service's refusal.
///
/// This is also the payload of every reply of type ``ServiceError/messageType`` (`"error"`).
public struct ServiceError: Error, Codable, Sendable, Hashable, CustomStringConvertible {
    /// The envelope type of a reply that carries a `ServiceError`.
    public static let messageType = "error"

    public var code: ErrorCode
    /// A plain explanation for a person reading a log or a terminal.
    public var message: String
    /// A finer reason where the code has several (the username rules, for example).
    public var reason: String?

    public init(_ code: ErrorCode, _ message: String, reason: String? = nil) {
        self.code = code
        self.message = message
        self.reason = reason
    }

    public var description: String {
        if let reason { return "\(code) (\(reason)): \(message)" }
        return "\(code): \(message)"
    }
}
