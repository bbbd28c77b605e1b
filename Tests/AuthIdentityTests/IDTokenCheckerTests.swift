@testable import AuthIdentity
import FakeIdentityProvider
import Foundation
import OnboardingAPI
import Testing

/// The ID-token decision on its own: keys made by the test, tokens built by hand, no sockets.
@Suite("ID token checks")
struct IDTokenCheckerTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)

    /// The keys, made once for every test in the process (making RSA keys takes a moment).
    struct Fixtures: Sendable {
        var key: FakeSigningKey
        /// Another key with the same id: what a forger would have.
        var otherKey: FakeSigningKey
        var keys: ProviderKeySet
    }
    static let fixtures = Task {
        let key = try await FakeSigningKey.generate(id: "k1")
        return Fixtures(
            key: key, otherKey: try await FakeSigningKey.generate(id: "k1"),
            keys: try await ProviderKeySet.parse(try JSONSerialization.data(withJSONObject: ["keys": [key.publicJWK]])))
    }

    func checker(_ provider: Provider = .google, audiences: Set<String> = ["app-ios", "app-android"]) -> IDTokenChecker {
        let settings = IdentityProviderSettings()
        var oidc = settings.oidc(provider)!
        oidc.clientIDs = Array(audiences)
        return IDTokenChecker(provider: provider, settings: oidc, leeway: 60)
    }

    func claims(
        _ provider: Provider = .google, audience: String = "app-ios", issuedAt: Date = now, lifetime: TimeInterval = 600,
        nonce: String? = nil, issuer: String? = nil
    ) -> [String: Any] {
        FakeIdentityProvider.claims(
            provider, subject: "110169484474386276334", audience: audience, nonce: nonce, issuedAt: issuedAt,
            lifetime: lifetime, issuer: issuer)
    }

    func refusal(
        _ token: String, _ checker: IDTokenChecker? = nil, nonce: String? = nil, at now: Date = now, keys: ProviderKeySet
    ) -> IdentityRefusal? {
        switch (checker ?? self.checker()).check(token, nonce: nonce, keys: keys, now: now) {
        case .success: nil
        case .failure(let problem): problem.refusal
        }
    }

    @Test("a good token gives its subject")
    func valid() async throws {
        let f = try await Self.fixtures.value
        let token = try FakeJWT.sign(payload: claims(), with: f.key)
        let verified = try checker().check(token, nonce: nil, keys: f.keys, now: Self.now).get()
        #expect(verified.subject == "110169484474386276334")
        #expect(verified.audience == "app-ios")
    }

    @Test("Google's two issuer spellings are both accepted; anything else is wrongIssuer")
    func issuers() async throws {
        let f = try await Self.fixtures.value
        for issuer in ["https://accounts.google.com", "accounts.google.com"] {
            #expect(refusal(try FakeJWT.sign(payload: claims(issuer: issuer), with: f.key), keys: f.keys) == nil)
        }
        for issuer in ["https://accounts.google.com/", "https://evil.example", "https://appleid.apple.com"] {
            #expect(refusal(try FakeJWT.sign(payload: claims(issuer: issuer), with: f.key), keys: f.keys) == .wrongIssuer)
        }
        let kakao = try FakeJWT.sign(payload: claims(.kakao), with: f.key)
        #expect(refusal(kakao, checker(.kakao), keys: f.keys) == nil)
        #expect(refusal(kakao, keys: f.keys) == .wrongIssuer)
    }

    @Test("the audience must be our client ids only: a list of ours is accepted, one with a stranger's is not")
    func audience() async throws {
        let f = try await Self.fixtures.value
        #expect(refusal(try FakeJWT.sign(payload: claims(audience: "app-android"), with: f.key), keys: f.keys) == nil)
        #expect(refusal(try FakeJWT.sign(payload: claims(audience: "someone-elses-app"), with: f.key), keys: f.keys) == .wrongAudience)
        var listed = claims()
        listed["aud"] = ["app-android", "app-ios"]
        #expect(refusal(try FakeJWT.sign(payload: listed, with: f.key), keys: f.keys) == nil)
        listed["aud"] = ["other", "app-ios"]
        #expect(refusal(try FakeJWT.sign(payload: listed, with: f.key), keys: f.keys) == .wrongAudience)
        listed["aud"] = [String]()
        #expect(refusal(try FakeJWT.sign(payload: listed, with: f.key), keys: f.keys) == .malformedToken, "a list naming nobody")
    }

    @Test(
        "a token without a claim every ID token carries is malformedToken, not wrongIssuer or wrongAudience",
        arguments: ["iss", "aud", "sub", "exp", "iat"])
    func missingClaim(claim: String) async throws {
        let f = try await Self.fixtures.value
        var payload = claims()
        payload[claim] = nil
        let problem = try #require(
            checker().check(try FakeJWT.sign(payload: payload, with: f.key), nonce: nil, keys: f.keys, now: Self.now).failure)
        #expect(problem.refusal == .malformedToken)
        #expect(problem.detail.contains("has no \(claim)"), "\(problem.detail)")
        // Missing as well as wrong: still malformed (what is absent is said first).
        payload["iss"] = "https://evil.example"
        payload["aud"] = "someone-elses-app"
        payload[claim] = nil
        #expect(refusal(try FakeJWT.sign(payload: payload, with: f.key), keys: f.keys) == .malformedToken)
    }

    @Test("exp and iat are judged with the leeway")
    func times() async throws {
        let f = try await Self.fixtures.value
        let expired = try FakeJWT.sign(payload: claims(issuedAt: Self.now.addingTimeInterval(-700), lifetime: 600), with: f.key)
        #expect(refusal(expired, keys: f.keys) == .tokenExpired)
        let justExpired = try FakeJWT.sign(payload: claims(issuedAt: Self.now.addingTimeInterval(-630), lifetime: 600), with: f.key)
        #expect(refusal(justExpired, keys: f.keys) == nil, "30 s past exp is within the 60 s leeway")
        let future = try FakeJWT.sign(payload: claims(issuedAt: Self.now.addingTimeInterval(300)), with: f.key)
        #expect(refusal(future, keys: f.keys) == .tokenNotYetValid)
        let slightlyAhead = try FakeJWT.sign(payload: claims(issuedAt: Self.now.addingTimeInterval(30)), with: f.key)
        #expect(refusal(slightlyAhead, keys: f.keys) == nil)
        var notBefore = claims()
        notBefore["nbf"] = Int(Self.now.timeIntervalSince1970) + 3600
        #expect(refusal(try FakeJWT.sign(payload: notBefore, with: f.key), keys: f.keys) == .tokenNotYetValid)
    }

    @Test("a signature by another key, or a changed payload, is badSignature")
    func badSignature() async throws {
        let f = try await Self.fixtures.value
        #expect(refusal(try FakeJWT.sign(payload: claims(), with: f.otherKey), keys: f.keys) == .badSignature)
        let token = try FakeJWT.sign(payload: claims(), with: f.key)
        var parts = token.split(separator: ".").map(String.init)
        parts[1] = FakeJWT.base64URL(try JSONSerialization.data(withJSONObject: claims(audience: "app-android")))
        #expect(refusal(parts.joined(separator: "."), keys: f.keys) == .badSignature)
    }

    @Test("alg none and HS256 keyed with the public key are refused before any key is used")
    func algorithmConfusion() async throws {
        let f = try await Self.fixtures.value
        #expect(refusal(try FakeJWT.unsigned(payload: claims(), kid: "k1"), keys: f.keys) == .algorithmNotAllowed)
        #expect(refusal(try FakeJWT.hs256Confusion(payload: claims(), key: f.key), keys: f.keys) == .algorithmNotAllowed)
        #expect(refusal(try FakeJWT.sign(payload: claims(), with: f.key, alg: "RS512"), keys: f.keys) == .algorithmNotAllowed)
    }

    @Test("a kid the set lacks is unknownKey and says which; no kid at all too")
    func unknownKey() async throws {
        let f = try await Self.fixtures.value
        let token = try FakeJWT.sign(payload: claims(), with: f.key, kid: "rotated-2")
        let problem = try #require(checker().check(token, nonce: nil, keys: f.keys, now: Self.now).failure)
        #expect(problem.refusal == .unknownKey)
        #expect(problem.keyID == "rotated-2")
        #expect(refusal(token, keys: f.keys) == .unknownKey)
        let input = try FakeJWT.signingInput(header: ["alg": "RS256"], payload: claims())
        #expect(refusal(input + "." + FakeJWT.base64URL(try FakeJWT.rawSignature(Array(input.utf8), with: f.key)), keys: f.keys) == .unknownKey)
    }

    @Test("the nonce is checked when the app sends one; Apple's is its SHA-256")
    func nonce() async throws {
        let f = try await Self.fixtures.value
        let google = try FakeJWT.sign(payload: claims(nonce: "n-0S6_WzA2Mj"), with: f.key)
        #expect(refusal(google, nonce: "n-0S6_WzA2Mj", keys: f.keys) == nil)
        #expect(refusal(google, nonce: "another", keys: f.keys) == .nonceMismatch)
        #expect(refusal(google, keys: f.keys) == nil, "no nonce sent: not checked")
        #expect(refusal(try FakeJWT.sign(payload: claims(), with: f.key), nonce: "n-0S6_WzA2Mj", keys: f.keys) == .nonceMismatch)

        let apple = try FakeJWT.sign(payload: claims(.apple, nonce: "raw-nonce"), with: f.key)
        #expect(refusal(apple, checker(.apple), nonce: "raw-nonce", keys: f.keys) == nil)
        #expect(refusal(apple, checker(.apple), nonce: FakeJWT.sha256Hex("raw-nonce"), keys: f.keys) == .nonceMismatch)
        #expect(IDTokenChecker.sha256Hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }

    @Test("a header with critical extensions is refused")
    func criticalHeader() async throws {
        let f = try await Self.fixtures.value
        let input = try FakeJWT.signingInput(header: ["alg": "RS256", "kid": "k1", "crit": ["exp"], "exp": 1], payload: claims())
        let token = input + "." + FakeJWT.base64URL(try FakeJWT.rawSignature(Array(input.utf8), with: f.key))
        #expect(refusal(token, keys: f.keys) == .malformedToken)
    }

    @Test("what is not a JWT is malformedToken", arguments: ["", "abc", "a.b", "a.b.c.d", "!!.??.**", "e30.e30.e30"])
    func malformed(_ token: String) async throws {
        let f = try await Self.fixtures.value
        #expect([.malformedToken, .unknownKey].contains(refusal(token, keys: f.keys)))
    }

    @Test("a key set keeps signing keys only, each pinned to its algorithm")
    func keySetParsing() async throws {
        let f = try await Self.fixtures.value
        var noAlg = f.key.publicJWK
        noAlg["alg"] = nil
        noAlg["kid"] = "no-alg"
        var encryption = f.key.publicJWK
        encryption["use"] = "enc"
        encryption["kid"] = "enc"
        let json = try JSONSerialization.data(withJSONObject: [
            "keys": [
                f.key.publicJWK, noAlg, encryption,
                ["kty": "oct", "kid": "hmac", "k": "c2VjcmV0", "alg": "HS256"],
                ["kty": "RSA", "kid": "broken", "n": "!!", "e": "AQAB"],
                ["kty": "RSA", "alg": "RS256", "n": f.key.publicJWK["n"]!, "e": "AQAB"],
            ]
        ])
        let set = try await ProviderKeySet.parse(json)
        #expect(set.keys.keys.sorted() == ["k1", "no-alg"])
        #expect(set["no-alg"]?.algorithmName == "RS256")
        await #expect(throws: KeySetError.self) { try await ProviderKeySet.parse(Data("not json".utf8)) }
    }

    @Test("Cache-Control max-age sets the key cache's lifetime, within its bounds")
    func cacheLifetime() {
        let bounds: ClosedRange<TimeInterval> = 300...86_400
        #expect(KeySetCache.lifetime(cacheControl: "public, max-age=19204, must-revalidate", default: 3600, within: bounds) == 19204)
        #expect(KeySetCache.lifetime(cacheControl: "max-age=10", default: 3600, within: bounds) == 300)
        #expect(KeySetCache.lifetime(cacheControl: "max-age=9999999", default: 3600, within: bounds) == 86_400)
        #expect(KeySetCache.lifetime(cacheControl: nil, default: 3600, within: bounds) == 3600)
        #expect(KeySetCache.lifetime(cacheControl: "no-store", default: 3600, within: bounds) == 300)
    }
}

extension Result {
    var failure: Failure? {
        if case .failure(let failure) = self { return failure }
        return nil
    }
}

