import Foundation
import Logging
import Messaging
import OnboardingAPI

/// What an app sends to prove who is signing in (the fields of `auth.signIn` that matter here).
public struct SignInProof: Sendable, Hashable {
    public var provider: Provider
    /// Google, Apple, Kakao: the OpenID Connect ID token.
    public var idToken: String?
    /// Naver: the OAuth access token.
    public var accessToken: String?
    /// The raw nonce the app made for this sign-in, when it made one.
    public var nonce: String?

    public init(provider: Provider, idToken: String? = nil, accessToken: String? = nil, nonce: String? = nil) {
        self.provider = provider
        self.idToken = idToken
        self.accessToken = accessToken
        self.nonce = nonce
    }
}

/// Verifies sign-ins with the real providers: ID tokens of Google, Apple and Kakao against their
/// published key sets (``IDTokenChecker``, ``KeySetCache``), and Naver access tokens with Naver's
/// profile API (``NaverProfileAnswer``). Returns the provider's stable subject.
///
/// Errors (``ServiceError``):
/// - `unauthenticated` with an ``IdentityRefusal`` reason: the proof is bad, or the provider is
///   not configured (`providerNotConfigured`, naming the setting). Do not retry the same proof.
/// - `dependencyUnavailable` with the provider as reason: its keys or profile API could not be
///   reached. Retry.
///
/// Thread safety: `Sendable`; call from any task. ``verifyCached(_:)`` is synchronous and never
/// waits on I/O: it answers from cached keys, or `nil` when the async ``verify(_:)`` is needed
/// (keys not fetched yet or expired, a key the cache lacks, or Naver, which is always a call).
public final class ProviderIdentityVerifier: Sendable {
    public let settings: IdentityProviderSettings
    private let http: any IdentityHTTPClient
    private let clock: @Sendable () -> Date
    private let caches: [Provider: KeySetCache]
    private let checkers: [Provider: IDTokenChecker]

    public init(
        settings: IdentityProviderSettings, http: any IdentityHTTPClient = AsyncHTTPIdentityClient(),
        clock: @escaping @Sendable () -> Date = { Date() }, logger: Logger
    ) {
        self.settings = settings
        self.http = http
        self.clock = clock
        var caches: [Provider: KeySetCache] = [:]
        var checkers: [Provider: IDTokenChecker] = [:]
        for provider in Provider.allCases {
            guard let oidc = settings.oidc(provider), oidc.isConfigured else { continue }
            caches[provider] = KeySetCache(
                provider: provider, url: oidc.jwksURL, http: http, settings: settings, clock: clock, logger: logger)
            checkers[provider] = IDTokenChecker(provider: provider, settings: oidc, leeway: settings.clockLeeway)
        }
        self.caches = caches
        self.checkers = checkers
    }

    /// The key cache of `provider` (configured OpenID Connect providers only).
    public func keyCache(_ provider: Provider) -> KeySetCache? { caches[provider] }

    /// Verifies `proof` from cached keys alone, without waiting: the subject, the refusal, or
    /// `nil` when ``verify(_:)`` must be called (it may fetch keys or ask Naver).
    public func verifyCached(_ proof: SignInProof) -> Result<String, ServiceError>? {
        let provider = proof.provider
        guard settings.isConfigured(provider) else { return .failure(settings.refusal(for: provider)) }
        if provider == .naver {
            guard let token = proof.accessToken, !token.isEmpty else {
                return .failure(.signInRefused(.missingToken, .naver, "send Naver's access token in accessToken"))
            }
            return nil
        }
        guard let token = proof.idToken, !token.isEmpty else {
            return .failure(.signInRefused(.missingToken, provider, "send \(provider.rawValue)'s ID token in idToken"))
        }
        guard let checker = checkers[provider], let keys = caches[provider]?.fresh(now: clock()) else { return nil }
        switch checker.check(token, nonce: proof.nonce, keys: keys, now: clock()) {
        case .success(let verified): return .success(verified.subject)
        case .failure(let problem) where problem.refusal == .unknownKey && problem.keyID != nil: return nil
        case .failure(let problem): return .failure(problem.serviceError(provider))
        }
    }

    /// Verifies `proof`, fetching keys or asking Naver when needed.
    ///
    /// - Returns: the provider's stable subject for the account.
    /// - Throws: ``ServiceError`` as described on the type.
    public func verify(_ proof: SignInProof) async throws -> String {
        if let answer = verifyCached(proof) { return try answer.get() }
        let provider = proof.provider
        if provider == .naver { return try await verifyNaver(accessToken: proof.accessToken ?? "") }
        guard let checker = checkers[provider], let cache = caches[provider] else {
            throw settings.refusal(for: provider)
        }
        let token = proof.idToken ?? ""
        let keys: ProviderKeySet
        do {
            keys = try await cache.current()
        } catch {
            throw ServiceError.providerUnavailable(provider, "its signing keys could not be fetched (\(error))")
        }
        switch checker.check(token, nonce: proof.nonce, keys: keys, now: clock()) {
        case .success(let verified):
            return verified.subject
        case .failure(let problem) where problem.refusal == .unknownKey && problem.keyID != nil:
            let refreshed: ProviderKeySet?
            do {
                refreshed = try await cache.refetchForUnknownKey()
            } catch {
                throw ServiceError.providerUnavailable(provider, "its signing keys could not be fetched again (\(error))")
            }
            guard let refreshed else { throw problem.serviceError(provider) }
            return try checker.check(token, nonce: proof.nonce, keys: refreshed, now: clock())
                .mapError { $0.serviceError(provider) }.get().subject
        case .failure(let problem):
            throw problem.serviceError(provider)
        }
    }

    private func verifyNaver(accessToken: String) async throws -> String {
        let answer: HTTPAnswer
        do {
            answer = try await http.get(settings.naver.profileURL, bearer: accessToken, timeout: settings.requestTimeout)
        } catch {
            throw ServiceError.providerUnavailable(.naver, "its profile API did not answer (\(error))")
        }
        return try NaverProfileAnswer.subject(from: answer).get()
    }
}
