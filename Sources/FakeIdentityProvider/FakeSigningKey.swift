import Crypto
import CryptoExtras
import Foundation
import JWTKit

/// One RSA signing key of the fake provider: its id, the private key (PEM, so a key file can
/// keep it), jwt-kit's signer, and the public half as a JWK.
///
/// Thread safety: an immutable value.
public struct FakeSigningKey: Sendable {
    public let id: String
    public let privateKeyPEM: String
    let signer: any JWTAlgorithm
    /// The public key as a JWK (`kty`, `kid`, `use`, `alg`, `n`, `e`).
    public let publicJWK: [String: String]
    /// The public key in PEM, the secret an `HS256` confusion attack would use.
    public let publicKeyPEM: String

    /// A new 2048-bit RSA key (takes a fraction of a second).
    public static func generate(id: String) async throws -> FakeSigningKey {
        let backing = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        return try await load(id: id, privateKeyPEM: backing.pemRepresentation)
    }

    /// A key from its PEM (as a key file keeps it).
    public static func load(id: String, privateKeyPEM: String) async throws -> FakeSigningKey {
        let key = try Insecure.RSA.PrivateKey(pem: privateKeyPEM)
        let collection = JWTKeyCollection()
        await collection.add(rsa: key, digestAlgorithm: .sha256, kid: JWKIdentifier(string: id))
        let signer = try await collection.getKey(for: JWKIdentifier(string: id))
        let primitives = try key.publicKey.getKeyPrimitives()
        return FakeSigningKey(
            id: id, privateKeyPEM: privateKeyPEM, signer: signer,
            publicJWK: [
                "kty": "RSA", "kid": id, "use": "sig", "alg": "RS256",
                "n": FakeJWT.base64URL(primitives.modulus), "e": FakeJWT.base64URL(primitives.publicExponent),
            ],
            publicKeyPEM: key.publicKey.pemRepresentation)
    }

    /// RS256 signature of `input`.
    func sign(_ input: [UInt8]) throws -> [UInt8] { try signer.sign(input) }
}

/// Building JWTs by hand, so tests can also make the broken ones a real provider never would.
public enum FakeJWT {
    public static func base64URL(_ bytes: some Sequence<UInt8>) -> String {
        Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// `base64url(header).base64url(payload)`, the part a signature covers.
    public static func signingInput(header: [String: Any], payload: [String: Any]) throws -> String {
        let headerJSON = try JSONSerialization.data(withJSONObject: header, options: [.sortedKeys])
        let payloadJSON = try JSONSerialization.data(withJSONObject: payload, options: [.sortedKeys])
        return base64URL(headerJSON) + "." + base64URL(payloadJSON)
    }

    /// An RS256 token signed with `key`, its header naming `kid` (default: the key's id) and
    /// `alg` (default `RS256`).
    public static func sign(
        payload: [String: Any], with key: FakeSigningKey, kid: String? = nil, alg: String = "RS256"
    ) throws -> String {
        let input = try signingInput(header: ["alg": alg, "kid": kid ?? key.id, "typ": "JWT"], payload: payload)
        return input + "." + base64URL(try key.sign(Array(input.utf8)))
    }

    /// The `alg: none` attack: no signature at all.
    public static func unsigned(payload: [String: Any], kid: String) throws -> String {
        try signingInput(header: ["alg": "none", "kid": kid, "typ": "JWT"], payload: payload) + "."
    }

    /// The algorithm-confusion attack: `HS256` keyed with the provider's *public* key (PEM), which
    /// a verifier that trusts the header's `alg` would accept.
    public static func hs256Confusion(payload: [String: Any], key: FakeSigningKey) throws -> String {
        let input = try signingInput(header: ["alg": "HS256", "kid": key.id, "typ": "JWT"], payload: payload)
        let mac = HMAC<SHA256>.authenticationCode(
            for: Data(input.utf8), using: SymmetricKey(data: Data(key.publicKeyPEM.utf8)))
        return input + "." + base64URL(Data(mac))
    }
}

enum SHA256Hex {
    static func of(_ text: String) -> String {
        SHA256.hash(data: Data(text.utf8)).map { byte in
            let hex = String(byte, radix: 16)
            return byte < 16 ? "0" + hex : hex
        }.joined()
    }
}

extension FakeJWT {
    /// The RS256 signature of `input` by `key`, for tokens with a header made by hand.
    public static func rawSignature(_ input: [UInt8], with key: FakeSigningKey) throws -> [UInt8] { try key.sign(input) }
}
