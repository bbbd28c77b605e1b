import Foundation

/// The corpus: values, strings, numbers and byte sequences that tend to break parsers and
/// handlers, and mutations that apply them.
public enum FuzzValues {
    /// Strings worth trying in any string field.
    public static let strings: [String] = [
        "", " ", "a", "0", "-1", "null", "true", "{}", "[]", "\"", "\\", "\\u0000", "'", "`",
        "mina", "미나", "Mina_01", "abcdefghij", "mi na", "ㄱ", "\u{1100}\u{1161}", "ｍｉｎａ", "e\u{301}", "🙂", "👩‍👩‍👧‍👦",
        "\u{0}", "a\u{0}b", "\u{7F}", "\u{FEFF}", "\u{200B}", "\u{202E}evil", "\r\n", "\t",
        "../../../../etc/passwd", "..", ".", "/", "a/b", "a/../b", "%00", "%2e%2e%2f", "C:\\Windows",
        "3f2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40", "3F2B8C1E-6D4A-4B7E-9C2F-1A5E8D7B6C40",
        "3f2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40/9b1e4f2a-7c3d-4e8f-a6b5-0d2c1e9f8a7b.png",
        "3f2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40/../x.png", "00000000-0000-0000-0000-000000000000",
        "2026-11-21T05:30:00.123Z", "1970-01-01T00:00:00.000Z", "9999-99-99T99:99:99.999Z", "yesterday",
        "google", "apple", "kakao", "naver", "facebook", "request", "withdrawal", "png", "jpeg", "gif",
        "presentProfileSetup", "dismiss", "signedIn", "image/png", "image/gif", "text/html; charset=utf-8",
        "'; DROP TABLE profiles; --", "\" OR 1=1 --", "<script>alert(1)</script>", "${jndi:ldap://x}", "%s%s%n",
        String(repeating: "a", count: 65), String(repeating: "가", count: 10), String(repeating: "x", count: 1000),
    ]

    /// Number literals worth trying in any field: limits of every integer width, fractions,
    /// exponents, negative zero, and values no Swift integer holds.
    public static let numbers: [String] = [
        "0", "1", "-1", "2", "-0", "1.0", "1.5", "-1.5", "0.1", "1e0", "1e3", "1E-400", "1e400", "-1e400",
        "127", "128", "255", "256", "32767", "32768", "65535", "65536", "2147483647", "2147483648", "-2147483649",
        "4294967295", "4294967296", "9007199254740993", "9223372036854775807", "9223372036854775808",
        "-9223372036854775808", "-9223372036854775809", "18446744073709551615", "18446744073709551616",
        "123456789012345678901234567890123456789", "0.0000000000000000000000000000001",
    ]

    /// Byte sequences that are not UTF-8.
    public static let invalidUTF8: [[UInt8]] = [
        [0xFF], [0xFE], [0x80], [0xBF], [0xC0, 0x80], [0xC1, 0xBF], [0xE2, 0x82], [0xED, 0xA0, 0x80],
        [0xF4, 0x90, 0x80, 0x80], [0xF8, 0x88, 0x80, 0x80, 0x80], [0xE0, 0x80, 0xAF], [0xC3],
    ]

    /// Bytes that mean something to a JSON parser.
    public static let syntaxBytes: [[UInt8]] = [
        [0x00], [0x01], [0x1F], Array("\"".utf8), Array("\\".utf8), Array("{".utf8), Array("}".utf8),
        Array("[".utf8), Array("]".utf8), Array(":".utf8), Array(",".utf8), Array("\\u".utf8),
        Array("\\ud800".utf8), Array("\\udc00".utf8), Array("\\uZZZZ".utf8), Array("null".utf8), Array("/*".utf8),
        [0xEF, 0xBB, 0xBF], [0x20], [0x0A],
    ]

    /// A string from the corpus, or a generated one.
    public static func string(_ random: inout FuzzRandom) -> String {
        switch random.int(0..<10) {
        case 0..<5:
            return random.pick(strings)
        case 5:
            // Printable ASCII.
            return String(decoding: (0..<random.size(upTo: 80)).map { _ in UInt8(random.int(0x20...0x7E)) }, as: UTF8.self)
        case 6:
            // Any Unicode scalars, control characters and NUL included.
            var text = String.UnicodeScalarView()
            for _ in 0..<random.size(upTo: 40) {
                let value = random.weighted([(4, random.int(0...0x7F)), (3, random.int(0x80...0xFFFF)), (1, random.int(0x10000...0x10FFFF))])
                if let scalar = Unicode.Scalar(value) { text.append(scalar) }
            }
            return String(text)
        case 7:
            // Username-like: what passes the format rules, so deeper code runs.
            let alphabet = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_".unicodeScalars)
            return String(String.UnicodeScalarView((0..<random.int(2...9)).map { _ in random.pick(alphabet) }))
        case 8:
            return random.pick(strings) + random.pick(strings)
        default:
            // Long.
            return String(repeating: random.pick(["a", "가", "\u{0}", "🙂", "\\", "/"]), count: random.pick([64, 65, 1000, 70_000]))
        }
    }

    /// A number literal from the corpus, or a random integer.
    public static func number(_ random: inout FuzzRandom) -> String {
        switch random.int(0..<4) {
        case 0: String(Int64.random(in: .min ... .max, using: &random))
        case 1: String(random.int(-3...1_000))
        default: random.pick(numbers)
        }
    }

    /// Any valid JSON value, nested at most `depth` deep.
    public static func value(_ random: inout FuzzRandom, depth: Int = 2) -> FuzzJSON {
        let kinds: [FuzzJSON.Kind] = depth > 0
            ? [.null, .bool, .number, .string, .string, .array, .object]
            : [.null, .bool, .number, .string, .string]
        return value(of: random.pick(kinds), &random, depth: depth)
    }

    /// A valid JSON value of `kind` (`raw` gives a string).
    public static func value(of kind: FuzzJSON.Kind, _ random: inout FuzzRandom, depth: Int = 2) -> FuzzJSON {
        switch kind {
        case .null: return .null
        case .bool: return .bool(random.chance(0.5))
        case .number: return .number(number(&random))
        case .string, .raw: return .string(string(&random))
        case .array:
            return .array((0..<random.int(0...3)).map { _ in value(&random, depth: max(0, depth - 1)) })
        case .object:
            return .object((0..<random.int(0...3)).map { _ in
                FuzzJSON.Member(string(&random), value(&random, depth: max(0, depth - 1)))
            })
        }
    }

    /// A valid, non-null JSON value of another kind than `kind`.
    public static func value(notOf kind: FuzzJSON.Kind, _ random: inout FuzzRandom) -> FuzzJSON {
        let others = ([.bool, .number, .string, .array, .object] as [FuzzJSON.Kind]).filter { $0 != kind }
        return value(of: random.pick(others), &random, depth: 1)
    }

    /// `depth` nested arrays or objects, closed or left open (raw bytes, so no recursion).
    public static func nesting(depth: Int, objects: Bool, closed: Bool) -> FuzzJSON {
        var bytes: [UInt8] = []
        let open = objects ? Array(#"{"a":"#.utf8) : Array("[".utf8)
        bytes.reserveCapacity(depth * (open.count + 1) + 4)
        for _ in 0..<depth { bytes += open }
        if closed {
            bytes += Array("0".utf8)
            bytes += [UInt8](repeating: UInt8(ascii: objects ? "}" : "]"), count: depth)
        }
        return .raw(bytes)
    }

    /// A nesting depth around the parser's limits.
    public static func nestingDepth(_ random: inout FuzzRandom) -> Int {
        random.pick([1, 2, 100, 250, 400, 510, 511, 512, 513, 514, 600, 1_000, 10_000, 100_000])
    }

    /// A string literal of `prefix` and `suffix` (escaped as JSON) with `inner` between them as
    /// is (not escaped): usually invalid JSON.
    public static func rawString(_ prefix: String, _ inner: [UInt8], _ suffix: String) -> FuzzJSON {
        var head: [UInt8] = []
        FuzzJSON.writeString(prefix, to: &head)
        var tail: [UInt8] = []
        FuzzJSON.writeString(suffix, to: &tail)
        return .raw(head.dropLast() + inner + tail.dropFirst())
    }

    // MARK: Byte mutations

    /// One random change to `bytes`; returns what it did.
    @discardableResult
    public static func mutate(_ bytes: inout [UInt8], _ random: inout FuzzRandom) -> String {
        let position = bytes.isEmpty ? 0 : random.int(0...bytes.count)
        switch random.int(0..<8) {
        case 0 where !bytes.isEmpty:
            let index = random.int(0..<bytes.count)
            bytes[index] ^= UInt8(1) << UInt8(random.int(0..<8))
            return "flip a bit at \(index)"
        case 1 where !bytes.isEmpty:
            let index = random.int(0..<bytes.count)
            bytes[index] = UInt8(truncatingIfNeeded: random.next())
            return "set byte \(index)"
        case 2:
            let inserted = random.bytes(random.int(1...8))
            bytes.insert(contentsOf: inserted, at: position)
            return "insert \(inserted.count) random bytes at \(position)"
        case 3 where !bytes.isEmpty:
            let start = random.int(0..<bytes.count)
            let end = min(bytes.count, start + random.int(1...16))
            bytes.removeSubrange(start..<end)
            return "delete \(start)..<\(end)"
        case 4 where !bytes.isEmpty:
            let start = random.int(0..<bytes.count)
            let end = min(bytes.count, start + random.int(1...32))
            bytes.insert(contentsOf: bytes[start..<end], at: random.int(0...bytes.count))
            return "duplicate \(start)..<\(end)"
        case 5:
            let sequence = random.pick(invalidUTF8)
            bytes.insert(contentsOf: sequence, at: position)
            return "insert invalid UTF-8 at \(position)"
        case 6:
            let sequence = random.pick(syntaxBytes)
            bytes.insert(contentsOf: sequence, at: position)
            return "insert \(fuzzPreview(sequence)) at \(position)"
        default:
            let length = bytes.isEmpty ? 0 : random.int(0..<bytes.count)
            bytes.removeSubrange(length...)
            return "truncate to \(length)"
        }
    }

    // MARK: Attachments

    /// Magic numbers of the image kinds (and of kinds that are refused).
    public static let imageHeads: [[UInt8]] = [
        [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A],
        [0xFF, 0xD8, 0xFF],
        Array("RIFF".utf8) + [0, 0, 0, 0] + Array("WEBP".utf8),
        [0, 0, 0, 0x18] + Array("ftypheic".utf8) + [0, 0, 0, 0] + Array("mif1heic".utf8),
        [0, 0, 0, 0x18] + Array("ftypavif".utf8) + [0, 0, 0, 0] + Array("mif1avif".utf8),
        [0, 0, 0, 0x10] + Array("ftypmif1".utf8) + [0, 0, 0, 0],
        Array("GIF89a".utf8), Array("%PDF-1.7".utf8), [0x89, 0x50, 0x4E], [0xFF, 0xD8], Array("RIFF".utf8),
    ]

    /// A binary frame: empty, random, or an image head followed by random bytes.
    public static func attachment(_ random: inout FuzzRandom, maximum: Int = 4096) -> Data {
        switch random.int(0..<6) {
        case 0: return Data()
        case 1: return Data(random.bytes(random.size(upTo: maximum)))
        default: return Data(random.pick(imageHeads) + random.bytes(random.size(upTo: maximum)))
        }
    }
}
