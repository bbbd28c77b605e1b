import Crypto
import Foundation

/// Session tokens: 32 bytes from a cryptographically secure generator (BoringSSL's, through
/// swift-crypto), base64url without padding.
///
/// The store keeps only each token's SHA-256 digest, so a copy of the database does not hand
/// out live sessions.
enum SessionToken {
    static let byteCount = 32

    static func make() -> String {
        // BoringSSL's generator (seeded from the system, then no system call per token).
        let bytes = SymmetricKey(size: SymmetricKeySize(bitCount: byteCount * 8)).withUnsafeBytes { Array($0) }
        return base64URL(bytes)
    }

    /// `bytes` in base64url (RFC 4648 §5) without padding.
    static func base64URL(_ bytes: [UInt8]) -> String {
        let alphabet: StaticString = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        let table = alphabet.utf8Start
        let count = (bytes.count * 8 + 5) / 6
        return String(unsafeUninitializedCapacity: count) { output in
            var written = 0
            var index = 0
            while index < bytes.count {
                let chunk = min(3, bytes.count - index)
                var group = UInt32(bytes[index]) << 16
                if chunk > 1 { group |= UInt32(bytes[index + 1]) << 8 }
                if chunk > 2 { group |= UInt32(bytes[index + 2]) }
                for digit in 0...chunk {
                    output[written] = table[Int((group >> (18 - 6 * UInt32(digit))) & 0x3F)]
                    written += 1
                }
                index += 3
            }
            return written
        }
    }

    /// What the store keeps of `token`: its SHA-256, in lowercase hex.
    static func digest(_ token: String) -> String {
        let hash = SHA256.hash(data: Data(token.utf8))
        let digits: StaticString = "0123456789abcdef"
        return String(unsafeUninitializedCapacity: SHA256.byteCount * 2) { buffer in
            var index = 0
            hash.withUnsafeBytes { bytes in
                for byte in bytes {
                    buffer[index] = digits.utf8Start[Int(byte >> 4)]
                    buffer[index + 1] = digits.utf8Start[Int(byte & 0x0F)]
                    index += 2
                }
            }
            return index
        }
    }
}
