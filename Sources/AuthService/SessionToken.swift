import Crypto
import Foundation
import GRDB
import Messaging

/// Session tokens: `<session id>.<secret>`. The id is the session's row in the store (a number
/// that grows with each session: new sessions go to the end of the table, instead of a random
/// page of an index per sign-in); the secret is 32 bytes from the kernel's cryptographically
/// secure generator (through ``SecureRandom``), base64url without padding.
///
/// The store keeps only the SHA-256 of each secret, so a copy of the database does not hand out
/// live sessions. The id is not secret: it finds the row, and the secret must match it.
///
/// Tokens made before session ids (a bare secret, no `.`) are found by the digest of the whole
/// token (``SessionKey/legacy(digest:)``) and keep working until they end.
package enum SessionToken {
    static let byteCount = 32

    /// A new secret, to be stored as its ``digest(_:)``.
    package static func makeSecret() -> String {
        base64URL(SecureRandom.bytes(count: byteCount))
    }

    /// The token of session `id` with `secret`.
    package static func token(id: Int64, secret: String) -> String {
        "\(id).\(secret)"
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
    package static func digest(_ token: String) -> String {
        // Hashed where the string's bytes are: no copy into a `Data` on the hot path.
        var token = token
        let hash = token.withUTF8 { SHA256.hash(data: UnsafeRawBufferPointer($0)) }
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

/// How a presented session token is found in the store, and the digest that identifies it in
/// `endedSession` (the digest of its secret: a row can name it without the token).
package enum SessionKey: Sendable, Hashable {
    /// `<id>.<secret>`: the row `id`, whose `token` column must equal `digest`.
    case session(id: Int64, digest: String)
    /// A token made before session ids: the row whose `legacyToken` is `digest`.
    case legacy(digest: String)

    package init(token: String) {
        if let dot = token.utf8.firstIndex(of: UInt8(ascii: ".")),
            let id = Int64(token[..<dot]), id > 0
        {
            self = .session(id: id, digest: SessionToken.digest(String(token[token.index(after: dot)...])))
        } else {
            self = .legacy(digest: SessionToken.digest(token))
        }
    }

    package var digest: String {
        switch self {
        case .session(_, let digest), .legacy(let digest): digest
        }
    }

    /// The SQL condition that picks the session's row, and its arguments.
    var condition: (sql: String, arguments: StatementArguments) {
        switch self {
        case .session(let id, let digest): ("id = ? AND token = ?", [id, digest])
        case .legacy(let digest): ("legacyToken = ?", [digest])
        }
    }
}
