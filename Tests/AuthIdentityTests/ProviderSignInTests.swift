import AuthIdentity
import AuthService
import FakeIdentityProvider
import Foundation
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime
import Synchronization
import Testing

/// Real sign-in end to end without the internet: auth with dev mode off, its verifier pointed at
/// a fake provider the test runs on loopback (keys made by the test), over the in-process bus.
@Suite("sign-in with verified providers", .timeLimit(.minutes(2)))
struct ProviderSignInTests {
    let bus = InProcessBus()
    let rpc = Defaults.authRPC

    static let quietLogger = Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }

    /// Settings that point every provider at the fake at `base`, with the fake's client ids.
    static func settings(base: String, configure: [Provider] = Provider.allCases) -> IdentityProviderSettings {
        var settings = IdentityProviderSettings()
        for provider in configure {
            switch provider {
            case .google:
                settings.google.clientIDs = [FakeIdentityProvider.defaultClientID(.google), "second-google-client"]
                settings.google.jwksURL = FakeIdentityProvider.jwksURL(.google, base: base)
            case .apple:
                settings.apple.clientIDs = [FakeIdentityProvider.defaultClientID(.apple)]
                settings.apple.jwksURL = FakeIdentityProvider.jwksURL(.apple, base: base)
            case .kakao:
                settings.kakao.clientIDs = [FakeIdentityProvider.defaultClientID(.kakao)]
                settings.kakao.jwksURL = FakeIdentityProvider.jwksURL(.kakao, base: base)
            case .naver:
                settings.naver.clientIDs = [FakeIdentityProvider.defaultClientID(.naver)]
                settings.naver.profileURL = FakeIdentityProvider.naverProfileURL(base: base)
            }
        }
        return settings
    }

    /// Runs a fake provider and auth (dev mode off, verifying against the fake) for `body`.
    func withSystem(
        configure: [Provider] = Provider.allCases, clock: (@Sendable () -> Date)? = nil,
        _ body: (FakeIdentityProvider, ProviderIdentityVerifier) async throws -> Void
    ) async throws {
        let fake = try await FakeIdentityProvider.make()
        try await fake.withRunning { base in
            let verifier = ProviderIdentityVerifier(
                settings: Self.settings(base: base, configure: configure), clock: clock ?? { Date() }, logger: Self.quietLogger)
            let service = try AuthService(
                configuration: .init(rpc: rpc, events: Defaults.authEvents, devMode: false), bus: bus, logger: Self.quietLogger,
                identities: verifier)
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await service.run() }
                defer { group.cancelAll() }
                _ = try await bus.waitUntilAnswering(rpc, source: "test")
                try await body(fake, verifier)
            }
        }
    }

    func signIn(_ request: SignIn) async throws -> SignInResult {
        try await bus.call(request, to: rpc, source: "test")
    }

    func signIn(_ provider: Provider, idToken: String, nonce: String? = nil) async throws -> SignInResult {
        try await signIn(SignIn(provider: provider, subject: "", idToken: idToken, nonce: nonce))
    }

    @discardableResult
    func expectError(_ code: ErrorCode, reason: String? = nil, _ body: () async throws -> some Any) async -> ServiceError? {
        let error = await #expect(throws: ServiceError.self) { _ = try await body() }
        #expect(error?.code == code, "\(String(describing: error))")
        if let reason { #expect(error?.reason == reason, "\(String(describing: error))") }
        return error
    }

    // MARK: Each provider

    @Test("a valid token of each provider signs in, and the same account always gets the same uid")
    func eachProvider() async throws {
        try await withSystem { fake, _ in
            var uids: [Provider: String] = [:]
            for provider in [Provider.google, .apple, .kakao] {
                let first = try await signIn(provider, idToken: try fake.mintIDToken(provider, subject: "person-1"))
                let again = try await signIn(provider, idToken: try fake.mintIDToken(provider, subject: "person-1"))
                #expect(first.isNewAccount && !again.isNewAccount)
                #expect(first.uid == again.uid, "\(provider)")
                uids[provider] = first.uid
            }
            let naver = try await signIn(SignIn(provider: .naver, subject: "", accessToken: fake.naverAccessToken(for: "person-1")))
            let naverAgain = try await signIn(
                SignIn(provider: .naver, subject: "ignored", accessToken: fake.naverAccessToken(for: "person-1")))
            #expect(naver.uid == naverAgain.uid && naver.isNewAccount && !naverAgain.isNewAccount)
            uids[.naver] = naver.uid
            #expect(Set(uids.values).count == 4, "one account per provider")
            // The Authorization header reached Naver's profile API as a bearer token.
            #expect(fake.requests(path: "/naver/v1/nid/me").first?.authorization == "Bearer fake-naver-person-1")
        }
    }

    @Test("the subject in the request is not trusted: the token's is used")
    func subjectFromToken() async throws {
        try await withSystem { fake, _ in
            let mallory = try await signIn(SignIn(provider: .google, subject: "alice", idToken: try fake.mintIDToken(.google, subject: "mallory")))
            let alice = try await signIn(.google, idToken: try fake.mintIDToken(.google, subject: "alice"))
            #expect(mallory.uid != alice.uid)
            #expect(alice.isNewAccount)
        }
    }

    @Test("a subject with a control character is refused here too, as the schema says, though the token's is the one used")
    func subjectControlCharacter() async throws {
        try await withSystem { fake, _ in
            let token = try fake.mintIDToken(.kakao, subject: "3141")
            let error = await expectError(.invalidRequest) {
                try await signIn(SignIn(provider: .kakao, subject: "31\u{0}41", idToken: token))
            }
            #expect(error?.message.contains("U+0000") == true)
            // Nothing was created: the same token with a printable subject makes the account.
            #expect(try await signIn(SignIn(provider: .kakao, subject: "3141", idToken: token)).isNewAccount)
        }
    }

    @Test("a token for a second configured client id is accepted")
    func secondClientID() async throws {
        try await withSystem { fake, _ in
            _ = try await signIn(.google, idToken: try fake.mintIDToken(.google, subject: "p", audience: "second-google-client"))
        }
    }

    // MARK: Bad tokens

    @Test("bad tokens are refused as unauthenticated with the reason")
    func badTokens() async throws {
        try await withSystem { fake, _ in
            let key = try #require(fake.signingKey(.google))
            let claims = { FakeIdentityProvider.claims(.google, subject: "eve") }
            let cases: [(String, String)] = [
                (try fake.mintIDToken(.google, subject: "eve", issuer: "https://accounts.evil.example"), "wrongIssuer"),
                (try fake.mintIDToken(.google, subject: "eve", audience: "someone-elses-app"), "wrongAudience"),
                (try fake.mintIDToken(.google, subject: "eve", issuedAt: Date().addingTimeInterval(-7200)), "tokenExpired"),
                (try fake.mintIDToken(.google, subject: "eve", issuedAt: Date().addingTimeInterval(600)), "tokenNotYetValid"),
                (try FakeJWT.sign(payload: claims(), with: try await FakeSigningKey.generate(id: key.id)), "badSignature"),
                (try FakeJWT.unsigned(payload: claims(), kid: key.id), "algorithmNotAllowed"),
                (try FakeJWT.hs256Confusion(payload: claims(), key: key), "algorithmNotAllowed"),
                ("not-a-jwt", "malformedToken"),
                // Signed by Apple's key: Google does not publish it.
                (try fake.mintIDToken(.apple, subject: "eve"), "unknownKey"),
            ]
            for (token, reason) in cases {
                await expectError(.unauthenticated, reason: reason) { try await signIn(.google, idToken: token) }
            }
            await expectError(.unauthenticated, reason: "missingToken") { try await signIn(SignIn(provider: .google, subject: "eve")) }
            await expectError(.unauthenticated, reason: "missingToken") { try await signIn(SignIn(provider: .naver, subject: "eve")) }
        }
    }

    @Test("a nonce the token does not carry is refused; Apple's hashed nonce matches the raw one")
    func nonce() async throws {
        try await withSystem { fake, _ in
            let token = try fake.mintIDToken(.kakao, subject: "k", nonce: "nonce-1")
            await expectError(.unauthenticated, reason: "nonceMismatch") { try await signIn(.kakao, idToken: token, nonce: "nonce-2") }
            _ = try await signIn(.kakao, idToken: token, nonce: "nonce-1")
            let apple = try fake.mintIDToken(.apple, subject: "a", nonce: "raw-apple-nonce")
            _ = try await signIn(.apple, idToken: apple, nonce: "raw-apple-nonce")
            await expectError(.unauthenticated, reason: "nonceMismatch") { try await signIn(.apple, idToken: apple, nonce: "other") }
        }
    }

    @Test("Naver's 401 is unauthenticated; its other failures are dependencyUnavailable")
    func naverAnswers() async throws {
        try await withSystem { fake, _ in
            await expectError(.unauthenticated, reason: "providerRefusedToken") {
                try await signIn(SignIn(provider: .naver, subject: "", accessToken: "expired-or-forged"))
            }
            let token = fake.naverAccessToken(for: "n-1")
            fake.failNext("/naver/v1/nid/me", times: 1, status: 503)
            await expectError(.dependencyUnavailable, reason: "naver") {
                try await signIn(SignIn(provider: .naver, subject: "", accessToken: token))
            }
            let retried = try await signIn(SignIn(provider: .naver, subject: "", accessToken: token))
            #expect(retried.isNewAccount, "the failed attempt made no account")
            fake.revokeNaverToken(token)
            await expectError(.unauthenticated, reason: "providerRefusedToken") {
                try await signIn(SignIn(provider: .naver, subject: "", accessToken: token))
            }
        }
    }

    @Test("a provider without client ids refuses its sign-ins and names the setting")
    func notConfigured() async throws {
        try await withSystem(configure: [.google]) { fake, _ in
            let error = await expectError(.unauthenticated, reason: "providerNotConfigured") {
                try await signIn(.kakao, idToken: try fake.mintIDToken(.kakao, subject: "k"))
            }
            #expect(error?.message.contains("ONBOARDING_KAKAO_CLIENT_IDS") == true)
            _ = try await signIn(.google, idToken: try fake.mintIDToken(.google, subject: "g"))
            #expect(fake.requests(path: "/kakao/jwks").isEmpty)
        }
    }

    // MARK: Key sets

    @Test("keys are fetched once and then answered from the cache, also without waiting")
    func cachedKeys() async throws {
        try await withSystem { fake, verifier in
            let token = try fake.mintIDToken(.google, subject: "c")
            let proof = SignInProof(provider: .google, idToken: token)
            #expect(verifier.verifyCached(proof) == nil, "nothing cached yet: the async path must fetch")
            for _ in 0..<3 { _ = try await signIn(.google, idToken: token) }
            #expect(fake.requests(path: "/google/jwks").count == 1)
            #expect(try verifier.verifyCached(proof)?.get() == "c")
            let wrong = SignInProof(provider: .google, idToken: try fake.mintIDToken(.google, subject: "c", audience: "x"))
            #expect(verifier.verifyCached(wrong).map { (try? $0.get()) == nil } == true)
        }
    }

    @Test("a token with an unknown kid refetches the keys (after a rotation it verifies), at most once a minute")
    func rotation() async throws {
        let clock = TestClock()
        try await withSystem(clock: { clock.now }) { fake, verifier in
            _ = try await signIn(.apple, idToken: try fake.mintIDToken(.apple, subject: "r"))
            try await fake.rotateKey(.apple)
            // Within a minute of the last fetch, a key the cache lacks is refused without asking.
            await expectError(.unauthenticated, reason: "unknownKey") {
                try await signIn(.apple, idToken: try fake.mintIDToken(.apple, subject: "r"))
            }
            #expect(fake.requests(path: "/apple/jwks").count == 1)
            clock.advance(61)
            // Signed with the new key: unknown to the cache, fetched again, verified.
            #expect(try await signIn(.apple, idToken: try fake.mintIDToken(.apple, subject: "r")).isNewAccount == false)
            #expect(fake.requests(path: "/apple/jwks").count == 2)
            // The old key is gone from the set now: the cache forgot it too.
            await expectError(.unauthenticated) { try await signIn(.apple, idToken: try FakeJWT.sign(payload: FakeIdentityProvider.claims(.apple, subject: "r"), with: try await FakeSigningKey.generate(id: "apple-key-1"))) }

            // A made-up kid within the minute: refused without asking Apple again.
            let madeUp = try FakeJWT.sign(
                payload: FakeIdentityProvider.claims(.apple, subject: "r"), with: try #require(fake.signingKey(.apple)), kid: "made-up")
            await expectError(.unauthenticated, reason: "unknownKey") { try await signIn(.apple, idToken: madeUp) }
            await expectError(.unauthenticated, reason: "unknownKey") { try await signIn(.apple, idToken: madeUp) }
            #expect(fake.requests(path: "/apple/jwks").count == 2)

            // A minute later a rotation is picked up again.
            clock.advance(61)
            try await fake.rotateKey(.apple)
            _ = try await signIn(.apple, idToken: try fake.mintIDToken(.apple, subject: "r"))
            #expect(fake.requests(path: "/apple/jwks").count == 3)
            #expect(verifier.keyCache(.apple)?.fetchCount == 3)
        }
    }

    @Test("with the key set down, sign-in is dependencyUnavailable and no account is made; it works once the set is back")
    func keySetDown() async throws {
        let clock = TestClock()
        try await withSystem(clock: { clock.now }) { fake, _ in
            fake.setKeySetAvailable(.kakao, false)
            let token = try fake.mintIDToken(.kakao, subject: "down")
            await expectError(.dependencyUnavailable, reason: "kakao") { try await signIn(.kakao, idToken: token) }
            fake.setKeySetAvailable(.kakao, true)
            #expect(try await signIn(.kakao, idToken: token).isNewAccount, "the failed attempt made no account")

            // Down again when the cache expires (max-age 3600 s): the fetch fails, retryable.
            fake.setKeySetAvailable(.kakao, false)
            clock.advance(3601)
            await expectError(.dependencyUnavailable, reason: "kakao") {
                try await signIn(.kakao, idToken: try fake.mintIDToken(.kakao, subject: "down"))
            }
        }
    }

    @Test("a provider nobody answers for is dependencyUnavailable once the request timeout passes, for keys and for Naver")
    func nobodyListening() async throws {
        var settings = Self.settings(base: "http://127.0.0.1:1")
        settings.requestTimeout = 0.5
        let verifier = ProviderIdentityVerifier(settings: settings, logger: Self.quietLogger)
        let fake = try await FakeIdentityProvider.make()
        let clock = ContinuousClock()
        let started = clock.now
        for proof in [
            SignInProof(provider: .google, idToken: try fake.mintIDToken(.google, subject: "x")),
            SignInProof(provider: .naver, accessToken: fake.naverAccessToken(for: "x")),
        ] {
            let error = await #expect(throws: ServiceError.self) { try await verifier.verify(proof) }
            #expect(error?.code == .dependencyUnavailable && error?.reason == proof.provider.rawValue)
        }
        // The deadline ends the wait (0.5 s each here; 2 s by default, before a client's 3 s). The
        // bound is loose so that a loaded machine does not fail it; a call that hung would.
        #expect(started.duration(to: clock.now) < .seconds(20), "the request timeout ended the wait")
    }

    @Test("the cache keeps the key set for its max-age, then fetches it again")
    func maxAge() async throws {
        let clock = TestClock()
        try await withSystem(clock: { clock.now }) { fake, _ in
            fake.setKeySetMaxAge(600)
            let subject = "m"
            _ = try await signIn(.google, idToken: try fake.mintIDToken(.google, subject: subject))
            // The test clock moves with real time too: 10 s short of the max-age leaves room for
            // a loaded machine between the two sign-ins (599 did not, once).
            clock.advance(590)
            _ = try await signIn(.google, idToken: try fake.mintIDToken(.google, subject: subject, issuedAt: clock.now))
            #expect(fake.requests(path: "/google/jwks").count == 1)
            clock.advance(11)
            _ = try await signIn(.google, idToken: try fake.mintIDToken(.google, subject: subject, issuedAt: clock.now))
            #expect(fake.requests(path: "/google/jwks").count == 2)
        }
    }
}

/// A clock the test moves by hand (starts at the real now, so tokens minted now are valid).
final class TestClock: Sendable {
    private let offset = Mutex<TimeInterval>(0)
    var now: Date { Date().addingTimeInterval(offset.withLock { $0 }) }
    func advance(_ seconds: TimeInterval) { offset.withLock { $0 += seconds } }
}

