import Crypto
import Foundation
import JWTKit
import Messaging
import OnboardingAPI

/// The claims of a verified ID token that auth uses.
public struct VerifiedIDToken: Sendable, Hashable {
    /// The provider's stable id for the account (`sub`).
    public var subject: String
    public var issuer: String
    /// The configured client id the token was issued to.
    public var audience: String
    public var expiresAt: Date
}

/// Checks an OpenID Connect ID token against a provider's key set and rules, with no I/O:
/// a pure decision, tested case by case without sockets.
///
/// In order: three base64url parts; a JSON header whose `kid` names a key of the set (read here,
/// because jwt-kit would fall back to a default key for an unknown `kid`) and whose `alg` is the
/// one that key is pinned to (so `none` and `HS256` are refused before any key is used); the
/// signature, by jwt-kit's verifier of that key; then the payload: every claim OpenID Connect
/// requires present (`iss`, `sub`, `aud`, `exp`, `iat`; one missing, an empty `sub` or an empty
/// `aud` list is ``IdentityRefusal/malformedToken``), `iss` one of the issuers, `aud` (a string or
/// a list) naming only configured client ids, `exp` not passed and `iat`/`nbf` not in the future
/// (each with ``leeway``), and `nonce` when the app sent one.
///
/// Thread safety: an immutable value; ``check(_:nonce:keys:now:)`` is synchronous and cheap (one
/// RSA verification), safe on any thread.
public struct IDTokenChecker: Sendable {
    public var provider: Provider
    public var issuers: Set<String>
    public var audiences: Set<String>
    public var leeway: TimeInterval
    /// The token carries SHA-256(hex) of the app's nonce (Apple), not the nonce itself.
    public var nonceIsHashed: Bool

    public init(provider: Provider, issuers: Set<String>, audiences: Set<String>, leeway: TimeInterval, nonceIsHashed: Bool) {
        self.provider = provider
        self.issuers = issuers
        self.audiences = audiences
        self.leeway = leeway
        self.nonceIsHashed = nonceIsHashed
    }

    public init(provider: Provider, settings: OIDCProviderSettings, leeway: TimeInterval) {
        self.init(
            provider: provider, issuers: Set(settings.issuers), audiences: Set(settings.clientIDs), leeway: leeway,
            nonceIsHashed: settings.nonceIsHashed)
    }

    /// What is wrong with a token.
    public struct Problem: Error, Sendable, Hashable {
        public var refusal: IdentityRefusal
        public var detail: String
        /// For ``IdentityRefusal/unknownKey``: the `kid` the token names (`nil`: none).
        public var keyID: String?

        /// The `unauthenticated` error to answer with.
        public func serviceError(_ provider: Provider) -> ServiceError {
            .signInRefused(refusal, provider, detail)
        }
    }

    /// The token's header `kid`, or `nil` when it is not a JWT or names none. Cheap: decodes the
    /// header only.
    public static func keyID(of token: String) -> String? {
        guard let first = token.split(separator: ".", omittingEmptySubsequences: false).first,
            let data = Base64URL.decode(first),
            let header = try? JSONDecoder().decode(Header.self, from: Data(data))
        else { return nil }
        return header.kid
    }

    /// Checks `token`; `nonce` is the one the app sent (`nil`: not checked).
    ///
    /// - Returns: the verified claims, or the ``Problem``. An unknown key is
    ///   ``IdentityRefusal/unknownKey``: the caller may fetch the key set again and retry.
    public func check(_ token: String, nonce: String?, keys: ProviderKeySet, now: Date) -> Result<VerifiedIDToken, Problem> {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else {
            return .failure(problem(.malformedToken, "the ID token is not a JWT (it has \(parts.count) parts, not 3)"))
        }
        guard let headerData = Base64URL.decode(parts[0]),
            let header = try? JSONDecoder().decode(Header.self, from: Data(headerData))
        else { return .failure(problem(.malformedToken, "the ID token's header is not base64url JSON")) }
        // RFC 7515 4.1.11: a critical extension we do not understand makes the token invalid.
        guard header.crit?.isEmpty ?? true else {
            return .failure(problem(.malformedToken, "the ID token's header has critical extensions \(header.crit ?? [])"))
        }
        guard let kid = header.kid, !kid.isEmpty else {
            return .failure(problem(.unknownKey, "the ID token's header names no key (kid)"))
        }
        guard let key = keys[kid] else {
            var unknown = problem(.unknownKey, "the ID token is signed with key \"\(kid)\", which \(provider.rawValue) does not publish")
            unknown.keyID = kid
            return .failure(unknown)
        }
        guard header.alg == key.algorithmName else {
            return .failure(
                problem(
                    .algorithmNotAllowed,
                    "the ID token says alg \"\(header.alg ?? "(none)")\" but key \"\(kid)\" is for \(key.algorithmName) only"))
        }
        guard let signature = Base64URL.decode(parts[2]), !signature.isEmpty else {
            return .failure(problem(.malformedToken, "the ID token's signature is not base64url"))
        }
        let signingInput = Array(token.utf8.prefix(parts[0].utf8.count + 1 + parts[1].utf8.count))
        let valid = (try? key.algorithm.verify(signature, signs: signingInput)) ?? false
        guard valid else { return .failure(problem(.badSignature, "the ID token's signature does not verify with key \"\(kid)\"")) }

        guard let payloadData = Base64URL.decode(parts[1]),
            let claims = try? JSONDecoder().decode(Claims.self, from: Data(payloadData))
        else {
            return .failure(
                problem(.malformedToken, "the ID token's payload is not JSON with string iss, sub, aud and numeric exp, iat"))
        }
        // OpenID Connect Core 2: iss, sub, aud, exp and iat are required. A token without one is
        // malformed, whatever its other claims say (not "wrong issuer" for an absent iss).
        guard let issuer = claims.iss, let subject = claims.sub, !subject.isEmpty, let named = claims.aud?.value,
            let audience = named.first, let exp = claims.exp, let iat = claims.iat
        else {
            return .failure(problem(.malformedToken, "the ID token has no \(claims.missing.joined(separator: ", ")), which every ID token must carry"))
        }
        guard issuers.contains(issuer) else {
            return .failure(
                problem(.wrongIssuer, "the ID token's issuer is \"\(issuer)\", not \(issuers.sorted().joined(separator: " or "))"))
        }
        // OpenID Connect Core 3.1.3.7: the token names one of our client ids, and no audience
        // we do not trust.
        guard named.allSatisfy(audiences.contains) else {
            return .failure(problem(.wrongAudience, "the ID token was issued to \(named), not only to this app's client ids"))
        }
        let expiresAt = Date(timeIntervalSince1970: exp)
        guard now.timeIntervalSince(expiresAt) < leeway else {
            return .failure(problem(.tokenExpired, "the ID token expired at \(Timestamp.format(expiresAt))"))
        }
        for (name, value) in [("iat", iat), ("nbf", claims.nbf)] {
            guard let value else { continue }
            let when = Date(timeIntervalSince1970: value)
            guard when.timeIntervalSince(now) <= leeway else {
                return .failure(problem(.tokenNotYetValid, "the ID token's \(name) is \(Timestamp.format(when)), in the future"))
            }
        }
        if let nonce {
            let expected = nonceIsHashed ? Self.sha256Hex(nonce) : nonce
            guard claims.nonce == expected else {
                return .failure(problem(.nonceMismatch, "the ID token's nonce is not the one this sign-in sent"))
            }
        }
        return .success(VerifiedIDToken(subject: subject, issuer: issuer, audience: audience, expiresAt: expiresAt))
    }

    private func problem(_ refusal: IdentityRefusal, _ detail: String) -> Problem {
        Problem(refusal: refusal, detail: detail, keyID: nil)
    }

    /// SHA-256 of the UTF-8 bytes, lowercase hex (what Apple puts in `nonce`).
    public static func sha256Hex(_ text: String) -> String {
        let hex = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(64)
        for byte in SHA256.hash(data: Data(text.utf8)) {
            out.append(hex[Int(byte >> 4)])
            out.append(hex[Int(byte & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    private struct Header: Decodable {
        var alg: String?
        var kid: String?
        var crit: [String]?
    }

    private struct Claims: Decodable {
        var iss: String?
        var sub: String?
        var aud: AudienceClaim?
        var exp: Double?
        var iat: Double?
        var nbf: Double?
        var nonce: String?

        /// The required claims that are absent (an empty `sub` or `aud` list counts as absent).
        var missing: [String] {
            [("iss", iss == nil), ("sub", sub?.isEmpty ?? true), ("aud", aud?.value.isEmpty ?? true),
             ("exp", exp == nil), ("iat", iat == nil)].filter(\.1).map(\.0)
        }
    }
}

/// Base64url without padding (RFC 7515), as JWTs use it.
enum Base64URL {
    static func decode(_ text: Substring) -> [UInt8]? {
        var base64 = String(text).replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        guard !base64.contains("=") else { return nil }
        switch base64.utf8.count % 4 {
        case 2: base64 += "=="
        case 3: base64 += "="
        case 1: return nil
        default: break
        }
        guard let data = Data(base64Encoded: base64) else { return nil }
        return [UInt8](data)
    }

    static func decode(_ text: String) -> [UInt8]? { decode(Substring(text)) }
}
