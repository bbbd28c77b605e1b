import Foundation
import Messaging
import OnboardingAPI
import OnboardingSettings

extension IdentityProviderSettings {
    /// The settings read here.
    public static let settings: [Setting] = [
        .googleClientIDs, .googleIssuers, .googleJWKSURL, .appleClientIDs, .appleIssuers, .appleJWKSURL,
        .kakaoClientIDs, .kakaoIssuers, .kakaoJWKSURL, .naverClientIDs, .naverProfileURL, .authTokenLeewaySeconds,
    ]

    /// The settings a program was started with; what is not given keeps its default.
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` naming the setting whose value cannot work.
    public init(_ settings: Settings) throws {
        self = try Self.fromEnvironment(settings.environmentValues(Self.settings))
    }

    /// The settings from `values`, by environment variable; what is not given keeps its
    /// default.
    ///
    /// - `ONBOARDING_<GOOGLE|APPLE|KAKAO>_CLIENT_IDS`, `_ISSUERS`: comma-separated lists.
    /// - `ONBOARDING_<GOOGLE|APPLE|KAKAO>_JWKS_URL`, `ONBOARDING_NAVER_PROFILE_URL`: `https://`,
    ///   or `http://` to a loopback host (a local fake provider).
    /// - `ONBOARDING_NAVER_CLIENT_IDS`: comma-separated.
    /// - `ONBOARDING_AUTH_TOKEN_LEEWAY_SECONDS`: 0 to 600.
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` naming the variable whose value cannot work.
    public static func fromEnvironment(_ values: [String: String]) throws -> IdentityProviderSettings {
        var settings = IdentityProviderSettings()
        func list(_ setting: Setting) -> [String]? {
            guard let raw = values[setting.environmentVariable] else { return nil }
            return raw.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }
        func url(_ setting: Setting) throws -> String? {
            guard let raw = values[setting.environmentVariable]?.trimmingCharacters(in: .whitespaces), !raw.isEmpty
            else { return nil }
            try checkURL(raw, setting: setting.environmentVariable)
            return raw
        }
        for provider in [Provider.google, .apple, .kakao] {
            guard var oidc = settings.oidc(provider), let issuersSetting = Setting.issuers(provider),
                let jwksSetting = Setting.jwksURL(provider)
            else { continue }
            if let ids = list(.clientIDs(provider)) { oidc.clientIDs = ids }
            if let issuers = list(issuersSetting) {
                guard !issuers.isEmpty else {
                    throw ServiceError(.invalidRequest, "\(issuersSetting.environmentVariable) is empty; leave it unset for the default.")
                }
                oidc.issuers = issuers
            }
            if let jwks = try url(jwksSetting) { oidc.jwksURL = jwks }
            switch provider {
            case .google: settings.google = oidc
            case .apple: settings.apple = oidc
            default: settings.kakao = oidc
            }
        }
        if let ids = list(.naverClientIDs) { settings.naver.clientIDs = ids }
        if let profile = try url(.naverProfileURL) { settings.naver.profileURL = profile }
        if let raw = values[Setting.authTokenLeewaySeconds.environmentVariable] {
            guard let seconds = Int(raw.trimmingCharacters(in: .whitespaces)), (0...600).contains(seconds) else {
                throw ServiceError(
                    .invalidRequest,
                    "\(Setting.authTokenLeewaySeconds) is \"\(raw)\"; give whole seconds from 0 to 600.")
            }
            settings.clockLeeway = TimeInterval(seconds)
        }
        return settings
    }

    /// A provider URL must be `https`, or `http` to a loopback host (a fake provider on this
    /// machine): tokens are never checked against keys that crossed a network in the clear.
    static func checkURL(_ raw: String, setting: String) throws {
        if let problem = Setting.providerURLProblem(raw) {
            throw ServiceError(.invalidRequest, "\(setting) is \"\(raw)\": \(problem).")
        }
    }
}
