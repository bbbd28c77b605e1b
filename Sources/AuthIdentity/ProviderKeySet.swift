import Foundation
import JWTKit

/// One verification key a provider publishes, ready to check signatures synchronously.
public struct ProviderKey: Sendable {
    /// The key's id (`kid`), which a token's header names.
    public var id: String
    /// The one algorithm this key verifies (`RS256`): the JWK's `alg`, or `RS256` for an RSA key
    /// that names none. A token whose header says anything else is refused.
    public var algorithmName: String
    /// jwt-kit's verifier for this key and algorithm.
    public var algorithm: any JWTAlgorithm
}

/// A provider's JSON Web Key Set, parsed once when fetched: each key by its id, with the one
/// algorithm it may be used with.
///
/// Thread safety: an immutable value; share it freely.
public struct ProviderKeySet: Sendable {
    public var keys: [String: ProviderKey]

    public init(keys: [String: ProviderKey] = [:]) { self.keys = keys }

    public subscript(id: String) -> ProviderKey? { keys[id] }

    /// The algorithms a key set may pin a key to: asymmetric ones only (never `none` or `HS*`).
    static let allowedAlgorithms: Set<String> = [
        "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
    ]

    /// Parses a JWKS document (`{"keys": [...]}`) with jwt-kit.
    ///
    /// Keys without a `kid`, with a `use` other than `sig`, of a type or algorithm that cannot
    /// sign ID tokens (symmetric keys, `none`), or that do not parse are left out; a document
    /// that is not a key set at all throws.
    ///
    /// - Throws: ``KeySetError`` when the document is not a JWKS.
    public static func parse(_ json: Data) async throws -> ProviderKeySet {
        let document: Document
        do {
            document = try JSONDecoder().decode(Document.self, from: json)
        } catch {
            throw KeySetError("the key set is not a JSON Web Key Set (\(error))")
        }
        let collection = JWTKeyCollection()
        var keys: [String: ProviderKey] = [:]
        for entry in document.keys {
            guard let jwk = entry.jwk, let kid = jwk.keyIdentifier?.string, entry.use == nil || entry.use == "sig" else {
                continue
            }
            let pinned: String
            if let named = jwk.algorithm?.rawValue {
                pinned = named
            } else if jwk.keyType == .rsa {
                pinned = "RS256"
            } else {
                continue
            }
            guard allowedAlgorithms.contains(pinned) else { continue }
            do {
                try await collection.add(jwk: jwk)
                let algorithm = try await collection.getKey(for: JWKIdentifier(string: kid), alg: pinned)
                guard algorithm.name == pinned else { continue }
                keys[kid] = ProviderKey(id: kid, algorithmName: pinned, algorithm: algorithm)
            } catch {
                continue
            }
        }
        return ProviderKeySet(keys: keys)
    }

    private struct Document: Decodable {
        var keys: [Entry]
    }

    /// One key of the set; one that jwt-kit cannot read is kept as `nil` and skipped.
    private struct Entry: Decodable {
        var jwk: JWK?
        var use: String?

        private enum CodingKeys: String, CodingKey { case use }

        init(from decoder: any Decoder) throws {
            jwk = try? JWK(from: decoder)
            use = try? decoder.container(keyedBy: CodingKeys.self).decodeIfPresent(String.self, forKey: .use)
        }
    }
}

/// A key set could not be fetched or read.
public struct KeySetError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}
