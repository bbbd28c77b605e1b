import AuthIdentity
import Foundation
import OnboardingAPI

/// One durable unlink: written in a withdrawal's transaction (see `AuthStore+Unlink.swift`), sent
/// by ``UnlinkWorker``, kept until the provider has unlinked the account or refused for good.
///
/// The decisions about it are pure functions of values: ``plan(_:)`` (what to send, or why
/// nothing), and ``step(after:now:backoff:)`` (what a provider's answer means for the job).
public struct UnlinkJob: Sendable, Hashable {
    /// The withdrawn account.
    public var uid: String
    public var provider: Provider
    /// The provider's id for the account (Kakao's unlink names the user by it).
    public var subject: String
    /// What the provider's unlink needs, stored at sign-in: Apple's refresh token, Naver's or
    /// Google's access token; `nil` for Kakao, or when the sign-in gave none. A secret: never logged.
    public var token: String?
    /// Failed attempts so far.
    public var attempts: Int
    public var createdAt: Date
    public var nextAttemptAt: Date
    /// The last attempt's failure (never holds the token).
    public var lastError: String?
    /// Which claim of a shared store holds the job (see `AuthStorage.claimDueUnlinkJobs`): what
    /// this claimant records is kept only while the claim is still its own. `nil`: one claimant.
    public var claim: String?

    public init(
        uid: String, provider: Provider, subject: String, token: String?, attempts: Int = 0, createdAt: Date,
        nextAttemptAt: Date, lastError: String? = nil, claim: String? = nil
    ) {
        self.uid = uid
        self.provider = provider
        self.subject = subject
        self.token = token
        self.attempts = attempts
        self.createdAt = createdAt
        self.nextAttemptAt = nextAttemptAt
        self.lastError = lastError
        self.claim = claim
    }

    /// What to send for this job with `settings`, or why the job is dropped unsent.
    public func plan(_ settings: UnlinkSettings) -> UnlinkPlan {
        let token = self.token.flatMap { $0.isEmpty ? nil : $0 }
        switch provider {
        case .apple:
            guard let apple = settings.apple else { return .drop(.notConfigured(.apple)) }
            guard let token else { return .drop(.nothingStored(.apple)) }
            return .send(.apple(refreshToken: token, apple))
        case .kakao:
            guard let kakao = settings.kakao else { return .drop(.notConfigured(.kakao)) }
            return .send(.kakao(subject: subject, kakao))
        case .naver:
            guard let naver = settings.naver else { return .drop(.notConfigured(.naver)) }
            guard let token else { return .drop(.nothingStored(.naver)) }
            return .send(.naver(accessToken: token, naver))
        case .google:
            guard let google = settings.google else { return .drop(.notConfigured(.google)) }
            guard let token else { return .drop(.nothingStored(.google)) }
            return .send(.google(token: token, google))
        }
    }

    /// What `outcome` (the provider's answer to this job's request, at `now`) means for the job.
    public func step(after outcome: UnlinkOutcome, now: Date, backoff: UnlinkBackoff) -> UnlinkStep {
        switch outcome {
        case .done:
            return .unlinked
        case .refused(let reason):
            return .refused(reason)
        case .retryLater(let reason):
            let attempts = attempts + 1
            return .retry(at: now.addingTimeInterval(backoff.delay(afterFailures: attempts)), attempts: attempts, error: reason)
        }
    }
}

/// What an ``UnlinkJob`` sends.
public enum UnlinkPlan: Sendable, Hashable {
    case send(UnlinkTarget)
    /// Nothing can be sent: the job is dropped (and logged).
    case drop(UnlinkDrop)
}

/// The provider call of an unlink, with what it needs (turned into an ``UnlinkRequest`` when
/// sent: Apple's needs a freshly signed client secret).
public enum UnlinkTarget: Sendable, Hashable {
    case apple(refreshToken: String, UnlinkSettings.Apple)
    case kakao(subject: String, UnlinkSettings.Kakao)
    case naver(accessToken: String, UnlinkSettings.Naver)
    case google(token: String, UnlinkSettings.Google)

    /// The request to send.
    ///
    /// - Throws: when Apple's client secret cannot be signed.
    func request() async throws -> UnlinkRequest {
        switch self {
        case .apple(let token, let settings):
            return .apple(refreshToken: token, clientSecret: try await AppleClientSecret.make(settings), settings: settings)
        case .kakao(let subject, let settings): return .kakao(subject: subject, settings: settings)
        case .naver(let token, let settings): return .naver(accessToken: token, settings: settings)
        case .google(let token, let settings): return .google(token: token, settings: settings)
        }
    }
}

/// Why an unlink job is dropped without a call.
public enum UnlinkDrop: Sendable, Hashable, CustomStringConvertible {
    /// The provider has no unlink credentials on this auth service.
    case notConfigured(Provider)
    /// The sign-in left nothing to unlink with (no Apple authorization code, no Google access token).
    case nothingStored(Provider)

    public var description: String {
        switch self {
        case .notConfigured(let provider):
            "unlinking at \(provider.rawValue) is not configured; withdrawals are not unlinked there"
        case .nothingStored(let provider):
            "no \(provider.rawValue) token was stored at sign-in; nothing to unlink with"
        }
    }
}

/// What happens to an ``UnlinkJob`` after an attempt.
public enum UnlinkStep: Sendable, Hashable {
    /// The provider unlinked the account (or it was not linked any more): delete the job.
    case unlinked
    /// Try again at `at`, after `attempts` failures; `error` is kept for health.
    case retry(at: Date, attempts: Int, error: String)
    /// Refused for good: delete the job and log why.
    case refused(String)
}

/// What became of one job, for observers (tests wait on these).
public enum UnlinkEvent: Sendable, Hashable {
    case unlinked(uid: String, provider: Provider)
    case retrying(uid: String, provider: Provider, attempts: Int, error: String)
    case refused(uid: String, provider: Provider, error: String)
    case dropped(uid: String, provider: Provider, UnlinkDrop)
}
