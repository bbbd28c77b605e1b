import AuthIdentity
import Foundation
import Messaging
import OnboardingAPI

/// Proves that the person signing in controls the provider account they name.
///
/// ``ProviderIdentityVerifier`` (in `AuthIdentity`) is the real one: it checks Google, Apple and
/// Kakao ID tokens against the providers' published keys and asks Naver's profile API about
/// access tokens, and returns the provider's subject. Auth keys accounts on the subject this
/// returns, never on the one sent.
///
/// Thread safety: implementations are `Sendable`; auth calls `verify` from many tasks at once.
public protocol IdentityVerifier: Sendable {
    /// Checks a sign-in and returns the verified provider subject.
    ///
    /// - Throws: ``ServiceError`` `unauthenticated` when the proof fails (its `reason` says
    ///   why), `invalidRequest` when the input is malformed, or `dependencyUnavailable` when the
    ///   provider could not be asked (retry).
    func verify(_ request: SignIn) async throws -> String

    /// The same answer as ``verify(_:)`` when it can be given at once, without waiting on
    /// anything slow (no network, no lock held for long); `nil` when ``verify(_:)`` must be
    /// awaited. For a caller on a thread that must not suspend (the bus's own): try this first.
    func verifyCached(_ request: SignIn) -> Result<String, ServiceError>?
}

extension IdentityVerifier {
    /// By default nothing is known at once.
    public func verifyCached(_ request: SignIn) -> Result<String, ServiceError>? { nil }

    /// The earlier form of ``verify(_:)``, for callers that have no `SignIn` at hand: without
    /// `accessToken` and `nonce`, so Naver sign-ins and nonces cannot be checked through it.
    public func verify(provider: Provider, subject: String, idToken: String?) async throws -> String {
        try await verify(SignIn(provider: provider, subject: subject, idToken: idToken))
    }
}

/// A verifier that never waits (no network, no other service): auth then signs people in on its
/// hot path, on the bus's own thread, many sign-ins to a transaction.
public protocol ImmediateIdentityVerifier: IdentityVerifier {
    /// Checks a sign-in at once; the same answers and errors as ``IdentityVerifier/verify(_:)``.
    func verifyNow(_ request: SignIn) throws -> String
}

extension ImmediateIdentityVerifier {
    public func verify(_ request: SignIn) async throws -> String {
        try verifyNow(request)
    }

    public func verifyCached(_ request: SignIn) -> Result<String, ServiceError>? {
        Result { try verifyNow(request) }.mapError { $0 as? ServiceError ?? ServiceError(.internalError, "\($0)") }
    }
}

/// Local development only: trusts the subject as sent, with or without an ID token.
///
/// The subject must hold no control character anywhere (a NUL, a tab, a line break: see
/// ``SignIn/subjectProblem(_:)``, the rule of every mode); it is then trimmed of surrounding
/// white space and must be 1 to ``maximumSubjectLength`` characters long. Never use this in
/// production: anyone can sign in as anyone.
public struct DevModeIdentityVerifier: ImmediateIdentityVerifier {
    public static let maximumSubjectLength = 256

    public init() {}

    /// - Returns: the trimmed subject.
    /// - Throws: ``ServiceError`` `invalidRequest` when the subject holds a control character,
    ///   or is empty or too long once trimmed.
    public func verifyNow(_ request: SignIn) throws -> String {
        let subject = request.subject
        // The usual subject (printable ASCII throughout, no space at either end, short) needs no
        // Unicode work; anything else (a C1 control such as U+0085 included) is checked below.
        if let first = subject.utf8.first, let last = subject.utf8.last, first != 0x20, last != 0x20,
            subject.utf8.count <= Self.maximumSubjectLength, subject.utf8.allSatisfy(Self.isPrintableASCII)
        {
            return subject
        }
        if let problem = SignIn.subjectProblem(subject) { throw problem }
        let trimmed = subject.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !trimmed.isEmpty else {
            throw ServiceError(.invalidRequest, "Field 'subject' is empty; send the provider account's id.")
        }
        guard trimmed.count <= Self.maximumSubjectLength else {
            throw ServiceError(
                .invalidRequest,
                "Field 'subject' has \(trimmed.count) characters; at most \(Self.maximumSubjectLength) are accepted.")
        }
        return trimmed
    }
}

extension DevModeIdentityVerifier {
    private static func isPrintableASCII(_ byte: UInt8) -> Bool { byte >= 0x20 && byte < 0x7F }
}

/// The real providers, as auth's ``IdentityVerifier``: the request's `idToken`, `accessToken`
/// and `nonce` are the proof; its `subject` is not trusted (the verified one is returned).
/// Not immediate: a key set may have to be fetched, and Naver is always asked.
extension ProviderIdentityVerifier: IdentityVerifier {
    public func verify(_ request: SignIn) async throws -> String {
        try await verify(Self.proof(request))
    }

    public func verifyCached(_ request: SignIn) -> Result<String, ServiceError>? {
        verifyCached(Self.proof(request))
    }

    static func proof(_ request: SignIn) -> SignInProof {
        SignInProof(provider: request.provider, idToken: request.idToken, accessToken: request.accessToken, nonce: request.nonce)
    }
}
