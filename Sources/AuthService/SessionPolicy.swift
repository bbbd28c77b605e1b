import Foundation

/// How long sessions live and how many an account may hold: pure decisions, tested without a
/// database.
///
/// - A session expires ``lifetime`` (30 days) after it was last used; every use slides it. So that
///   checking a session is not a write each time, its last use is recorded again only once it is
///   ``renewalInterval`` (1 hour; for a lifetime under a day, a 24th of it) old: a session may
///   therefore end up to that much earlier than `lifetime` after its very last use. (Lifetimes
///   under a day are for tests and demos; a 24th keeps them sliding with each use, as a day's.)
/// - An account holds at most ``maximumPerAccount`` (10) live sessions: a sign-in beyond that ends
///   the least recently used ones.
/// - Expired sessions are deleted (pruned) at sign-ins; an expired or evicted session's token
///   is answered `unauthenticated` with reason `sessionExpired` or `sessionEvicted` for a day
///   afterwards, then as unknown.
///
/// Thread safety: an immutable value.
public struct SessionPolicy: Sendable, Hashable {
    public var lifetime: TimeInterval
    public var maximumPerAccount: Int
    public var renewalInterval: TimeInterval

    /// - Parameter renewalInterval: `nil`: 1 hour, or a 24th of the lifetime when that is shorter.
    ///   Never more than the lifetime.
    public init(lifetime: TimeInterval = 30 * 86_400, maximumPerAccount: Int = 10, renewalInterval: TimeInterval? = nil) {
        self.lifetime = lifetime
        self.maximumPerAccount = maximumPerAccount
        self.renewalInterval = min(renewalInterval ?? min(3_600, lifetime / 24), lifetime)
    }

    /// A session last used at `lastUsed` has expired at `now`.
    public func isExpired(lastUsed: Date, now: Date) -> Bool {
        now.timeIntervalSince(lastUsed) >= lifetime
    }

    /// Whether a use at `now` should record itself (the recorded last use is old enough).
    public func needsRenewal(lastUsed: Date, now: Date) -> Bool {
        now.timeIntervalSince(lastUsed) >= renewalInterval
    }

    /// Sessions last used before this are expired at `now`.
    public func expiryCutoff(now: Date) -> Date { now.addingTimeInterval(-lifetime) }

    /// Of an account's sessions, most recently used first, those a sign-in must end so that at
    /// most ``maximumPerAccount`` remain.
    public func evicted<Session>(_ newestFirst: [Session]) -> ArraySlice<Session> {
        newestFirst.dropFirst(maximumPerAccount)
    }

    /// Of an account's sessions at a sign-in (its new one included), most recently used first,
    /// those the sign-in ends and how: the expired ones, and those beyond ``maximumPerAccount``
    /// (``evicted(_:)``), each once. Every store applies this rule to the rows it read.
    package func endings<Session>(
        atSignIn newestFirst: [Session], now: Date, lastUsed: (Session) -> Date
    ) -> [(session: Session, ending: SessionEnding)] {
        let expired = newestFirst.indices.filter { isExpired(lastUsed: lastUsed(newestFirst[$0]), now: now) }
        let evicted = evicted(Array(newestFirst.indices)).filter { !expired.contains($0) }
        return expired.map { (newestFirst[$0], .expired) } + evicted.map { (newestFirst[$0], .evicted) }
    }
}
