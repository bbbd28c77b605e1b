import Foundation
import Messaging
import OnboardingAPI

/// Proves that the person signing in controls the provider account they name.
///
/// This is the seam for verifying real provider ID tokens (Google, Apple, Kakao, Naver): an
/// implementation checks `idToken`'s signature, issuer, audience and expiry, and returns the
/// token's `sub`. Auth keys accounts on the subject this returns, never on the one sent.
///
/// Thread safety: implementations are `Sendable`; auth calls `verify` from many tasks at once.
public protocol IdentityVerifier: Sendable {
    /// Checks a sign-in and returns the verified provider subject.
    ///
    /// - Throws: ``ServiceError`` `unauthenticated` when the proof fails, `invalidRequest` when
    ///   the input is malformed, or `dependencyUnavailable` when the provider could not be asked.
    func verify(provider: Provider, subject: String, idToken: String?) async throws -> String
}

/// A verifier that never waits (no network, no other service): auth then signs people in on its
/// hot path, on the bus's own thread, many sign-ins to a transaction.
public protocol ImmediateIdentityVerifier: IdentityVerifier {
    /// Checks a sign-in at once; the same answers and errors as ``IdentityVerifier/verify(provider:subject:idToken:)``.
    func verifyNow(provider: Provider, subject: String, idToken: String?) throws -> String
}

extension ImmediateIdentityVerifier {
    public func verify(provider: Provider, subject: String, idToken: String?) async throws -> String {
        try verifyNow(provider: provider, subject: subject, idToken: idToken)
    }
}

/// Local development only: trusts the subject as sent, with or without an ID token.
///
/// The subject is trimmed of surrounding white space and must then be 1 to
/// ``maximumSubjectLength`` characters long. Never use this in production: anyone can sign in
/// as anyone.
public struct DevModeIdentityVerifier: ImmediateIdentityVerifier {
    public static let maximumSubjectLength = 256

    public init() {}

    /// - Returns: the trimmed subject.
    /// - Throws: ``ServiceError`` `invalidRequest` when the subject is empty or too long.
    public func verifyNow(provider: Provider, subject: String, idToken: String?) throws -> String {
        // The usual subject (printable ASCII at both ends, short) needs no Unicode work.
        if let first = subject.utf8.first, let last = subject.utf8.last, Self.isPrintableASCII(first),
            Self.isPrintableASCII(last), subject.utf8.count <= Self.maximumSubjectLength
        {
            return subject
        }
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
    private static func isPrintableASCII(_ byte: UInt8) -> Bool { byte > 0x20 && byte < 0x7F }
}

/// What auth uses when dev mode is off and no real verifier was given: it refuses every sign-in.
struct UnavailableIdentityVerifier: ImmediateIdentityVerifier {
    func verifyNow(provider: Provider, subject: String, idToken: String?) throws -> String {
        throw ServiceError(
            .unauthenticated,
            "Verifying \(provider.rawValue) ID tokens is not built yet, so this auth service cannot sign anyone in. "
                + "For local use, start auth with --dev-mode (or ONBOARDING_AUTH_DEV_MODE=1).")
    }
}
