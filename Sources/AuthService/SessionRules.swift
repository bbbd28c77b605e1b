import Foundation
import Messaging
import Synchronization

// What every store of auth decides the same way about sessions, apart from the SQL that reads
// and writes them (see also ``SessionPolicy``).

/// How a session ended, and so how a retry that presents its token is answered.
///
/// A store remembers the ending of each session that a request ended (by the digest of the
/// token presented) for ``retention``, so a retry whose first reply was lost is answered as the
/// first was, and publishes nothing more.
package enum SessionEnding: String, Sendable {
    /// `auth.signOut`: this session only; the account stays.
    case signOut
    /// `auth.withdraw`: the account was deleted, with every session.
    case withdrawal
    /// Not used for ``SessionPolicy/lifetime``.
    case expired
    /// Ended by a sign-in beyond ``SessionPolicy/maximumPerAccount``.
    case evicted

    /// How long endings are remembered for retries (24 hours).
    package static let retention: TimeInterval = 24 * 60 * 60

    /// A retried withdrawal of a session that ended this way answers its uid only when the
    /// session was withdrawn: an ended session cannot delete the account. (A retried sign-out
    /// answers its uid however the session ended: it asked for the session to be over, and it is.)
    package var answersWithdrawal: Bool { self == .withdrawal }
}

/// What a session token is, as of a moment.
package enum SessionLookup: Sendable, Hashable {
    /// Live; `renew`: its last use should be recorded (a write) to slide its expiry.
    case live(uid: String, renew: Bool)
    /// Past its lifetime, not yet ended in the store.
    case expired(uid: String)
    /// Not a session (any more): how it ended, when that is known.
    case ended(SessionEnding?)

    /// What a session found in the store, last used at `lastUsed`, is at `now`.
    package static func found(uid: String, lastUsed: Date, policy: SessionPolicy, now: Date) -> SessionLookup {
        if policy.isExpired(lastUsed: lastUsed, now: now) { return .expired(uid: uid) }
        return .live(uid: uid, renew: policy.needsRenewal(lastUsed: lastUsed, now: now))
    }
}

/// The errors for a token that is not a live session.
package enum SessionRefusal {
    /// The refusal for a session that ended this way (`nil`: unknown, or forgotten).
    package static func of(_ ending: SessionEnding?) -> ServiceError {
        switch ending {
        case .expired?: expired
        case .evicted?: evicted
        default: unknown
        }
    }

    package static let expired = ServiceError(
        .unauthenticated, "The session expired: it was not used for too long. Sign in again.", reason: "sessionExpired")
    package static let evicted = ServiceError(
        .unauthenticated,
        "The session was ended because the account signed in on too many devices (the oldest session ends). Sign in again.",
        reason: "sessionEvicted")
    package static let unknown = ServiceError(
        .unauthenticated, "The session token is not valid: it is unknown, signed out or withdrawn. Sign in again.")
}

/// When sign-ins next look for other accounts' expired sessions to prune: at most once a second
/// while a look finds fewer than ``batch`` (an expired session is refused when presented
/// whether or not it was pruned yet), at once after a full one. One per store.
///
/// Thread safety: any task may use it.
package final class SessionPruneSchedule: Sendable {
    /// How many expired sessions of other accounts one sign-in prunes, at most (each with a
    /// `SignedOut` event for its account), so that pruning costs every sign-in little and
    /// still drains what expires.
    package static let batch = 16

    static let interval: TimeInterval = 1

    private let next = Mutex(Date.distantPast)

    package init() {}

    /// Whether a sign-in at `now` should look.
    package func isDue(at now: Date) -> Bool {
        next.withLock { now >= $0 }
    }

    /// A look at `now` found `count` sessions to prune.
    package func looked(at now: Date, found count: Int) {
        next.withLock { $0 = count >= Self.batch ? .distantPast : now.addingTimeInterval(Self.interval) }
    }
}
