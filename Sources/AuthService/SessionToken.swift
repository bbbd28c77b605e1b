import Crypto
import Foundation

/// Session tokens: 32 bytes from the system's secure random source, base64url without padding.
///
/// The store keeps only each token's SHA-256 digest, so a copy of the database does not hand
/// out live sessions.
enum SessionToken {
    static let byteCount = 32

    static func make() -> String {
        var generator = SystemRandomNumberGenerator()
        var bytes: [UInt8] = []
        bytes.reserveCapacity(byteCount)
        for _ in 0..<(byteCount / 8) {
            withUnsafeBytes(of: generator.next() as UInt64) { bytes.append(contentsOf: $0) }
        }
        return Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
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
