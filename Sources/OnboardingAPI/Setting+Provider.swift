import OnboardingSettings

/// Each provider's settings, for code that goes over the providers.
extension Setting {
    /// `ONBOARDING_<PROVIDER>_CLIENT_IDS`.
    public static func clientIDs(_ provider: Provider) -> Setting {
        switch provider {
        case .google: .googleClientIDs
        case .apple: .appleClientIDs
        case .kakao: .kakaoClientIDs
        case .naver: .naverClientIDs
        }
    }

    /// `ONBOARDING_<PROVIDER>_ISSUERS`; `nil` for Naver, which issues no ID tokens.
    public static func issuers(_ provider: Provider) -> Setting? {
        switch provider {
        case .google: .googleIssuers
        case .apple: .appleIssuers
        case .kakao: .kakaoIssuers
        case .naver: nil
        }
    }

    /// `ONBOARDING_<PROVIDER>_JWKS_URL`; `nil` for Naver, which issues no ID tokens.
    public static func jwksURL(_ provider: Provider) -> Setting? {
        switch provider {
        case .google: .googleJWKSURL
        case .apple: .appleJWKSURL
        case .kakao: .kakaoJWKSURL
        case .naver: nil
        }
    }
}
