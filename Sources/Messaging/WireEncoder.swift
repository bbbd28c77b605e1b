import Foundation

/// Encodes messages to exactly the bytes ``WireFormat/encoder()`` makes (sorted keys, slashes
/// unescaped, `nil` fields left out), several times faster: it writes the JSON directly instead
/// of going through Foundation's generic machinery. The hot path encodes every reply and event
/// with it.
///
/// It knows strings, booleans, integers, optionals, arrays, nested objects and enums with raw
/// values: everything the envelopes and payloads of this project are made of. A value that holds
/// anything else (a `Double`, `Date`, `Data`, `URL`, `Decimal`, or a custom `superEncoder`) is
/// encoded by Foundation's encoder instead, so the output is always the same.
public enum WireEncoder {
    /// The JSON bytes of `value`.
    public static func encode<Value: Encodable>(_ value: Value) throws -> Data {
        var output: [UInt8] = []
        output.reserveCapacity(512)
        try append(value, to: &output)
        return Data(output)
    }

    /// Appends the JSON bytes of `value` to `output`.
    static func append<Value: Encodable>(_ value: Value, to output: inout [UInt8]) throws {
        if let writable = value as? any WireWritable {
            var writer = WireWriter(appendingTo: output)
            output = []
            writable.write(to: &writer)
            writer.finish()
            output = writer.bytes
            return
        }
        do {
            try NodeEncoder.node(for: value).write(to: &output)
        } catch is Unsupported {
            output.append(contentsOf: try WireFormat.encoder().encode(value))
        }
    }

    /// The bytes of `envelope`: its header's fields written directly, in sorted order, with the
    /// payload's JSON in its place between `id` and `sequence`.
    static func encode<Payload>(envelope: Envelope<Payload>) throws -> Data {
        let header = envelope.header
        var output: [UInt8] = []
        output.reserveCapacity(512)
        output.append(UInt8(ascii: "{"))
        if let correlationId = header.correlationId { member("correlationId", correlationId, to: &output) }
        member("id", header.id, to: &output)
        output.append(contentsOf: #""payload":"#.utf8)
        try append(envelope.payload, to: &output)
        output.append(contentsOf: #","sequence":"#.utf8)
        output.append(contentsOf: String(header.sequence).utf8)
        output.append(UInt8(ascii: ","))
        if let serviceToken = header.serviceToken { member("serviceToken", serviceToken, to: &output) }
        if let sessionToken = header.sessionToken { member("sessionToken", sessionToken, to: &output) }
        member("source", header.source, to: &output)
        member("time", header.time, to: &output)
        if let traceparent = header.traceparent { member("traceparent", traceparent, to: &output) }
        if let tracestate = header.tracestate { member("tracestate", tracestate, to: &output) }
        member("type", header.type, to: &output)
        if let uid = header.uid { member("uid", uid, to: &output) }
        output.append(contentsOf: #""version":"#.utf8)
        output.append(contentsOf: String(header.version).utf8)
        output.append(UInt8(ascii: "}"))
        return Data(output)
    }

    /// `"key":"value",`
    private static func member(_ key: StaticString, _ value: String, to output: inout [UInt8]) {
        output.append(UInt8(ascii: "\""))
        output.append(contentsOf: UnsafeBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount))
        output.append(contentsOf: [UInt8(ascii: "\""), UInt8(ascii: ":")])
        writeString(value, to: &output)
        output.append(UInt8(ascii: ","))
    }

    /// Something this encoder leaves to Foundation's.
    struct Unsupported: Error {}
}

// MARK: - The tree

/// A JSON value being built. Objects keep their members in the order they were encoded and are
/// sorted when written; a key encoded twice keeps its last value, as Foundation does.
private enum Node {
    case literal([UInt8])
    case string(String)
    case object(ObjectNode)
    case array(ArrayNode)

    func write(to output: inout [UInt8]) {
        switch self {
        case .literal(let bytes):
            output.append(contentsOf: bytes)
        case .string(let string):
            writeString(string, to: &output)
        case .object(let object):
            output.append(UInt8(ascii: "{"))
            var first = true
            for (key, value) in object.sortedMembers() {
                if !first { output.append(UInt8(ascii: ",")) }
                first = false
                writeString(key, to: &output)
                output.append(UInt8(ascii: ":"))
                value.write(to: &output)
            }
            output.append(UInt8(ascii: "}"))
        case .array(let array):
            output.append(UInt8(ascii: "["))
            for (index, value) in array.elements.enumerated() {
                if index > 0 { output.append(UInt8(ascii: ",")) }
                value.write(to: &output)
            }
            output.append(UInt8(ascii: "]"))
        }
    }
}

private final class ObjectNode {
    var members: [(key: String, value: Node)] = []

    func set(_ value: Node, for key: String) {
        if let index = members.firstIndex(where: { $0.key == key }) {
            members[index].value = value
        } else {
            members.append((key, value))
        }
    }

    func sortedMembers() -> [(key: String, value: Node)] {
        // By UTF-8 bytes, as Foundation's sorted keys are.
        members.sorted { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
    }
}

private final class ArrayNode {
    var elements: [Node] = []
}

/// A string in JSON as Foundation writes it: `"` and `\` escaped, `\b \f \n \r \t` by name,
/// other control characters as `\u00xx`, everything else (slashes and non-ASCII included) as is.
extension WireEncoder {
    static func writeString(_ string: String, to output: inout [UInt8]) {
        Messaging.writeString(string, to: &output)
    }
}

private func writeString(_ string: String, to output: inout [UInt8]) {
    output.append(UInt8(ascii: "\""))
    var string = string
    string.withUTF8 { bytes in
        // Runs that need no escaping are copied whole.
        var start = 0
        for index in 0..<bytes.count {
            let byte = bytes[index]
            guard byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") else { continue }
            output.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start..<index]))
            writeEscaped(byte, to: &output)
            start = index + 1
        }
        output.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start...]))
    }
    output.append(UInt8(ascii: "\""))
}

private func writeEscaped(_ byte: UInt8, to output: inout [UInt8]) {
    let hex: StaticString = "0123456789abcdef"
    switch byte {
    case UInt8(ascii: "\""): output.append(contentsOf: [0x5C, 0x22])
    case UInt8(ascii: "\\"): output.append(contentsOf: [0x5C, 0x5C])
    case 0x08: output.append(contentsOf: [0x5C, UInt8(ascii: "b")])
    case 0x0C: output.append(contentsOf: [0x5C, UInt8(ascii: "f")])
    case 0x0A: output.append(contentsOf: [0x5C, UInt8(ascii: "n")])
    case 0x0D: output.append(contentsOf: [0x5C, UInt8(ascii: "r")])
    case 0x09: output.append(contentsOf: [0x5C, UInt8(ascii: "t")])
    default:
        output.append(contentsOf: [0x5C, UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0")])
        output.append(hex.utf8Start[Int(byte >> 4)])
        output.append(hex.utf8Start[Int(byte & 0x0F)])
    }
}

private func integer<T: BinaryInteger>(_ value: T) -> Node {
    .literal(Array(String(value).utf8))
}

// MARK: - The encoder

private final class NodeEncoder: Encoder {
    var codingPath: [any CodingKey] = []
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    /// What was encoded; an object stays open to later `container(keyedBy:)` calls.
    var node: Node?

    func container<Key: CodingKey>(keyedBy _: Key.Type) -> KeyedEncodingContainer<Key> {
        let object: ObjectNode
        if case .object(let existing) = node {
            object = existing
        } else {
            object = ObjectNode()
            node = .object(object)
        }
        return KeyedEncodingContainer(KeyedContainer<Key>(object: object))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        let array: ArrayNode
        if case .array(let existing) = node {
            array = existing
        } else {
            array = ArrayNode()
            node = .array(array)
        }
        return UnkeyedContainer(array: array)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer {
        SingleValueContainer(encoder: self)
    }

    /// The node of an arbitrary value: primitives directly, anything else through its own
    /// `encode(to:)`. Types Foundation treats specially are refused.
    static func node<T: Encodable>(for value: T) throws -> Node {
        switch value {
        case let string as String: return .string(string)
        case let bool as Bool: return .literal(Array((bool ? "true" : "false").utf8))
        case let int as Int: return integer(int)
        case let int as Int64: return integer(int)
        case let int as UInt64: return integer(int)
        case let int as Int32: return integer(int)
        case let int as UInt32: return integer(int)
        case let int as UInt: return integer(int)
        case let int as Int16: return integer(int)
        case let int as UInt16: return integer(int)
        case let int as Int8: return integer(int)
        case let int as UInt8: return integer(int)
        default: break
        }
        if T.self is any FloatingPoint.Type || T.self == Date.self || T.self == Data.self || T.self == URL.self
            || T.self == Decimal.self
        {
            throw WireEncoder.Unsupported()
        }
        let encoder = NodeEncoder()
        try value.encode(to: encoder)
        // A value that encoded nothing is an empty object to Foundation.
        return encoder.node ?? .object(ObjectNode())
    }
}

private struct KeyedContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let object: ObjectNode
    var codingPath: [any CodingKey] { [] }

    mutating func encodeNil(forKey key: Key) throws { object.set(.literal(Array("null".utf8)), for: key.stringValue) }
    mutating func encode(_ value: Bool, forKey key: Key) throws { object.set(try NodeEncoder.node(for: value), for: key.stringValue) }
    mutating func encode(_ value: String, forKey key: Key) throws { object.set(.string(value), for: key.stringValue) }
    mutating func encode(_ value: Double, forKey key: Key) throws { throw WireEncoder.Unsupported() }
    mutating func encode(_ value: Float, forKey key: Key) throws { throw WireEncoder.Unsupported() }
    mutating func encode(_ value: Int, forKey key: Key) throws { object.set(integer(value), for: key.stringValue) }
    mutating func encode(_ value: Int8, forKey key: Key) throws { object.set(integer(value), for: key.stringValue) }
    mutating func encode(_ value: Int16, forKey key: Key) throws { object.set(integer(value), for: key.stringValue) }
    mutating func encode(_ value: Int32, forKey key: Key) throws { object.set(integer(value), for: key.stringValue) }
    mutating func encode(_ value: Int64, forKey key: Key) throws { object.set(integer(value), for: key.stringValue) }
    mutating func encode(_ value: UInt, forKey key: Key) throws { object.set(integer(value), for: key.stringValue) }
    mutating func encode(_ value: UInt8, forKey key: Key) throws { object.set(integer(value), for: key.stringValue) }
    mutating func encode(_ value: UInt16, forKey key: Key) throws { object.set(integer(value), for: key.stringValue) }
    mutating func encode(_ value: UInt32, forKey key: Key) throws { object.set(integer(value), for: key.stringValue) }
    mutating func encode(_ value: UInt64, forKey key: Key) throws { object.set(integer(value), for: key.stringValue) }
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        object.set(try NodeEncoder.node(for: value), for: key.stringValue)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy _: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        let nested = ObjectNode()
        object.set(.object(nested), for: key.stringValue)
        return KeyedEncodingContainer(KeyedContainer<NestedKey>(object: nested))
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        let nested = ArrayNode()
        object.set(.array(nested), for: key.stringValue)
        return UnkeyedContainer(array: nested)
    }

    mutating func superEncoder() -> any Encoder { RefusingEncoder() }
    mutating func superEncoder(forKey key: Key) -> any Encoder { RefusingEncoder() }
}

private struct UnkeyedContainer: UnkeyedEncodingContainer {
    let array: ArrayNode
    var codingPath: [any CodingKey] { [] }
    var count: Int { array.elements.count }

    mutating func encodeNil() throws { array.elements.append(.literal(Array("null".utf8))) }
    mutating func encode(_ value: String) throws { array.elements.append(.string(value)) }
    mutating func encode(_ value: Double) throws { throw WireEncoder.Unsupported() }
    mutating func encode(_ value: Float) throws { throw WireEncoder.Unsupported() }
    mutating func encode<T: Encodable>(_ value: T) throws { array.elements.append(try NodeEncoder.node(for: value)) }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy _: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        let nested = ObjectNode()
        array.elements.append(.object(nested))
        return KeyedEncodingContainer(KeyedContainer<NestedKey>(object: nested))
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let nested = ArrayNode()
        array.elements.append(.array(nested))
        return UnkeyedContainer(array: nested)
    }

    mutating func superEncoder() -> any Encoder { RefusingEncoder() }
}

private struct SingleValueContainer: SingleValueEncodingContainer {
    let encoder: NodeEncoder
    var codingPath: [any CodingKey] { [] }

    mutating func encodeNil() throws { encoder.node = .literal(Array("null".utf8)) }
    mutating func encode(_ value: String) throws { encoder.node = .string(value) }
    mutating func encode(_ value: Double) throws { throw WireEncoder.Unsupported() }
    mutating func encode(_ value: Float) throws { throw WireEncoder.Unsupported() }
    mutating func encode<T: Encodable>(_ value: T) throws { encoder.node = try NodeEncoder.node(for: value) }
}

/// What `superEncoder` returns: every use is left to Foundation's encoder.
private struct RefusingEncoder: Encoder {
    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    func container<Key: CodingKey>(keyedBy _: Key.Type) -> KeyedEncodingContainer<Key> {
        KeyedEncodingContainer(RefusingKeyed<Key>())
    }
    func unkeyedContainer() -> any UnkeyedEncodingContainer { Refusing() }
    func singleValueContainer() -> any SingleValueEncodingContainer { Refusing() }
}

private struct Refusing: UnkeyedEncodingContainer, SingleValueEncodingContainer {
    var codingPath: [any CodingKey] { [] }
    var count: Int { 0 }
    mutating func encodeNil() throws { throw WireEncoder.Unsupported() }
    mutating func encode<T: Encodable>(_ value: T) throws { throw WireEncoder.Unsupported() }
    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy _: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        KeyedEncodingContainer(RefusingKeyed<NestedKey>())
    }
    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer { Refusing() }
    mutating func superEncoder() -> any Encoder { RefusingEncoder() }
}

private struct RefusingKeyed<Key: CodingKey>: KeyedEncodingContainerProtocol {
    var codingPath: [any CodingKey] { [] }
    mutating func encodeNil(forKey key: Key) throws { throw WireEncoder.Unsupported() }
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws { throw WireEncoder.Unsupported() }
    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy _: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        KeyedEncodingContainer(RefusingKeyed<NestedKey>())
    }
    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer { Refusing() }
    mutating func superEncoder() -> any Encoder { RefusingEncoder() }
    mutating func superEncoder(forKey key: Key) -> any Encoder { RefusingEncoder() }
}
