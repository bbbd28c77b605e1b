import AuthIdentity
import Foundation
import Messaging
import OnboardingAPI
import Testing

@Suite("identity provider settings")
struct IdentitySettingsTests {
    @Test("the defaults are the real providers' issuers and URLs, and no provider is configured")
    func defaults() throws {
        let settings = try IdentityProviderSettings.fromEnvironment([:])
        #expect(settings.configuredProviders.isEmpty)
        #expect(settings.google.issuers == ["https://accounts.google.com", "accounts.google.com"])
        #expect(settings.google.jwksURL == "https://www.googleapis.com/oauth2/v3/certs")
        #expect(settings.apple.issuers == ["https://appleid.apple.com"] && settings.apple.nonceIsHashed)
        #expect(settings.apple.jwksURL == "https://appleid.apple.com/auth/keys")
        #expect(settings.kakao.issuers == ["https://kauth.kakao.com"] && !settings.kakao.nonceIsHashed)
        #expect(settings.kakao.jwksURL == "https://kauth.kakao.com/.well-known/jwks.json")
        #expect(settings.naver.profileURL == "https://openapi.naver.com/v1/nid/me")
        #expect(settings.clockLeeway == 60)
        #expect(settings.summary.allSatisfy { $0.contains("NOT verified") })
    }

    @Test("client ids are comma-separated lists; a provider with one is configured")
    func clientIDs() throws {
        let settings = try IdentityProviderSettings.fromEnvironment([
            "ONBOARDING_GOOGLE_CLIENT_IDS": "ios.apps.googleusercontent.com, android.apps.googleusercontent.com",
            "ONBOARDING_NAVER_CLIENT_IDS": "naver-app",
            "ONBOARDING_KAKAO_JWKS_URL": "http://127.0.0.1:7601/kakao/jwks",
            "ONBOARDING_AUTH_TOKEN_LEEWAY_SECONDS": "30",
        ])
        #expect(settings.google.clientIDs == ["ios.apps.googleusercontent.com", "android.apps.googleusercontent.com"])
        #expect(settings.configuredProviders == [.google, .naver])
        #expect(settings.kakao.jwksURL == "http://127.0.0.1:7601/kakao/jwks")
        #expect(settings.clockLeeway == 30)
        let refusal = settings.refusal(for: .apple)
        #expect(refusal.code == .unauthenticated && refusal.reason == "providerNotConfigured")
        #expect(refusal.message.contains("ONBOARDING_APPLE_CLIENT_IDS"))
    }

    @Test("keys over plain http are refused unless on loopback; a bad leeway names its setting", arguments: [
        ["ONBOARDING_GOOGLE_JWKS_URL": "http://keys.example.com/certs"],
        ["ONBOARDING_NAVER_PROFILE_URL": "not a url"],
        ["ONBOARDING_AUTH_TOKEN_LEEWAY_SECONDS": "3600"],
        ["ONBOARDING_APPLE_ISSUERS": " , "],
    ])
    func invalid(_ values: [String: String]) {
        let error = #expect(throws: ServiceError.self) { try IdentityProviderSettings.fromEnvironment(values) }
        #expect(error?.code == .invalidRequest)
        #expect(error?.message.contains(values.keys.first!) == true, "\(String(describing: error))")
    }
}
