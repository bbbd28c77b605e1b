/// A payload that writes its own JSON, without the `Encodable` machinery: the hot path's
/// replies and events (a sign-in's reply and event, a route intent).
///
/// What it writes must be exactly what ``WireFormat/encoder()`` makes of the value: members in
/// the order of their keys' UTF-8 bytes, `nil` members left out. Each conformance is tested
/// against Foundation's encoder with random values.
public protocol WireWritable {
    func write(to writer: inout WireWriter)
}

/// Writes one JSON object's members, in the order given, with Foundation's escaping.
public struct WireWriter {
    var bytes: [UInt8]
    private var first = true

    init(appendingTo bytes: [UInt8]) {
        self.bytes = bytes
    }

    private mutating func key(_ key: StaticString) {
        bytes.append(first ? UInt8(ascii: "{") : UInt8(ascii: ","))
        first = false
        bytes.append(UInt8(ascii: "\""))
        bytes.append(contentsOf: UnsafeBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount))
        bytes.append(contentsOf: [UInt8(ascii: "\""), UInt8(ascii: ":")])
    }

    public mutating func member(_ key: StaticString, _ value: String) {
        self.key(key)
        WireEncoder.writeString(value, to: &bytes)
    }

    public mutating func member(_ key: StaticString, _ value: String?) {
        if let value { member(key, value) }
    }

    public mutating func member<Value: RawRepresentable>(_ key: StaticString, _ value: Value) where Value.RawValue == String {
        member(key, value.rawValue)
    }

    public mutating func member(_ key: StaticString, _ value: Bool) {
        self.key(key)
        let literal: StaticString = value ? "true" : "false"
        bytes.append(contentsOf: UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount))
    }

    public mutating func member(_ key: StaticString, _ value: Int) {
        self.key(key)
        bytes.append(contentsOf: String(value).utf8)
    }

    public mutating func member(_ key: StaticString, _ value: Int?) {
        if let value { member(key, value) }
    }

    /// Closes the object (`{}` when nothing was written).
    mutating func finish() {
        if first { bytes.append(UInt8(ascii: "{")) }
        bytes.append(UInt8(ascii: "}"))
    }
}
