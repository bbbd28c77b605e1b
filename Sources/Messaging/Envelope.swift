import Foundation

/// The fields every message on the bus carries, whatever its payload.
///
/// On the wire an envelope is one JSON object: these fields at the top level and the message's
/// own content under `payload` (see `proto/schemas/envelope.schema.json`). Unknown top-level fields are
/// ignored, so a newer sender can add fields without breaking an older receiver.
public struct EnvelopeHeader: Codable, Sendable, Hashable {
    /// The envelope format this process speaks.
    public static let currentVersion = 1

    /// Envelope format version; receivers refuse versions they do not know (`unsupportedVersion`).
    public var version: Int
    /// A unique id for this message (a UUID string). Replies name it in `correlationId`.
    public var id: String
    /// What the payload is, such as `auth.signIn` or `route.intent`.
    public var type: String
    /// The name of the process that sent the message, such as `auth`.
    public var source: String
    /// Per-publisher sequence number of an event; it only grows. Requests and replies carry 0.
    public var sequence: UInt64
    /// When the message was made, RFC 3339 in UTC with milliseconds (`2026-11-21T05:30:00.123Z`).
    public var time: String
    /// On a reply, the `id` of the request it answers (absent only on an error reply to a request
    /// whose envelope was not read: see ``Message/errorReply(_:refusing:limits:source:)``); on an
    /// event, the request that caused it.
    public var correlationId: String?
    /// The person the message is about, where there is one.
    public var uid: String?
    /// The caller's session token, on user-scoped requests from an app. Never on events.
    public var sessionToken: String?
    /// The secret our own services share, on calls between them. Apps never have it; never on
    /// events or replies.
    public var serviceToken: String?
    /// W3C trace context (`traceparent`, `tracestate`): the trace this message belongs to, so
    /// that each hop's span joins it. Optional; a receiver that does not trace, or cannot read
    /// it, ignores it.
    public var traceparent: String?
    public var tracestate: String?

    public init(
        version: Int = EnvelopeHeader.currentVersion,
        id: String = Identifier.random(),
        type: String,
        source: String,
        sequence: UInt64 = 0,
        time: String = Timestamp.now(),
        correlationId: String? = nil,
        uid: String? = nil,
        sessionToken: String? = nil,
        serviceToken: String? = nil,
        traceparent: String? = nil,
        tracestate: String? = nil
    ) {
        self.version = version
        self.id = id
        self.type = type
        self.source = source
        self.sequence = sequence
        self.time = time
        self.correlationId = correlationId
        self.uid = uid
        self.sessionToken = sessionToken
        self.serviceToken = serviceToken
        self.traceparent = traceparent
        self.tracestate = tracestate
    }
}

/// A whole message: the header fields and a typed payload, encoded as one flat JSON object.
public struct Envelope<Payload: Codable & Sendable>: Codable, Sendable {
    public var header: EnvelopeHeader
    public var payload: Payload

    public init(header: EnvelopeHeader, payload: Payload) {
        self.header = header
        self.payload = payload
    }

    private enum CodingKeys: String, CodingKey { case payload }

    public init(from decoder: any Decoder) throws {
        self.header = try EnvelopeHeader(from: decoder)
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.payload = try container.decode(Payload.self, forKey: .payload)
    }

    public func encode(to encoder: any Encoder) throws {
        try header.encode(to: encoder)
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(payload, forKey: .payload)
    }

    /// The JSON bytes of this envelope: ``WireFormat/encoder()``'s bytes, made faster (see
    /// ``WireEncoder``).
    public func encoded() throws -> Data {
        try WireEncoder.encode(envelope: self)
    }
}

/// A payload with no fields: `{}`.
public struct Empty: Codable, Sendable, Hashable {
    public init() {}
}

/// JSON coders configured the way the wire format wants them.
public enum WireFormat {
    /// A JSON encoder with sorted keys, so the same value always makes the same bytes.
    public static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }

    public static func decoder() -> JSONDecoder {
        JSONDecoder()
    }
}

/// RFC 3339 timestamps in UTC with millisecond precision.
public enum Timestamp {
    /// The current time, formatted for an envelope's `time` field.
    public static func now() -> String {
        format(Date())
    }

    public static func format(_ date: Date) -> String {
        var seconds = time_t(date.timeIntervalSince1970.rounded(.down))
        let millis = Int32((date.timeIntervalSince1970 - Double(seconds)) * 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        // `YYYY-MM-DDTHH:MM:SS.mmmZ`, digits written in place.
        return String(unsafeUninitializedCapacity: 24) { buffer in
            var index = 0
            func put(_ value: Int32, _ width: Int) {
                var value = max(0, value)
                for position in stride(from: index + width - 1, through: index, by: -1) {
                    buffer[position] = UInt8(ascii: "0") + UInt8(value % 10)
                    value /= 10
                }
                index += width
            }
            func put(_ character: Unicode.Scalar) {
                buffer[index] = UInt8(ascii: character)
                index += 1
            }
            put(parts.tm_year + 1900, 4)
            put("-")
            put(parts.tm_mon + 1, 2)
            put("-")
            put(parts.tm_mday, 2)
            put("T")
            put(parts.tm_hour, 2)
            put(":")
            put(parts.tm_min, 2)
            put(":")
            put(parts.tm_sec, 2)
            put(".")
            put(millis, 3)
            put("Z")
            return index
        }
    }

    /// Parses what `format` makes without allocating (`2026-11-27T23:40:05.123Z`), and
    /// anything else ``parse(_:)`` reads through it: for the hot path's timings.
    public static func parseFast(_ text: String) -> Date? {
        var text = text
        let fast = text.withUTF8 { bytes -> Date? in
            guard bytes.count == 24, bytes[4] == UInt8(ascii: "-"), bytes[7] == UInt8(ascii: "-"),
                bytes[10] == UInt8(ascii: "T"), bytes[13] == UInt8(ascii: ":"), bytes[16] == UInt8(ascii: ":"),
                bytes[19] == UInt8(ascii: "."), bytes[23] == UInt8(ascii: "Z")
            else { return nil }
            func number(_ from: Int, _ count: Int) -> Int? {
                var value = 0
                for index in from..<(from + count) {
                    let digit = Int(bytes[index]) - Int(UInt8(ascii: "0"))
                    guard (0...9).contains(digit) else { return nil }
                    value = value * 10 + digit
                }
                return value
            }
            guard let year = number(0, 4), let month = number(5, 2), let day = number(8, 2), let hour = number(11, 2),
                let minute = number(14, 2), let second = number(17, 2), let millis = number(20, 3),
                (1...12).contains(month), (1...31).contains(day)
            else { return nil }
            // Days since 1970-01-01 of a proleptic Gregorian date (the civil-from-days inverse).
            let y = month <= 2 ? year - 1 : year
            let era = (y >= 0 ? y : y - 399) / 400
            let yearOfEra = y - era * 400
            let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
            let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
            let days = era * 146_097 + dayOfEra - 719_468
            let seconds = days * 86_400 + hour * 3600 + minute * 60 + second
            return Date(timeIntervalSince1970: Double(seconds) + Double(millis) / 1000)
        }
        return fast ?? parse(text)
    }

    /// Parses what `format` makes (and RFC 3339 without fractional seconds).
    public static func parse(_ text: String) -> Date? {
        if let date = try? Date.ISO8601FormatStyle(includingFractionalSeconds: true).parse(text) {
            return date
        }
        return try? Date.ISO8601FormatStyle().parse(text)
    }
}
