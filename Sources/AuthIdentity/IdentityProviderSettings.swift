import Foundation
import Messaging
import OnboardingAPI
import OnboardingSettings

/// How auth verifies sign-ins with one OpenID Connect provider (Google, Apple, Kakao): which
/// issuer and audiences an ID token must name, and where the provider publishes its keys.
///
/// A provider is *configured* when it has at least one client id; without one, its sign-ins are
/// refused (``IdentityProviderSettings/refusal(for:)``).
public struct OIDCProviderSettings: Sendable, Hashable {
    /// The exact `iss` values accepted (Google has two spellings).
    public var issuers: [String]
    /// Where the provider's JSON Web Key Set is published (`https`, or `http` on loopback only).
    public var jwksURL: String
    /// The app's client ids: an ID token's `aud` must name one of them, and nothing else.
    public var clientIDs: [String]
    /// Whether the token's `nonce` is the SHA-256 (lowercase hex) of the nonce the app made
    /// (Apple), rather than that nonce itself (Google, Kakao).
    public var nonceIsHashed: Bool

    public init(issuers: [String], jwksURL: String, clientIDs: [String] = [], nonceIsHashed: Bool = false) {
        self.issuers = issuers
        self.jwksURL = jwksURL
        self.clientIDs = clientIDs
        self.nonceIsHashed = nonceIsHashed
    }

    public var isConfigured: Bool { !clientIDs.isEmpty }
}

/// How auth verifies Naver sign-ins: Naver issues no ID token, so auth asks Naver's profile API
/// whose account the app's access token belongs to.
public struct NaverSettings: Sendable, Hashable {
    /// The app's client ids (Naver's "Client ID"). Naver's profile API does not say which app a
    /// token was issued to, so these only switch Naver on (and name the app for unlinking later).
    public var clientIDs: [String]
    /// Naver's profile API (`GET`, `Authorization: Bearer <access token>`).
    public var profileURL: String

    public init(clientIDs: [String] = [], profileURL: String = IdentityProviderSettings.Defaults.naverProfileURL) {
        self.clientIDs = clientIDs
        self.profileURL = profileURL
    }

    public var isConfigured: Bool { !clientIDs.isEmpty }
}

/// Every provider's settings, with the real providers' issuers and URLs as defaults and no client
/// ids (so nothing is verified until a client id is given).
///
/// Made once at start (``fromEnvironment(_:)`` or by hand in tests) and passed down by value.
public struct IdentityProviderSettings: Sendable, Hashable {
    /// The real providers' published values.
    public enum Defaults {
        public static let googleIssuers = ["https://accounts.google.com", "accounts.google.com"]
        public static let googleJWKSURL = "https://www.googleapis.com/oauth2/v3/certs"
        public static let appleIssuer = "https://appleid.apple.com"
        public static let appleJWKSURL = "https://appleid.apple.com/auth/keys"
        public static let kakaoIssuer = "https://kauth.kakao.com"
        public static let kakaoJWKSURL = "https://kauth.kakao.com/.well-known/jwks.json"
        public static let naverProfileURL = "https://openapi.naver.com/v1/nid/me"
        /// How far `exp`, `iat` and `nbf` may be off: 60 seconds.
        public static let clockLeeway: TimeInterval = 60
    }

    public var google: OIDCProviderSettings
    public var apple: OIDCProviderSettings
    public var kakao: OIDCProviderSettings
    public var naver: NaverSettings
    /// How far a token's `exp`, `iat` and `nbf` may be off from auth's clock (0 to 600 s).
    public var clockLeeway: TimeInterval
    /// The key sets' cache lifetime: the response's `Cache-Control: max-age`, kept within these
    /// bounds (5 minutes to 24 hours); one hour when the response gives none.
    public var keyCacheLifetime: ClosedRange<TimeInterval>
    public var defaultKeyCacheLifetime: TimeInterval
    /// A token naming a key the cached set lacks makes auth fetch the set again, at most once
    /// per this interval per provider (60 s).
    public var unknownKeyRefetchInterval: TimeInterval
    /// How long one request to a provider may take (2 s): well within a client's 3 s, so a
    /// provider that does not answer is `dependencyUnavailable` before the client gives up.
    /// (async-http-client keeps retrying a refused connection until this deadline.)
    public var requestTimeout: TimeInterval

    public init(
        google: OIDCProviderSettings = .init(issuers: Defaults.googleIssuers, jwksURL: Defaults.googleJWKSURL),
        apple: OIDCProviderSettings = .init(
            issuers: [Defaults.appleIssuer], jwksURL: Defaults.appleJWKSURL, nonceIsHashed: true),
        kakao: OIDCProviderSettings = .init(issuers: [Defaults.kakaoIssuer], jwksURL: Defaults.kakaoJWKSURL),
        naver: NaverSettings = .init(),
        clockLeeway: TimeInterval = Defaults.clockLeeway,
        keyCacheLifetime: ClosedRange<TimeInterval> = 300...86_400,
        defaultKeyCacheLifetime: TimeInterval = 3_600,
        unknownKeyRefetchInterval: TimeInterval = 60,
        requestTimeout: TimeInterval = 2
    ) {
        self.google = google
        self.apple = apple
        self.kakao = kakao
        self.naver = naver
        self.clockLeeway = clockLeeway
        self.keyCacheLifetime = keyCacheLifetime
        self.defaultKeyCacheLifetime = defaultKeyCacheLifetime
        self.unknownKeyRefetchInterval = unknownKeyRefetchInterval
        self.requestTimeout = requestTimeout
    }

    /// The OpenID Connect settings of `provider`; `nil` for Naver.
    public func oidc(_ provider: Provider) -> OIDCProviderSettings? {
        switch provider {
        case .google: google
        case .apple: apple
        case .kakao: kakao
        case .naver: nil
        }
    }

    public func isConfigured(_ provider: Provider) -> Bool {
        oidc(provider)?.isConfigured ?? naver.isConfigured
    }

    /// The providers whose sign-ins are verified.
    public var configuredProviders: [Provider] { Provider.allCases.filter(isConfigured) }

    /// The error for a sign-in with a provider that is not configured: it names the setting.
    public func refusal(for provider: Provider) -> ServiceError {
        ServiceError(
            .unauthenticated,
            "Sign-in with \(provider.rawValue) is not configured on this auth service: it has no client id for "
                + "\(provider.rawValue). Set \(Setting.clientIDs(provider)), or sign in with "
                + "another provider (for local use only, auth's \(Setting.authDevMode.flag) trusts subjects without tokens).",
            reason: IdentityRefusal.providerNotConfigured.rawValue)
    }

    /// One line per provider saying whether and how it is verified, for the start-up log.
    public var summary: [String] {
        Provider.allCases.map { provider in
            if let oidc = oidc(provider) {
                guard oidc.isConfigured else {
                    return "\(provider.rawValue): NOT verified (sign-ins refused); set \(Setting.clientIDs(provider).environmentVariable)"
                }
                return "\(provider.rawValue): verified: ID tokens from \(oidc.issuers.joined(separator: " or ")) "
                    + "for \(oidc.clientIDs.count) client id(s), keys from \(oidc.jwksURL)"
            }
            guard naver.isConfigured else {
                return "naver: NOT verified (sign-ins refused); set \(Setting.naverClientIDs.environmentVariable)"
            }
            return "naver: verified: access tokens checked at \(naver.profileURL)"
        }
    }
}
