@testable import AuthIdentity
import FakeIdentityProvider
import Foundation
import JWTKit
import OnboardingAPI
import Testing

/// The unlink building blocks: each provider's request, the reading of its answers, Apple's
/// client secret, and the calls against the fake provider's endpoints.
@Suite("unlinking at the provider (building blocks)", .timeLimit(.minutes(1)))
struct ProviderUnlinkTests {
    @Test("Apple's client secret is an ES256 JWT for appleid.apple.com, signed with the developer's key")
    func appleClientSecret() async throws {
        let key = ES256PrivateKey()
        let settings = UnlinkSettings.Apple(teamID: "TEAM123456", keyID: "KEY1234567", privateKeyPEM: key.pemRepresentation, clientID: "com.example.app")
        let now = Date()
        let secret = try await AppleClientSecret.make(settings, now: now)
        let keys = JWTKeyCollection()
        await keys.add(ecdsa: key.publicKey, kid: JWKIdentifier(string: "KEY1234567"))
        let claims = try await keys.verify(secret, as: AppleClientSecret.Claims.self)
        #expect(claims.iss.value == "TEAM123456" && claims.sub.value == "com.example.app")
        #expect(claims.aud.value == ["https://appleid.apple.com"])
        #expect(abs(claims.exp.value.timeIntervalSince(now) - 300) < 1)
        let header = try #require(secret.split(separator: ".").first.flatMap { Base64URL.decode($0) })
        let fields = try JSONSerialization.jsonObject(with: Data(header)) as? [String: Any]
        #expect(fields?["alg"] as? String == "ES256" && fields?["kid"] as? String == "KEY1234567")
    }

    @Test("each provider's request carries what that provider asks for")
    func requests() {
        let kakao = UnlinkRequest.kakao(subject: "3141", settings: .init(adminKey: "admin-key"))
        #expect(kakao.headers["Authorization"] == "KakaoAK admin-key")
        #expect(kakao.body == "target_id_type=user_id&target_id=3141")
        let naver = UnlinkRequest.naver(accessToken: "a+b/c", settings: .init(clientID: "id", clientSecret: "secret"))
        #expect(naver.body == "grant_type=delete&client_id=id&client_secret=secret&access_token=a%2Bb%2Fc&service_provider=NAVER")
        let google = UnlinkRequest.google(token: "ya29.x", settings: .init())
        #expect(google.url == "https://oauth2.googleapis.com/revoke" && google.body == "token=ya29.x")
        let apple = UnlinkRequest.apple(
            refreshToken: "r.1", clientSecret: "jwt",
            settings: .init(teamID: "T", keyID: "K", privateKeyPEM: "", clientID: "com.example.app"))
        #expect(apple.body == "client_id=com.example.app&client_secret=jwt&token=r.1&token_type_hint=refresh_token")
    }

    @Test("answers: 2xx done, nothing left to unlink done, 5xx/429 retried, other 4xx refused")
    func classify() {
        func json(_ object: [String: Any]) -> Data { try! JSONSerialization.data(withJSONObject: object) }
        #expect(UnlinkOutcome.classify(.apple, status: 200, body: Data()) == .done)
        #expect(UnlinkOutcome.classify(.kakao, status: 200, body: json(["id": 3141])) == .done)
        #expect(UnlinkOutcome.classify(.kakao, status: 400, body: json(["code": -101, "msg": "not registered user"])) == .done)
        #expect(UnlinkOutcome.classify(.google, status: 400, body: json(["error": "invalid_token"])) == .done)
        for status in [408, 429, 500, 502, 503] {
            guard case .retryLater = UnlinkOutcome.classify(.apple, status: status, body: Data()) else {
                Issue.record("\(status) should be retried")
                continue
            }
        }
        for (provider, status) in [(Provider.apple, 400), (.kakao, 401), (.google, 403)] {
            guard case .refused = UnlinkOutcome.classify(provider, status: status, body: json(["error": "invalid_client"])) else {
                Issue.record("\(provider) \(status) should be refused")
                continue
            }
        }
        guard case .refused = UnlinkOutcome.classify(.naver, status: 200, body: json(["error": "invalid_request"])) else {
            Issue.record("Naver's 200 with an error is a refusal")
            return
        }
    }

    @Test("the backoff doubles from 30 s up to 6 hours")
    func backoff() {
        let backoff = UnlinkBackoff()
        #expect(backoff.delay(afterFailures: 1) == 30)
        #expect(backoff.delay(afterFailures: 2) == 60)
        #expect(backoff.delay(afterFailures: 3) == 120)
        #expect(backoff.delay(afterFailures: 100) == 6 * 3600)
    }

    @Test("against the fake: Kakao's unlink fails twice, is retried, then done; the fake saw the admin key each time")
    func retriedAgainstFake() async throws {
        let fake = try await FakeIdentityProvider.make()
        try await fake.withRunning { base in
            let unlinker = ProviderUnlinker()
            let request = UnlinkRequest.kakao(
                subject: "3141", settings: .init(adminKey: "admin-key", unlinkURL: "\(base)/kakao/v1/user/unlink"))
            fake.failNext("/kakao/v1/user/unlink", times: 2, status: 503)
            var outcomes: [UnlinkOutcome] = []
            for _ in 0..<3 { outcomes.append(await unlinker.send(request)) }
            #expect(outcomes.last == .done)
            #expect(outcomes.dropLast().allSatisfy { if case .retryLater = $0 { true } else { false } })
            let seen = fake.requests(path: "/kakao/v1/user/unlink")
            #expect(seen.count == 3)
            #expect(seen.allSatisfy { $0.authorization == "KakaoAK admin-key" && $0.body == "target_id_type=user_id&target_id=3141" })

            let key = ES256PrivateKey()
            let apple = UnlinkSettings.Apple(
                teamID: "T", keyID: "K", privateKeyPEM: key.pemRepresentation, clientID: "com.example.app",
                revokeURL: "\(base)/apple/auth/revoke")
            let secret = try await AppleClientSecret.make(apple)
            #expect(await unlinker.send(.apple(refreshToken: "r.1", clientSecret: secret, settings: apple)) == .done)
            #expect(fake.requests(path: "/apple/auth/revoke").first?.body.contains("token_type_hint=refresh_token") == true)
        }
        // Nobody listening: retried later, never lost.
        let nowhere = UnlinkRequest.google(token: "t", settings: .init(revokeURL: "http://127.0.0.1:1/revoke"))
        guard case .retryLater = await ProviderUnlinker(timeout: 2).send(nowhere) else {
            Issue.record("no answer should be retried")
            return
        }
    }
}
