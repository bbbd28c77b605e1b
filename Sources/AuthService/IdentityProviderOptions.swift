import ArgumentParser
import AuthIdentity
import Foundation

/// The identity providers' settings as flags, each with its environment variable as fallback
/// (`IdentityProviderSettings.fromEnvironment` reads both; the README's table lists defaults).
public struct IdentityProviderOptions: ParsableArguments {
    public init() {}

    @Option(help: "Google client ids, comma-separated. Env: ONBOARDING_GOOGLE_CLIENT_IDS. Default: none (Google sign-in refused)")
    var googleClientIds: String?
    @Option(help: "Accepted Google issuers. Env: ONBOARDING_GOOGLE_ISSUERS. Default: https://accounts.google.com,accounts.google.com")
    var googleIssuers: String?
    @Option(help: "Google's key set. Env: ONBOARDING_GOOGLE_JWKS_URL. Default: \(IdentityProviderSettings.Defaults.googleJWKSURL)")
    var googleJwksUrl: String?

    @Option(help: "Apple client ids (bundle or service ids), comma-separated. Env: ONBOARDING_APPLE_CLIENT_IDS. Default: none")
    var appleClientIds: String?
    @Option(help: "Accepted Apple issuers. Env: ONBOARDING_APPLE_ISSUERS. Default: \(IdentityProviderSettings.Defaults.appleIssuer)")
    var appleIssuers: String?
    @Option(help: "Apple's key set. Env: ONBOARDING_APPLE_JWKS_URL. Default: \(IdentityProviderSettings.Defaults.appleJWKSURL)")
    var appleJwksUrl: String?

    @Option(help: "Kakao app keys (client ids), comma-separated. Env: ONBOARDING_KAKAO_CLIENT_IDS. Default: none")
    var kakaoClientIds: String?
    @Option(help: "Accepted Kakao issuers. Env: ONBOARDING_KAKAO_ISSUERS. Default: \(IdentityProviderSettings.Defaults.kakaoIssuer)")
    var kakaoIssuers: String?
    @Option(help: "Kakao's key set. Env: ONBOARDING_KAKAO_JWKS_URL. Default: \(IdentityProviderSettings.Defaults.kakaoJWKSURL)")
    var kakaoJwksUrl: String?

    @Option(help: "Naver client ids, comma-separated. Env: ONBOARDING_NAVER_CLIENT_IDS. Default: none (Naver sign-in refused)")
    var naverClientIds: String?
    @Option(help: "Naver's profile API. Env: ONBOARDING_NAVER_PROFILE_URL. Default: \(IdentityProviderSettings.Defaults.naverProfileURL)")
    var naverProfileUrl: String?

    @Option(help: "Seconds a token's exp, iat and nbf may be off (0-600). Env: ONBOARDING_AUTH_TOKEN_LEEWAY_SECONDS. Default: 60")
    var tokenLeewaySeconds: String?

    /// The settings: flags first, then the environment, then the defaults.
    public func settings(environment: [String: String] = ProcessInfo.processInfo.environment) throws -> IdentityProviderSettings {
        var values = environment.filter { IdentityProviderSettings.variables.contains($0.key) }
        let flags: [(String, String?)] = [
            ("ONBOARDING_GOOGLE_CLIENT_IDS", googleClientIds), ("ONBOARDING_GOOGLE_ISSUERS", googleIssuers),
            ("ONBOARDING_GOOGLE_JWKS_URL", googleJwksUrl),
            ("ONBOARDING_APPLE_CLIENT_IDS", appleClientIds), ("ONBOARDING_APPLE_ISSUERS", appleIssuers),
            ("ONBOARDING_APPLE_JWKS_URL", appleJwksUrl),
            ("ONBOARDING_KAKAO_CLIENT_IDS", kakaoClientIds), ("ONBOARDING_KAKAO_ISSUERS", kakaoIssuers),
            ("ONBOARDING_KAKAO_JWKS_URL", kakaoJwksUrl),
            ("ONBOARDING_NAVER_CLIENT_IDS", naverClientIds), ("ONBOARDING_NAVER_PROFILE_URL", naverProfileUrl),
            ("ONBOARDING_AUTH_TOKEN_LEEWAY_SECONDS", tokenLeewaySeconds),
        ]
        for case (let name, let value?) in flags { values[name] = value }
        return try IdentityProviderSettings.fromEnvironment(values)
    }
}
