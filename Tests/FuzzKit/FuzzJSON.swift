import Foundation

/// A JSON document to mutate and write back out, byte for byte as the fuzzer wants it.
///
/// Unlike a parsed dictionary it keeps member order and duplicate keys, writes numbers exactly as
/// given (`1e400`, `-0`, `18446744073709551616`), and can splice raw bytes (invalid UTF-8, raw
/// control characters, unterminated nesting) anywhere a value goes.
public indirect enum FuzzJSON: Sendable, Equatable {
    case null
    case bool(Bool)
    /// A number literal, written as is.
    case number(String)
    case string(String)
    case array([FuzzJSON])
    case object([Member])
    /// Bytes written verbatim where a value goes; usually not valid JSON.
    case raw([UInt8])

    public struct Member: Sendable, Equatable {
        public var key: String
        public var value: FuzzJSON

        public init(_ key: String, _ value: FuzzJSON) {
            self.key = key
            self.value = value
        }
    }

    public enum Kind: String, Sendable, CaseIterable {
        case null, bool, number, string, array, object, raw
    }

    public var kind: Kind {
        switch self {
        case .null: .null
        case .bool: .bool
        case .number: .number
        case .string: .string
        case .array: .array
        case .object: .object
        case .raw: .raw
        }
    }

    // MARK: Reading

    /// Parses a JSON document (object members in key order, so the result does not depend on
    /// hashing).
    public static func parse(_ data: Data) throws -> FuzzJSON {
        try JSONDecoder().decode(Parsed.self, from: data).value
    }

    private struct Parsed: Decodable {
        var value: FuzzJSON

        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if container.decodeNil() {
                value = .null
            } else if let bool = try? container.decode(Bool.self) {
                value = .bool(bool)
            } else if let integer = try? container.decode(Int64.self) {
                value = .number(String(integer))
            } else if let integer = try? container.decode(UInt64.self) {
                value = .number(String(integer))
            } else if let double = try? container.decode(Double.self) {
                value = .number("\(double)")
            } else if let string = try? container.decode(String.self) {
                value = .string(string)
            } else if let array = try? container.decode([Parsed].self) {
                value = .array(array.map(\.value))
            } else {
                let members = try container.decode([String: Parsed].self)
                value = .object(members.keys.sorted().map { Member($0, members[$0]!.value) })
            }
        }
    }

    // MARK: Objects

    public var members: [Member]? {
        if case .object(let members) = self { return members }
        return nil
    }

    public var keys: [String] { members?.map(\.key) ?? [] }

    public var stringValue: String? {
        if case .string(let string) = self { return string }
        return nil
    }

    public var arrayValue: [FuzzJSON]? {
        if case .array(let elements) = self { return elements }
        return nil
    }

    /// The value of the first member named `key`.
    public subscript(key: String) -> FuzzJSON? {
        members?.first { $0.key == key }?.value
    }

    /// Replaces the first member named `key` (in place), adds it at the end when absent, or
    /// removes every member named `key` when `value` is `nil`. Does nothing to a non-object.
    public mutating func set(_ key: String, _ value: FuzzJSON?) {
        guard var members else { return }
        if let value {
            if let index = members.firstIndex(where: { $0.key == key }) {
                members[index].value = value
            } else {
                members.append(Member(key, value))
            }
        } else {
            members.removeAll { $0.key == key }
        }
        self = .object(members)
    }

    /// Adds a member even when one with that key exists (a duplicate key).
    public mutating func append(_ key: String, _ value: FuzzJSON) {
        guard var members else { return }
        members.append(Member(key, value))
        self = .object(members)
    }

    /// This object with `key` set (see ``set(_:_:)``).
    public func setting(_ key: String, _ value: FuzzJSON?) -> FuzzJSON {
        var copy = self
        copy.set(key, value)
        return copy
    }

    // MARK: Writing

    /// The document as compact JSON (or whatever the raw parts make it).
    public var bytes: [UInt8] {
        var out: [UInt8] = []
        write(to: &out)
        return out
    }

    public var data: Data { Data(bytes) }

    public func write(to out: inout [UInt8]) {
        switch self {
        case .null: out += Array("null".utf8)
        case .bool(let value): out += Array((value ? "true" : "false").utf8)
        case .number(let literal): out += Array(literal.utf8)
        case .string(let string): Self.writeString(string, to: &out)
        case .raw(let bytes): out += bytes
        case .array(let elements):
            out.append(UInt8(ascii: "["))
            for (index, element) in elements.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                element.write(to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let members):
            out.append(UInt8(ascii: "{"))
            for (index, member) in members.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                Self.writeString(member.key, to: &out)
                out.append(UInt8(ascii: ":"))
                member.value.write(to: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    /// A JSON string literal: quotes, backslashes and control characters escaped, everything
    /// else as UTF-8.
    public static func writeString(_ string: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        for byte in string.utf8 {
            switch byte {
            case UInt8(ascii: "\""): out += [UInt8(ascii: "\\"), UInt8(ascii: "\"")]
            case UInt8(ascii: "\\"): out += [UInt8(ascii: "\\"), UInt8(ascii: "\\")]
            case 0x0A: out += [UInt8(ascii: "\\"), UInt8(ascii: "n")]
            case 0x00..<0x20:
                let hex = Array("0123456789abcdef".utf8)
                out += Array("\\u00".utf8) + [hex[Int(byte >> 4)], hex[Int(byte & 0x0F)]]
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}

// MARK: Paths

extension FuzzJSON {
    /// One step into a document: a member by key or an element by index.
    public enum Step: Sendable, Equatable, CustomStringConvertible {
        case key(String)
        case index(Int)

        public var description: String {
            switch self {
            case .key(let key): "." + key
            case .index(let index): "[\(index)]"
            }
        }
    }

    /// Every path below this value (not the empty path) whose value satisfies `include`,
    /// depth first in document order.
    public func paths(where include: (FuzzJSON) -> Bool = { _ in true }) -> [[Step]] {
        var found: [[Step]] = []
        func visit(_ value: FuzzJSON, _ path: [Step]) {
            if !path.isEmpty, include(value) { found.append(path) }
            switch value {
            case .object(let members):
                for member in members { visit(member.value, path + [.key(member.key)]) }
            case .array(let elements):
                for (index, element) in elements.enumerated() { visit(element, path + [.index(index)]) }
            default:
                break
            }
        }
        visit(self, [])
        return found
    }

    /// The value at `path`, if there is one.
    public func value(at path: [Step]) -> FuzzJSON? {
        guard let first = path.first else { return self }
        switch (self, first) {
        case (.object, .key(let key)): return self[key]?.value(at: Array(path.dropFirst()))
        case (.array(let elements), .index(let index)) where elements.indices.contains(index):
            return elements[index].value(at: Array(path.dropFirst()))
        default: return nil
        }
    }

    /// This document with the value at `path` replaced, or removed when `replacement` is `nil`.
    public func replacing(_ path: [Step], with replacement: FuzzJSON?) -> FuzzJSON {
        guard let first = path.first else { return replacement ?? .null }
        let rest = Array(path.dropFirst())
        switch (self, first) {
        case (.object, .key(let key)):
            if rest.isEmpty { return setting(key, replacement) }
            guard let child = self[key] else { return self }
            return setting(key, child.replacing(rest, with: replacement))
        case (.array(var elements), .index(let index)) where elements.indices.contains(index):
            if rest.isEmpty {
                if let replacement { elements[index] = replacement } else { elements.remove(at: index) }
            } else {
                elements[index] = elements[index].replacing(rest, with: replacement)
            }
            return .array(elements)
        default:
            return self
        }
    }
}

extension Array where Element == FuzzJSON.Step {
    /// `$.payload.profile.uid`-style text.
    public var pathText: String { "$" + map(\.description).joined() }
}

extension FuzzJSON {
    /// This document with every string value (not keys) passed through `transform`.
    public func mappingStrings(_ transform: (String) -> String) -> FuzzJSON {
        switch self {
        case .string(let string): .string(transform(string))
        case .array(let elements): .array(elements.map { $0.mappingStrings(transform) })
        case .object(let members): .object(members.map { Member($0.key, $0.value.mappingStrings(transform)) })
        default: self
        }
    }
}

extension FuzzRandom {
    /// A lowercase UUID string drawn from this stream (so it reproduces with the seed).
    public mutating func uuid() -> String {
        let hex = bytes(16).map { String($0, radix: 16) }.map { $0.count == 1 ? "0" + $0 : $0 }.joined()
        let characters = Array(hex)
        let groups = [0..<8, 8..<12, 12..<16, 16..<20, 20..<32].map { String(characters[$0]) }
        return groups.joined(separator: "-")
    }
}
