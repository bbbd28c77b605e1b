import Foundation

/// UUID strings for ids made on the hot path, in the form `UUID().uuidString.lowercased()` gives
/// (8-4-4-4-12 lowercase hex digits), without its cost: Foundation's `UUID()` opens and reads
/// `/dev/urandom` for every id and formats it with `sprintf`. These take their random bits from
/// ``SecureRandom`` (the kernel's generator, read in blocks) and write the digits directly.
public enum Identifier {
    /// A random (version 4) UUID.
    public static func random() -> String {
        var (high, low) = SecureRandom.words()
        high = (high & ~0xF000) | 0x4000  // version 4
        low = (low & ~(0xC000_0000_0000_0000 as UInt64)) | 0x8000_0000_0000_0000  // RFC 9562 variant
        return format(high: high, low: low)
    }

    /// A time-ordered (version 7) UUID: the milliseconds since 1970 in the first 48 bits, then
    /// random bits. Ids made later sort later, so a table keyed by them grows at its end instead
    /// of dirtying a page anywhere in its index for each new row.
    public static func timeOrdered(now: Date = Date()) -> String {
        let milliseconds = UInt64(max(0, now.timeIntervalSince1970 * 1000)) & 0xFFFF_FFFF_FFFF
        let (random, bits) = SecureRandom.words()
        let high = (milliseconds << 16) | 0x7000 | (random & 0x0FFF)  // version 7
        var low = bits
        low = (low & ~(0xC000_0000_0000_0000 as UInt64)) | 0x8000_0000_0000_0000
        return format(high: high, low: low)
    }

    private static func format(high: UInt64, low: UInt64) -> String {
        let digits: StaticString = "0123456789abcdef"
        return String(unsafeUninitializedCapacity: 36) { buffer in
            var index = 0
            func put(_ value: UInt64, nibbles: Int) {
                for shift in stride(from: (nibbles - 1) * 4, through: 0, by: -4) {
                    buffer[index] = digits.utf8Start[Int((value >> UInt64(shift)) & 0xF)]
                    index += 1
                }
            }
            func dash() {
                buffer[index] = UInt8(ascii: "-")
                index += 1
            }
            put(high >> 32, nibbles: 8)
            dash()
            put(high >> 16, nibbles: 4)
            dash()
            put(high, nibbles: 4)
            dash()
            put(low >> 48, nibbles: 4)
            dash()
            put(low, nibbles: 12)
            return index
        }
    }
}
