import Foundation
import Messaging
import OnboardingAPI

/// Why a sign-in's proof was refused: the `reason` of its `unauthenticated` error.
///
/// Every case means "this proof will never work": the app gets a fresh token from the provider
/// (or signs in again) rather than resending it.
public enum IdentityRefusal: String, Sendable, CaseIterable {
    /// The provider has no client id configured on this auth service.
    case providerNotConfigured
    /// The request lacks the proof this provider needs (`idToken`, or Naver's `accessToken`).
    case missingToken
    /// Not a JWT (three base64url parts with JSON header and payload), or a claim is of the
    /// wrong type, or one every ID token carries is missing: `iss`, `sub`, `aud`, `exp`, `iat`
    /// (an empty `sub` or `aud` list counts as missing).
    case malformedToken
    /// The header's `alg` is not the one the named key is for (`none`, `HS256`…).
    case algorithmNotAllowed
    /// The header names no key (`kid`), or one the provider does not publish, even after
    /// fetching its keys again.
    case unknownKey
    /// The signature does not verify with the named key.
    case badSignature
    /// `iss` is present and not the provider's issuer.
    case wrongIssuer
    /// `aud` is present and names none of the configured client ids, or also an audience that
    /// is not one.
    case wrongAudience
    /// `exp` has passed (beyond the leeway).
    case tokenExpired
    /// `iat` or `nbf` is in the future (beyond the leeway).
    case tokenNotYetValid
    /// The app sent a `nonce` and the token carries another one (or none).
    case nonceMismatch
    /// Naver refused the access token (its codes `024`, `028`: invalid or expired).
    case providerRefusedToken
}

extension ServiceError {
    /// `unauthenticated` for a refused sign-in, with `refusal` as its reason.
    public static func signInRefused(_ refusal: IdentityRefusal, _ provider: Provider, _ detail: String) -> ServiceError {
        ServiceError(
            .unauthenticated,
            "Sign-in with \(provider.rawValue) refused: \(detail). Get a fresh token from \(provider.rawValue) and sign in again.",
            reason: refusal.rawValue)
    }

    /// `dependencyUnavailable` (reason: the provider) when the provider could not be asked.
    public static func providerUnavailable(_ provider: Provider, _ detail: String) -> ServiceError {
        ServiceError(
            .dependencyUnavailable,
            "Could not check the sign-in with \(provider.rawValue): \(detail). Nothing was changed; try again shortly.",
            reason: provider.rawValue)
    }
}
