import AuthIdentity
import AuthService
import FakeIdentityProvider
import Foundation
import JWTKit
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime
import Synchronization
import Testing

/// Withdrawal unlinks the account at its provider, end to end without the internet: auth with
/// dev mode off, verifying sign-ins and unlinking against a fake provider on loopback. The tests
/// wait for the worker's events, never for time.
@Suite("withdrawal unlinks at the provider", .timeLimit(.minutes(2)))
struct WithdrawalUnlinkTests {
    let bus = InProcessBus()
    let rpc = Defaults.authRPC
    static let appleKey = ES256PrivateKey()
    static let kakaoPath = "/kakao/v1/user/unlink"

    /// Unlink settings pointing `configure` at the fake at `base`.
    static func unlinkSettings(base: String, configure: [Provider] = Provider.allCases) -> UnlinkSettings {
        var settings = UnlinkSettings()
        for provider in configure {
            switch provider {
            case .apple:
                settings.apple = .init(
                    teamID: "TEAM123456", keyID: "KEY1234567", privateKeyPEM: appleKey.pemRepresentation,
                    clientID: FakeIdentityProvider.defaultClientID(.apple), revokeURL: "\(base)/apple/auth/revoke",
                    tokenURL: "\(base)\(FakeIdentityProvider.appleTokenPath)")
            case .kakao: settings.kakao = .init(adminKey: "kakao-admin-key", unlinkURL: "\(base)\(kakaoPath)")
            case .naver:
                settings.naver = .init(clientID: "naver-client", clientSecret: "naver-secret", tokenURL: "\(base)/naver/oauth2.0/token")
            case .google: settings.google = .init(revokeURL: "\(base)/google/revoke")
            }
        }
        return settings
    }

    /// Runs auth (dev mode off, verifying and unlinking against `fake` at `base`) for `body`;
    /// the worker's events go to `events`. Retries come 20 ms after a failure unless told.
    func withAuth(
        fake: FakeIdentityProvider, base: String, unlinking: [Provider] = Provider.allCases, events: UnlinkEventLog,
        databasePath: String? = nil, backoff: UnlinkBackoff = UnlinkBackoff(initial: 0.02, maximum: 0.02),
        _ body: () async throws -> Void
    ) async throws {
        let verifier = ProviderIdentityVerifier(
            settings: ProviderSignInTests.settings(base: base), logger: ProviderSignInTests.quietLogger)
        let unlink = UnlinkConfiguration(
            providers: Self.unlinkSettings(base: base, configure: unlinking), backoff: backoff, requestTimeout: 5,
            observer: { events.record($0) })
        let service = try AuthService(
            configuration: .init(rpc: rpc, events: Defaults.authEvents, databasePath: databasePath, unlink: unlink), bus: bus,
            logger: ProviderSignInTests.quietLogger, identities: verifier)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await service.run() }
            defer { group.cancelAll() }
            _ = try await bus.waitUntilAnswering(rpc, source: "test")
            try await body()
        }
    }

    /// A fake provider and auth against it (``withAuth(fake:base:unlinking:events:databasePath:backoff:_:)``)
    /// for `body`, which gets the fake and the worker's events.
    func withSystem(
        unlinking: [Provider] = Provider.allCases, _ body: (FakeIdentityProvider, UnlinkEventLog) async throws -> Void
    ) async throws {
        let fake = try await FakeIdentityProvider.make()
        let events = UnlinkEventLog()
        try await fake.withRunning { base in
            try await withAuth(fake: fake, base: base, unlinking: unlinking, events: events) { try await body(fake, events) }
        }
    }

    func signIn(_ request: SignIn) async throws -> SignInResult {
        try await bus.call(request, to: rpc, source: "test")
    }

    /// Signs in with `provider`'s (fake) proof for `subject`; Apple sends `code`, Google `access`.
    func signIn(
        _ provider: Provider, _ subject: String, fake: FakeIdentityProvider, code: String? = nil, access: String? = nil
    ) async throws -> SignInResult {
        switch provider {
        case .naver:
            return try await signIn(SignIn(provider: .naver, subject: "", accessToken: fake.naverAccessToken(for: subject)))
        default:
            return try await signIn(
                SignIn(
                    provider: provider, subject: "", idToken: try fake.mintIDToken(provider, subject: subject),
                    accessToken: access, authorizationCode: code))
        }
    }

    func withdraw(_ session: SignInResult) async throws {
        _ = try await bus.call(Withdraw(), to: rpc, source: "test", sessionToken: session.sessionToken)
    }

    func unlinkQueue() async throws -> UnlinkQueueStatus {
        try #require(try await bus.call(HealthCheck(), to: rpc, source: "test").unlink)
    }

    static func form(_ body: String) -> [String: String] {
        var fields: [String: String] = [:]
        for pair in body.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map { String($0).removingPercentEncoding ?? String($0) }
            if parts.count == 2 { fields[parts[0]] = parts[1] }
        }
        return fields
    }

    // MARK: Each provider

    @Test("a withdrawal unlinks at each of the four providers with the request that provider takes")
    func eachProvider() async throws {
        try await withSystem { fake, events in
            let apple = try await signIn(.apple, "apple-person", fake: fake, code: "code-1")
            let kakao = try await signIn(.kakao, "3141", fake: fake)
            let naver = try await signIn(.naver, "naver-person", fake: fake)
            let google = try await signIn(.google, "google-person", fake: fake, access: "ya29.google-access")

            // Apple's code was exchanged at sign-in, with a client secret signed by the key.
            let exchange = try #require(fake.requests(path: FakeIdentityProvider.appleTokenPath).first)
            let exchanged = Self.form(exchange.body)
            #expect(exchanged["grant_type"] == "authorization_code" && exchanged["code"] == "code-1")
            #expect(exchanged["client_id"] == FakeIdentityProvider.defaultClientID(.apple))
            #expect(fake.requests(path: "/apple/auth/revoke").isEmpty, "nothing is unlinked before a withdrawal")

            for session in [apple, kakao, naver, google] { try await withdraw(session) }
            let seen = await events.wait { events in
                Set(events.compactMap { if case .unlinked(let uid, _) = $0 { uid } else { nil } }).count == 4
        }
        #expect(seen.count == 4, "one attempt each: \(seen)")

        let revoke = Self.form(try #require(fake.requests(path: "/apple/auth/revoke").first).body)
        #expect(revoke["token"] == FakeIdentityProvider.appleRefreshToken(forCode: "code-1"))
        #expect(revoke["token_type_hint"] == "refresh_token")
        #expect(revoke["client_id"] == FakeIdentityProvider.defaultClientID(.apple))
        let secret = try #require(revoke["client_secret"])
        let keys = JWTKeyCollection()
        await keys.add(ecdsa: Self.appleKey.publicKey, kid: JWKIdentifier(string: "KEY1234567"))
        _ = try await keys.verify(secret, as: AppleSecretClaims.self)

        let unlink = try #require(fake.requests(path: Self.kakaoPath).first)
        #expect(unlink.authorization == "KakaoAK kakao-admin-key")
        #expect(unlink.body == "target_id_type=user_id&target_id=3141")

        #expect(
            try #require(fake.requests(path: "/naver/oauth2.0/token").first).body
                == "grant_type=delete&client_id=naver-client&client_secret=naver-secret"
                + "&access_token=\(fake.naverAccessToken(for: "naver-person"))&service_provider=NAVER")
        #expect(try #require(fake.requests(path: "/google/revoke").first).body == "token=ya29.google-access")

        let queue = try await unlinkQueue()
        #expect(queue.pending == 0 && queue.oldestPendingSeconds == nil && queue.lastError == nil)
        }
    }

    // MARK: Retries

    @Test("an unlink that fails twice is retried, and done on the third attempt")
    func retriedAfterTwoFailures() async throws {
        try await withSystem { fake, events in
            let person = try await signIn(.kakao, "2718", fake: fake)
            fake.failNext(Self.kakaoPath, times: 2, status: 503)
            try await withdraw(person)
            let seen = await events.wait { $0.contains(.unlinked(uid: person.uid, provider: .kakao)) }
            let attempts = seen.compactMap { if case .retrying(_, _, let attempts, _) = $0 { attempts } else { nil } }
            #expect(attempts == [1, 2])
            #expect(fake.requests(path: Self.kakaoPath).count == 3)
            #expect(try await unlinkQueue().pending == 0)
        }
    }

    @Test("a pending unlink survives a restart of auth and is done by the next one")
    func completedAfterRestart() async throws {
        let fake = try await FakeIdentityProvider.make()
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("unlink-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let database = folder.appendingPathComponent("auth.sqlite").path
        try await fake.withRunning { base in
            let first = UnlinkEventLog()
            var uid = ""
            try await withAuth(
                fake: fake, base: base, events: first, databasePath: database, backoff: UnlinkBackoff(initial: 0.2, maximum: 0.2)
            ) {
                let person = try await signIn(.kakao, "1618", fake: fake)
                uid = person.uid
                fake.failNext(Self.kakaoPath, times: 1_000, status: 500)
                try await withdraw(person)
                _ = await first.wait { $0.contains { if case .retrying = $0 { true } else { false } } }
                let queue = try await unlinkQueue()
                #expect(queue.pending == 1)
                #expect(queue.oldestPendingSeconds != nil)
                #expect(queue.lastError?.contains("500") == true, "\(String(describing: queue.lastError))")
            }
            // Auth is down; Kakao recovers; a new auth on the same database finishes the job.
            fake.failNext(Self.kakaoPath, times: 0)
            let (second, withdrawn) = (UnlinkEventLog(), uid)
            try await withAuth(fake: fake, base: base, events: second, databasePath: database) {
                _ = await second.wait { $0.contains(.unlinked(uid: withdrawn, provider: .kakao)) }
                let queue = try await unlinkQueue()
                #expect(queue.pending == 0)
            }
            #expect(fake.requests(path: Self.kakaoPath).allSatisfy { $0.body == "target_id_type=user_id&target_id=1618" })
        }
    }

    // MARK: Skipped and refused

    @Test("a provider without unlink credentials is skipped; so is an account that left nothing to unlink with")
    func skipped() async throws {
        try await withSystem(unlinking: [.google, .apple]) { fake, events in
            let naver = try await signIn(.naver, "n-1", fake: fake)
            let kakao = try await signIn(.kakao, "k-1", fake: fake)
            let google = try await signIn(.google, "g-1", fake: fake)  // no access token sent
            fake.failNext(FakeIdentityProvider.appleTokenPath, times: 1, status: 500)
            let apple = try await signIn(.apple, "a-1", fake: fake, code: "code-lost")  // signed in all the same
            for session in [naver, kakao, google, apple] { try await withdraw(session) }
            let seen = await events.wait { $0.count == 4 }
            #expect(Set(seen) == [
                .dropped(uid: naver.uid, provider: .naver, .notConfigured(.naver)),
                .dropped(uid: kakao.uid, provider: .kakao, .notConfigured(.kakao)),
                .dropped(uid: google.uid, provider: .google, .nothingStored(.google)),
                .dropped(uid: apple.uid, provider: .apple, .nothingStored(.apple)),
            ])
            for path in FakeIdentityProvider.revokePaths { #expect(fake.requests(path: path).isEmpty, "\(path)") }
            #expect(try await unlinkQueue().pending == 0)
        }
    }

    @Test("a permanent refusal drops the job and shows in health")
    func refused() async throws {
        try await withSystem { fake, events in
            let person = try await signIn(.apple, "a-2", fake: fake, code: "code-2")
            fake.failNext("/apple/auth/revoke", times: 1, status: 400)
            try await withdraw(person)
            let seen = await events.wait { !$0.isEmpty }
            guard case .refused(person.uid, .apple, let error) = seen.first else {
                Issue.record("expected a refusal, got \(seen)")
                return
            }
            #expect(error.contains("400"))
            #expect(!error.contains(FakeIdentityProvider.appleRefreshToken(forCode: "code-2")), "no token in errors")
            #expect(fake.requests(path: "/apple/auth/revoke").count == 1)
            let queue = try await unlinkQueue()
            #expect(queue.pending == 0 && queue.lastError == error && queue.lastErrorAt != nil)
        }
    }
}

/// The worker's events as they come, with a wait for the moment they satisfy a condition.
final class UnlinkEventLog: Sendable {
    private struct State {
        var events: [UnlinkEvent] = []
        var waiters: [(until: @Sendable ([UnlinkEvent]) -> Bool, continuation: CheckedContinuation<[UnlinkEvent], Never>)] = []
    }
    private let state = Mutex(State())

    func record(_ event: UnlinkEvent) {
        let ready = state.withLock { state -> [(CheckedContinuation<[UnlinkEvent], Never>, [UnlinkEvent])] in
            state.events.append(event)
            let events = state.events
            let (done, waiting) = (state.waiters.filter { $0.until(events) }, state.waiters.filter { !$0.until(events) })
            state.waiters = waiting
            return done.map { ($0.continuation, events) }
        }
        for (continuation, events) in ready { continuation.resume(returning: events) }
    }

    /// Every event so far, once `until` holds for them (the suite's time limit bounds the wait).
    func wait(until: @escaping @Sendable ([UnlinkEvent]) -> Bool) async -> [UnlinkEvent] {
        await withCheckedContinuation { continuation in
            let events = state.withLock { state -> [UnlinkEvent]? in
                if until(state.events) { return state.events }
                state.waiters.append((until, continuation))
                return nil
            }
            if let events { continuation.resume(returning: events) }
        }
    }
}

/// The claims of Apple's client secret, to verify its signature.
struct AppleSecretClaims: JWTPayload {
    var iss: IssuerClaim
    var sub: SubjectClaim
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}
