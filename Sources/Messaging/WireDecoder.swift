import Foundation

/// Decodes messages as ``WireFormat/decoder()`` does, several times faster on what the hot path
/// receives: a strict JSON parser into a small tree, and a `Decoder` over it.
///
/// It handles objects, arrays, strings, booleans, `null` and integers, which is what every
/// envelope and payload here is made of. Anything else, and **every** failure (malformed JSON, a
/// missing field, a wrong type, a floating-point number, nesting deeper than 64), is handed to
/// Foundation's decoder, which then gives the result or the error: a message is never accepted
/// here that Foundation would refuse, and errors read exactly as Foundation's.
public enum WireDecoder {
    public static func decode<Value: Decodable>(
        _ type: Value.Type, from data: Data, userInfo: [CodingUserInfoKey: any Sendable] = [:]
    ) throws -> Value {
        if let value = try? fastDecode(type, from: data, userInfo: userInfo) { return value }
        let decoder = WireFormat.decoder()
        decoder.userInfo = userInfo
        return try decoder.decode(type, from: data)
    }

    static func fastDecode<Value: Decodable>(
        _ type: Value.Type, from data: Data, userInfo: [CodingUserInfoKey: any Sendable]
    ) throws -> Value {
        // Keys, plain strings and numbers stay slices of `data` until a field is decoded: the
        // tree is read while the bytes are at hand.
        try data.withUnsafeBytes { bytes in
            var parser = JSONParser(bytes: bytes)
            let root = try parser.parseDocument()
            if let readable = Value.self as? any WireReadable.Type {
                return try readable.init(wire: WireObject(root)) as! Value
            }
            return try Value(from: TreeDecoder(value: root, userInfo: userInfo))
        }
    }

    /// An envelope's header and, when `readers` has its type, its payload, read straight from
    /// the tree (``WireReadable``); `nil` when anything is not as expected (or the type is
    /// registered only as `Decodable`), so that the caller takes the full path.
    static func fastRead(_ data: Data, readers: [String: @Sendable (WireObject) throws -> any Sendable], decodables: Set<String>)
        -> (header: EnvelopeHeader, payload: (any Sendable)?)?
    {
        try? data.withUnsafeBytes { bytes in
            var parser = JSONParser(bytes: bytes)
            let root = try WireObject(try parser.parseDocument())
            let header = try EnvelopeHeader(wire: root)
            if let reader = readers[header.type] { return (header, try reader(try root.object("payload"))) }
            if decodables.contains(header.type) { throw NotHandled() }
            return (header, nil)
        }
    }

    /// Whatever the fast path does not handle; Foundation's decoder takes over.
    struct NotHandled: Error {}
}

// MARK: - Parsing

enum JSONValue {
    case null
    case bool(Bool)
    /// An integer literal, as written (`-`? digits, no fraction or exponent).
    case integer(RawText)
    /// A string without escapes: its bytes, valid UTF-8.
    case text(RawText)
    /// A string with escapes, decoded.
    case string(String)
    case array([JSONValue])
    /// Members in the order written; keys are strings without escapes.
    case object([(key: RawText, value: JSONValue)])
}

/// Bytes of the message being decoded (valid only while it is), made into a `String` only when
/// a field is read.
struct RawText {
    let start: UnsafeRawPointer
    let count: Int

    var string: String {
        String(decoding: UnsafeRawBufferPointer(start: start, count: count), as: UTF8.self)
    }

    func equals(_ other: RawText) -> Bool {
        count == other.count && memcmp(start, other.start, count) == 0
    }

    func equals(_ key: String) -> Bool {
        var key = key
        return key.withUTF8 { utf8 in utf8.count == count && (count == 0 || memcmp(start, utf8.baseAddress!, count) == 0) }
    }
}

/// RFC 8259, strictly: no leading zeros, no control characters in strings, valid UTF-8 and
/// escapes, nothing after the value but white space.
struct JSONParser {
    let bytes: UnsafeRawBufferPointer
    var index = 0
    var depth = 0
    static let maximumDepth = 64

    init(bytes: UnsafeRawBufferPointer) {
        self.bytes = bytes
    }

    mutating func parseDocument() throws -> JSONValue {
        let value = try parseValue()
        skipSpace()
        guard index == bytes.count else { throw WireDecoder.NotHandled() }
        return value
    }

    mutating func skipSpace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    mutating func parseValue() throws -> JSONValue {
        skipSpace()
        guard index < bytes.count else { throw WireDecoder.NotHandled() }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try parseObject()
        case UInt8(ascii: "["): return try parseArray()
        case UInt8(ascii: "\""): return try parseString()
        case UInt8(ascii: "t"): try expect("true"); return .bool(true)
        case UInt8(ascii: "f"): try expect("false"); return .bool(false)
        case UInt8(ascii: "n"): try expect("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try parseInteger()
        default: throw WireDecoder.NotHandled()
        }
    }

    mutating func expect(_ word: StaticString) throws {
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count else { throw WireDecoder.NotHandled() }
        for offset in 0..<count where bytes[index + offset] != word.utf8Start[offset] {
            throw WireDecoder.NotHandled()
        }
        index += count
    }

    mutating func parseInteger() throws -> JSONValue {
        let start = index
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        let digitsStart = index
        while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
        let digits = index - digitsStart
        // No digits, a leading zero, or a fraction or exponent: Foundation's to judge.
        guard digits > 0, digits == 1 || bytes[digitsStart] != UInt8(ascii: "0") else { throw WireDecoder.NotHandled() }
        if index < bytes.count, [UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E")].contains(bytes[index]) {
            throw WireDecoder.NotHandled()
        }
        return .integer(RawText(start: bytes.baseAddress! + start, count: index - start))
    }

    mutating func parseString() throws -> JSONValue {
        index += 1  // the opening quote
        let start = index
        // Fast case: no escapes, left in place (checked to be UTF-8 when not ASCII).
        var ascii = true
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                let raw = UnsafeRawBufferPointer(rebasing: bytes[start..<index])
                index += 1
                guard ascii || String(validating: raw, as: UTF8.self) != nil else { throw WireDecoder.NotHandled() }
                return .text(RawText(start: bytes.baseAddress! + start, count: raw.count))
            }
            if byte == UInt8(ascii: "\\") { break }
            guard byte >= 0x20 else { throw WireDecoder.NotHandled() }
            if byte >= 0x80 { ascii = false }
            index += 1
        }
        // With escapes.
        var decoded = Array(UnsafeRawBufferPointer(rebasing: bytes[start..<index]))
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                index += 1
                guard let string = String(validating: decoded, as: UTF8.self) else { throw WireDecoder.NotHandled() }
                return .string(string)
            case UInt8(ascii: "\\"):
                index += 1
                guard index < bytes.count else { throw WireDecoder.NotHandled() }
                let escape = bytes[index]
                index += 1
                switch escape {
                case UInt8(ascii: "\""): decoded.append(0x22)
                case UInt8(ascii: "\\"): decoded.append(0x5C)
                case UInt8(ascii: "/"): decoded.append(0x2F)
                case UInt8(ascii: "b"): decoded.append(0x08)
                case UInt8(ascii: "f"): decoded.append(0x0C)
                case UInt8(ascii: "n"): decoded.append(0x0A)
                case UInt8(ascii: "r"): decoded.append(0x0D)
                case UInt8(ascii: "t"): decoded.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try hex4()
                    if (0xD800..<0xDC00).contains(scalar) {
                        // A high surrogate must be followed by an escaped low one.
                        try expect("\\u")
                        let low = try hex4()
                        guard (0xDC00..<0xE000).contains(low) else { throw WireDecoder.NotHandled() }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    }
                    guard let unicode = Unicode.Scalar(scalar) else { throw WireDecoder.NotHandled() }
                    decoded.append(contentsOf: Array(String(Character(unicode)).utf8))
                default:
                    throw WireDecoder.NotHandled()
                }
            default:
                guard byte >= 0x20 else { throw WireDecoder.NotHandled() }
                decoded.append(byte)
                index += 1
            }
        }
        throw WireDecoder.NotHandled()
    }

    mutating func hex4() throws -> UInt32 {
        guard index + 4 <= bytes.count else { throw WireDecoder.NotHandled() }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw WireDecoder.NotHandled()
            }
            value = value << 4 | UInt32(digit)
            index += 1
        }
        return value
    }

    mutating func parseArray() throws -> JSONValue {
        depth += 1
        guard depth <= Self.maximumDepth else { throw WireDecoder.NotHandled() }
        defer { depth -= 1 }
        index += 1
        var elements: [JSONValue] = []
        skipSpace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
            return .array(elements)
        }
        repeat {
            elements.append(try parseValue())
        } while try more(closing: UInt8(ascii: "]"))
        return .array(elements)
    }

    /// After an element or member: `true` for a comma (another follows), `false` for `closing`.
    mutating func more(closing: UInt8) throws -> Bool {
        skipSpace()
        guard index < bytes.count else { throw WireDecoder.NotHandled() }
        let byte = bytes[index]
        index += 1
        if byte == UInt8(ascii: ",") { return true }
        guard byte == closing else { throw WireDecoder.NotHandled() }
        return false
    }

    mutating func parseObject() throws -> JSONValue {
        depth += 1
        guard depth <= Self.maximumDepth else { throw WireDecoder.NotHandled() }
        defer { depth -= 1 }
        index += 1
        var members: [(key: RawText, value: JSONValue)] = []
        skipSpace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            return .object(members)
        }
        repeat {
            skipSpace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw WireDecoder.NotHandled() }
            // A key with escapes, or given twice (which one counts?): Foundation's to judge.
            guard case .text(let key) = try parseString(), !members.contains(where: { $0.key.equals(key) }) else {
                throw WireDecoder.NotHandled()
            }
            skipSpace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw WireDecoder.NotHandled() }
            index += 1
            members.append((key, try parseValue()))
        } while try more(closing: UInt8(ascii: "}"))
        return .object(members)
    }
}

// MARK: - Decoding

struct TreeDecoder: Decoder {
    let value: JSONValue
    let userInfo: [CodingUserInfoKey: Any]
    var codingPath: [any CodingKey] { [] }

    func container<Key: CodingKey>(keyedBy _: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard case .object(let members) = value else { throw WireDecoder.NotHandled() }
        return KeyedDecodingContainer(TreeKeyed<Key>(members: members, userInfo: userInfo))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard case .array(let elements) = value else { throw WireDecoder.NotHandled() }
        return TreeUnkeyed(elements: elements, userInfo: userInfo)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        TreeSingle(value: value, userInfo: userInfo)
    }
}

/// Reads a primitive of type `T` from `value`, or refuses.
private func primitive<T: Decodable>(_: T.Type, from value: JSONValue, userInfo: [CodingUserInfoKey: Any]) throws -> T {
    switch value {
    case .text(let text):
        if T.self == String.self { return text.string as! T }
    case .string(let string):
        if T.self == String.self { return string as! T }
    case .bool(let bool):
        if T.self == Bool.self { return bool as! T }
    case .integer(let digits):
        if let integer = integer(T.self, digits.string) { return integer }
    default:
        break
    }
    if T.self == String.self || T.self == Bool.self || T.self is any BinaryInteger.Type || T.self is any FloatingPoint.Type
        || T.self == Date.self || T.self == Data.self || T.self == URL.self || T.self == Decimal.self
    {
        throw WireDecoder.NotHandled()
    }
    return try T(from: TreeDecoder(value: value, userInfo: userInfo))
}

private func integer<T>(_: T.Type, _ text: String) -> T? {
    switch T.self {
    case is Int.Type: return Int(text) as? T
    case is Int64.Type: return Int64(text) as? T
    case is UInt64.Type: return UInt64(text) as? T
    case is Int32.Type: return Int32(text) as? T
    case is UInt32.Type: return UInt32(text) as? T
    case is UInt.Type: return UInt(text) as? T
    case is Int16.Type: return Int16(text) as? T
    case is UInt16.Type: return UInt16(text) as? T
    case is Int8.Type: return Int8(text) as? T
    case is UInt8.Type: return UInt8(text) as? T
    default: return nil
    }
}

private struct TreeKeyed<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let members: [(key: RawText, value: JSONValue)]
    let userInfo: [CodingUserInfoKey: Any]
    var codingPath: [any CodingKey] { [] }

    var allKeys: [Key] { members.compactMap { Key(stringValue: $0.key.string) } }

    func contains(_ key: Key) -> Bool {
        let name = key.stringValue
        return members.contains { $0.key.equals(name) }
    }

    private func member(_ key: Key) throws -> JSONValue {
        let name = key.stringValue
        guard let member = members.first(where: { $0.key.equals(name) }) else { throw WireDecoder.NotHandled() }
        return member.value
    }

    func decodeNil(forKey key: Key) throws -> Bool {
        if case .null = try member(key) { return true }
        return false
    }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        try primitive(type, from: try member(key), userInfo: userInfo)
    }

    // The primitives that envelopes and payloads are made of, without the generic path's casts;
    // `decodeIfPresent` looks the key up once instead of three times.

    func decode(_: String.Type, forKey key: Key) throws -> String { try WireObject.string(member(key)) }
    func decode(_: Bool.Type, forKey key: Key) throws -> Bool { try WireObject.boolean(member(key)) }
    func decode(_: Int.Type, forKey key: Key) throws -> Int { try WireObject.integer(member(key)) }
    func decode(_: Int64.Type, forKey key: Key) throws -> Int64 { try WireObject.integer(member(key)) }
    func decode(_: UInt64.Type, forKey key: Key) throws -> UInt64 { try WireObject.integer(member(key)) }

    func decodeIfPresent(_: String.Type, forKey key: Key) throws -> String? { try present(key).map(WireObject.string) }
    func decodeIfPresent(_: Bool.Type, forKey key: Key) throws -> Bool? { try present(key).map(WireObject.boolean) }
    func decodeIfPresent(_: Int.Type, forKey key: Key) throws -> Int? { try present(key).map { try WireObject.integer($0) } }
    func decodeIfPresent(_: Int64.Type, forKey key: Key) throws -> Int64? { try present(key).map { try WireObject.integer($0) } }
    func decodeIfPresent(_: UInt64.Type, forKey key: Key) throws -> UInt64? { try present(key).map { try WireObject.integer($0) } }

    /// The member's value, or `nil` when it is missing or `null`.
    private func present(_ key: Key) -> JSONValue? {
        let name = key.stringValue
        guard let member = members.first(where: { $0.key.equals(name) }) else { return nil }
        if case .null = member.value { return nil }
        return member.value
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy _: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        guard case .object(let nested) = try member(key) else { throw WireDecoder.NotHandled() }
        return KeyedDecodingContainer(TreeKeyed<NestedKey>(members: nested, userInfo: userInfo))
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        guard case .array(let elements) = try member(key) else { throw WireDecoder.NotHandled() }
        return TreeUnkeyed(elements: elements, userInfo: userInfo)
    }

    func superDecoder() throws -> any Decoder { throw WireDecoder.NotHandled() }
    func superDecoder(forKey key: Key) throws -> any Decoder { throw WireDecoder.NotHandled() }
}

private struct TreeUnkeyed: UnkeyedDecodingContainer {
    let elements: [JSONValue]
    let userInfo: [CodingUserInfoKey: Any]
    var currentIndex = 0
    var codingPath: [any CodingKey] { [] }
    var count: Int? { elements.count }
    var isAtEnd: Bool { currentIndex >= elements.count }

    private mutating func next() throws -> JSONValue {
        guard !isAtEnd else { throw WireDecoder.NotHandled() }
        defer { currentIndex += 1 }
        return elements[currentIndex]
    }

    mutating func decodeNil() throws -> Bool {
        guard !isAtEnd else { throw WireDecoder.NotHandled() }
        if case .null = elements[currentIndex] {
            currentIndex += 1
            return true
        }
        return false
    }

    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T {
        try primitive(type, from: try next(), userInfo: userInfo)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy _: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        guard case .object(let members) = try next() else { throw WireDecoder.NotHandled() }
        return KeyedDecodingContainer(TreeKeyed<NestedKey>(members: members, userInfo: userInfo))
    }

    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard case .array(let nested) = try next() else { throw WireDecoder.NotHandled() }
        return TreeUnkeyed(elements: nested, userInfo: userInfo)
    }

    mutating func superDecoder() throws -> any Decoder { throw WireDecoder.NotHandled() }
}

private struct TreeSingle: SingleValueDecodingContainer {
    let value: JSONValue
    let userInfo: [CodingUserInfoKey: Any]
    var codingPath: [any CodingKey] { [] }

    func decodeNil() -> Bool {
        if case .null = value { return true }
        return false
    }

    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        try primitive(type, from: value, userInfo: userInfo)
    }
}
