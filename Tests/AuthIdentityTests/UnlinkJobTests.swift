import AuthIdentity
import AuthService
import Foundation
import JWTKit
import Messaging
import OnboardingAPI
import Testing

/// The unlink queue's decisions as values: what a job sends, what an answer means for it, and
/// the settings read from the environment. No I/O.
@Suite("unlink jobs (decisions)")
struct UnlinkJobTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)
    static let apple = UnlinkSettings.Apple(teamID: "T", keyID: "K", privateKeyPEM: "pem", clientID: "com.example.app")
    static let all = UnlinkSettings(
        apple: apple, kakao: .init(adminKey: "admin"), naver: .init(clientID: "id", clientSecret: "secret"), google: .init())

    static func job(_ provider: Provider, token: String? = "token", attempts: Int = 0) -> UnlinkJob {
        UnlinkJob(
            uid: "u-1", provider: provider, subject: "s-1", token: token, attempts: attempts, createdAt: now, nextAttemptAt: now)
    }

    @Test("each provider's job sends what that provider needs")
    func plans() {
        #expect(Self.job(.apple).plan(Self.all) == .send(.apple(refreshToken: "token", Self.apple)))
        #expect(Self.job(.kakao, token: nil).plan(Self.all) == .send(.kakao(subject: "s-1", Self.all.kakao!)))
        #expect(Self.job(.naver).plan(Self.all) == .send(.naver(accessToken: "token", Self.all.naver!)))
        #expect(Self.job(.google).plan(Self.all) == .send(.google(token: "token", Self.all.google!)))
    }

    @Test("a provider not configured, or a job without the token it needs, is dropped unsent", arguments: Provider.allCases)
    func drops(provider: Provider) {
        #expect(Self.job(provider).plan(UnlinkSettings()) == .drop(.notConfigured(provider)))
        let withoutToken = Self.job(provider, token: nil).plan(Self.all)
        if provider == .kakao {
            #expect(withoutToken == .send(.kakao(subject: "s-1", Self.all.kakao!)), "Kakao needs no token")
        } else {
            #expect(withoutToken == .drop(.nothingStored(provider)))
            #expect(Self.job(provider, token: "").plan(Self.all) == .drop(.nothingStored(provider)))
        }
    }

    @Test("done deletes the job, a refusal drops it, a failure is retried after the backoff")
    func steps() {
        let backoff = UnlinkBackoff(initial: 10, maximum: 60)
        let job = Self.job(.kakao, attempts: 2)
        #expect(job.step(after: .done, now: Self.now, backoff: backoff) == .unlinked)
        #expect(job.step(after: .refused("no"), now: Self.now, backoff: backoff) == .refused("no"))
        #expect(
            job.step(after: .retryLater("503"), now: Self.now, backoff: backoff)
                == .retry(at: Self.now.addingTimeInterval(40), attempts: 3, error: "503"))
        #expect(
            Self.job(.kakao, attempts: 9).step(after: .retryLater("503"), now: Self.now, backoff: backoff)
                == .retry(at: Self.now.addingTimeInterval(60), attempts: 10, error: "503"))
    }

    @Test("Apple's code exchange: its form, and the refresh token read from the answer")
    func appleExchange() {
        let request = AppleCodeExchange.request(code: "c", clientSecret: "jwt", settings: Self.apple)
        #expect(request.url == "https://appleid.apple.com/auth/token")
        #expect(request.body == "client_id=com.example.app&client_secret=jwt&code=c&grant_type=authorization_code")
        let answer = Data(#"{"access_token":"a","refresh_token":"r.1","expires_in":3600}"#.utf8)
        #expect(AppleCodeExchange.refreshToken(status: 200, body: answer) == .success("r.1"))
        #expect(throws: AppleCodeExchange.ExchangeFailure.self) {
            try AppleCodeExchange.refreshToken(status: 400, body: Data(#"{"error":"invalid_grant"}"#.utf8)).get()
        }
        #expect(throws: AppleCodeExchange.ExchangeFailure.self) {
            try AppleCodeExchange.refreshToken(status: 200, body: Data("{}".utf8)).get()
        }
    }

    // MARK: Environment

    @Test("the environment configures each provider; nothing set configures none")
    func environment() throws {
        #expect(try UnlinkSettings.fromEnvironment([:]) == UnlinkSettings())
        let pem = ES256PrivateKey().pemRepresentation
        let settings = try UnlinkSettings.fromEnvironment([
            "ONBOARDING_APPLE_TEAM_ID": "TEAM", "ONBOARDING_APPLE_KEY_ID": "KEY", "ONBOARDING_APPLE_PRIVATE_KEY": pem,
            "ONBOARDING_APPLE_CLIENT_IDS": "com.example.app, com.example.web",
            "ONBOARDING_APPLE_REVOKE_URL": "http://127.0.0.1:9999/apple/auth/revoke",
            "ONBOARDING_KAKAO_ADMIN_KEY": "admin",
            "ONBOARDING_NAVER_CLIENT_SECRET": "secret", "ONBOARDING_NAVER_CLIENT_IDS": "naver-id",
            "ONBOARDING_GOOGLE_UNLINK": "1",
        ])
        #expect(settings.apple?.clientID == "com.example.app", "the first sign-in client id")
        #expect(settings.apple?.revokeURL == "http://127.0.0.1:9999/apple/auth/revoke")
        #expect(settings.apple?.tokenURL == "https://appleid.apple.com/auth/token")
        #expect(settings.kakao == .init(adminKey: "admin"))
        #expect(settings.naver == .init(clientID: "naver-id", clientSecret: "secret"))
        #expect(settings.google == .init())
        #expect(Provider.allCases.allSatisfy(settings.isConfigured))
    }

    @Test("the Apple key is read from its .p8 file")
    func appleKeyFile() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("AuthKey_\(UUID().uuidString).p8")
        try ES256PrivateKey().pemRepresentation.write(to: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: file) }
        let settings = try UnlinkSettings.fromEnvironment([
            "ONBOARDING_APPLE_TEAM_ID": "TEAM", "ONBOARDING_APPLE_KEY_ID": "KEY",
            "ONBOARDING_APPLE_PRIVATE_KEY_PATH": file.path, "ONBOARDING_APPLE_UNLINK_CLIENT_ID": "com.example.app",
        ])
        #expect(settings.apple?.teamID == "TEAM" && settings.apple?.clientID == "com.example.app")
    }

    @Test(
        "settings that cannot work are refused, naming the variable and never the secret",
        arguments: [
            (["ONBOARDING_APPLE_TEAM_ID": "TEAM"], "ONBOARDING_APPLE_PRIVATE_KEY"),
            (["ONBOARDING_APPLE_TEAM_ID": "TEAM", "ONBOARDING_APPLE_KEY_ID": "K", "ONBOARDING_APPLE_PRIVATE_KEY": "sekrit"], "P-256"),
            (["ONBOARDING_NAVER_CLIENT_SECRET": "sekrit"], "ONBOARDING_NAVER_UNLINK_CLIENT_ID"),
            (["ONBOARDING_KAKAO_ADMIN_KEY": "sekrit", "ONBOARDING_KAKAO_UNLINK_URL": "http://kakao.example/unlink"], "ONBOARDING_KAKAO_UNLINK_URL"),
            (["ONBOARDING_GOOGLE_UNLINK": "maybe"], "ONBOARDING_GOOGLE_UNLINK"),
        ])
    func refusedSettings(values: [String: String], named: String) {
        let error = #expect(throws: ServiceError.self) { try UnlinkSettings.fromEnvironment(values) }
        #expect(error?.code == .invalidRequest)
        #expect(error?.message.contains(named) == true, "\(String(describing: error))")
        #expect(error?.message.contains("sekrit") == false)
    }
}
