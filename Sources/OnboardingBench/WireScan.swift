/// Reading just the few fields the load generator needs from received envelopes, in place,
/// without a JSON parser: the services' envelopes are flat JSON with string values that need no
/// unescaping (uids, tokens, enum names, error codes).
enum WireScan {
    /// The bytes of the string value of the first `"key": "value"` pair in `bytes` (whitespace
    /// around the colon allowed), or `nil`. A key spelled inside another string is skipped
    /// because it is not followed by a colon.
    static func stringValue(_ key: String, in bytes: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer? {
        var quoted = [UInt8(ascii: "\"")]
        quoted += key.utf8
        quoted.append(UInt8(ascii: "\""))
        return stringValue(quotedKey: quoted, in: bytes)
    }

    static func stringValue(quotedKey: [UInt8], in bytes: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer? {
        let count = bytes.count
        let keyCount = quotedKey.count
        guard keyCount > 0, count > keyCount else { return nil }
        var start = 0
        while start + keyCount <= count {
            guard let found = firstIndex(of: quotedKey, in: bytes, from: start) else { return nil }
            var index = found + keyCount
            index = skipSpace(bytes, index)
            if index < count, bytes[index] == UInt8(ascii: ":") {
                index = skipSpace(bytes, index + 1)
                guard index < count, bytes[index] == UInt8(ascii: "\"") else { return nil }
                let valueStart = index + 1
                var end = valueStart
                while end < count, bytes[end] != UInt8(ascii: "\"") {
                    end += bytes[end] == UInt8(ascii: "\\") ? 2 : 1
                }
                guard end < count else { return nil }
                return UnsafeRawBufferPointer(rebasing: bytes[valueStart..<end])
            }
            start = found + 1
        }
        return nil
    }

    private static func skipSpace(_ bytes: UnsafeRawBufferPointer, _ index: Int) -> Int {
        var index = index
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return index
            }
        }
        return index
    }

    private static func firstIndex(of needle: [UInt8], in bytes: UnsafeRawBufferPointer, from start: Int) -> Int? {
        let first = needle[0]
        let last = bytes.count - needle.count
        var index = start
        while index <= last {
            if bytes[index] == first {
                var match = true
                for offset in 1..<needle.count where bytes[index + offset] != needle[offset] {
                    match = false
                    break
                }
                if match { return index }
            }
            index += 1
        }
        return nil
    }

    static func equals(_ bytes: UnsafeRawBufferPointer, _ text: String) -> Bool {
        bytes.elementsEqual(text.utf8)
    }
}

/// A uid (a UUID) as two integers: cheap to hash and to store per request.
struct UUIDKey: Hashable, Sendable, CustomStringConvertible {
    var high: UInt64
    var low: UInt64

    static let none = UUIDKey(high: 0, low: 0)

    /// Parses 32 hex digits, dashes anywhere ignored (`3f2b8c1e-6d4a-…`); `nil` otherwise.
    init?(parsing text: UnsafeRawBufferPointer) {
        var high: UInt64 = 0
        var low: UInt64 = 0
        var digits = 0
        for byte in text {
            if byte == UInt8(ascii: "-") { continue }
            let value: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): value = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): value = byte - UInt8(ascii: "A") + 10
            default: return nil
            }
            if digits < 16 { high = high << 4 | UInt64(value) } else { low = low << 4 | UInt64(value) }
            digits += 1
            if digits > 32 { return nil }
        }
        guard digits == 32 else { return nil }
        self.init(high: high, low: low)
    }

    init?(_ text: String) {
        let bytes = Array(text.utf8)
        guard let key = bytes.withUnsafeBytes({ UUIDKey(parsing: $0) }) else { return nil }
        self = key
    }

    init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    var description: String {
        let hex = String(high, radix: 16).leftPadded(to: 16) + String(low, radix: 16).leftPadded(to: 16)
        let characters = Array(hex)
        return String(characters[0..<8]) + "-" + String(characters[8..<12]) + "-" + String(characters[12..<16]) + "-"
            + String(characters[16..<20]) + "-" + String(characters[20..<32])
    }
}

extension String {
    func leftPadded(to width: Int, with pad: Character = "0") -> String {
        count >= width ? self : String(repeating: pad, count: width - count) + self
    }
}

/// What a route intent says, as far as the benchmark cares: which intent, for which reason.
enum ObservedIntent: UInt8, Sendable, CaseIterable, Codable {
    case presentProfileSetupSignedIn
    case presentProfileSetupCheckRequested
    case dismissProfileCreated
    case other

    init(intent: UnsafeRawBufferPointer?, reason: UnsafeRawBufferPointer?) {
        guard let intent, let reason else {
            self = .other
            return
        }
        if WireScan.equals(intent, "presentProfileSetup") {
            if WireScan.equals(reason, "signedIn") {
                self = .presentProfileSetupSignedIn
            } else if WireScan.equals(reason, "checkRequested") {
                self = .presentProfileSetupCheckRequested
            } else {
                self = .other
            }
        } else if WireScan.equals(intent, "dismiss"), WireScan.equals(reason, "profileCreated") {
            self = .dismissProfileCreated
        } else {
            self = .other
        }
    }

    var label: String {
        switch self {
        case .presentProfileSetupSignedIn: "presentProfileSetup (signedIn)"
        case .presentProfileSetupCheckRequested: "presentProfileSetup (after a check)"
        case .dismissProfileCreated: "dismiss (profileCreated)"
        case .other: "another intent"
        }
    }
}
