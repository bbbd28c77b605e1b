import Foundation

/// A message type that reads itself from a parsed JSON object, without the `Decodable`
/// machinery: the hot path's requests and events (a sign-in, the event it publishes).
///
/// What it reads must be exactly what `Decodable` makes of the same JSON; anything else (a
/// missing field, a wrong type, an unknown enum value) must throw, and the message then goes to
/// Foundation's decoder, which gives the value or the error (see ``WireDecoder``). Each
/// conformance is tested against Foundation's decoder with mutated messages.
public protocol WireReadable {
    init(wire object: WireObject) throws
}

/// One JSON object of a message being read, valid only while ``WireReadable/init(wire:)``
/// runs: its keys and plain strings still point into the message's bytes.
///
/// Members are found by key, the first one written when a key repeats, as the `Decodable`
/// path here does. Every accessor throws when the member is missing (optional ones: returns
/// `nil` when it is missing or `null`) or of another type.
public struct WireObject {
    let members: [(key: RawText, value: JSONValue)]

    init(_ value: JSONValue) throws {
        guard case .object(let members) = value else { throw WireDecoder.NotHandled() }
        self.members = members
    }

    private func find(_ key: StaticString) -> JSONValue? {
        let count = key.utf8CodeUnitCount
        for member in members where member.key.count == count && memcmp(member.key.start, key.utf8Start, count) == 0 {
            return member.value
        }
        return nil
    }

    private func required(_ key: StaticString) throws -> JSONValue {
        guard let value = find(key) else { throw WireDecoder.NotHandled() }
        return value
    }

    private func optional(_ key: StaticString) -> JSONValue? {
        guard let value = find(key) else { return nil }
        if case .null = value { return nil }
        return value
    }

    static func string(_ value: JSONValue) throws -> String {
        switch value {
        case .text(let text): return text.string
        case .string(let string): return string
        default: throw WireDecoder.NotHandled()
        }
    }

    static func integer<T: FixedWidthInteger>(_ value: JSONValue) throws -> T {
        guard case .integer(let digits) = value, let integer = T(digits.string) else { throw WireDecoder.NotHandled() }
        return integer
    }

    static func boolean(_ value: JSONValue) throws -> Bool {
        guard case .bool(let bool) = value else { throw WireDecoder.NotHandled() }
        return bool
    }

    public func string(_ key: StaticString) throws -> String { try Self.string(required(key)) }
    public func optionalString(_ key: StaticString) throws -> String? { try optional(key).map(Self.string) }
    public func bool(_ key: StaticString) throws -> Bool { try Self.boolean(required(key)) }
    public func optionalBool(_ key: StaticString) throws -> Bool? { try optional(key).map(Self.boolean) }
    public func integer<T: FixedWidthInteger>(_ key: StaticString, as _: T.Type = T.self) throws -> T {
        try Self.integer(required(key))
    }
    public func optionalInteger<T: FixedWidthInteger>(_ key: StaticString, as _: T.Type = T.self) throws -> T? {
        guard let value = optional(key) else { return nil }
        return try Self.integer(value) as T
    }

    /// A string member that must be one of `T`'s raw values.
    public func value<T: RawRepresentable>(_ key: StaticString, as _: T.Type = T.self) throws -> T where T.RawValue == String {
        guard let value = T(rawValue: try string(key)) else { throw WireDecoder.NotHandled() }
        return value
    }

    /// A nested object member.
    public func object(_ key: StaticString) throws -> WireObject { try WireObject(required(key)) }
}

extension EnvelopeHeader: WireReadable {
    public init(wire object: WireObject) throws {
        self.init(
            version: try object.integer("version"), id: try object.string("id"), type: try object.string("type"),
            source: try object.string("source"), sequence: try object.integer("sequence"), time: try object.string("time"),
            correlationId: try object.optionalString("correlationId"), uid: try object.optionalString("uid"),
            sessionToken: try object.optionalString("sessionToken"), serviceToken: try object.optionalString("serviceToken"),
            traceparent: try object.optionalString("traceparent"), tracestate: try object.optionalString("tracestate"))
    }
}

extension Envelope: WireReadable where Payload: WireReadable {
    public init(wire object: WireObject) throws {
        self.init(header: try EnvelopeHeader(wire: object), payload: try Payload(wire: try object.object("payload")))
    }
}
