import Synchronization

/// A token bucket per client address: `burst` requests at once, refilled at `perSecond`.
///
/// Thread safety: every method may be called from any task (the buckets sit behind a mutex).
/// Memory stays bounded: at most `maxClients` buckets are kept; when that many are full, those
/// that have refilled completely (and so are no different from new ones) are dropped first.
public final class RateLimiter: Sendable {
    /// How many requests, how fast.
    public struct Rule: Sendable, Hashable {
        public var burst: Double
        public var perSecond: Double

        public init(burst: Double, perSecond: Double) {
            self.burst = max(1, burst)
            self.perSecond = max(0.001, perSecond)
        }

        /// `count` per minute, all of them at once if need be.
        public static func perMinute(_ count: Int) -> Rule {
            Rule(burst: Double(count), perSecond: Double(count) / 60)
        }
    }

    /// The answer to one request.
    public enum Decision: Sendable, Hashable {
        case allowed
        /// Refused; a token is back after this many whole seconds (at least 1).
        case limited(retryAfter: Int)
    }

    private struct Bucket {
        var tokens: Double
        var updated: ContinuousClock.Instant
    }

    public let rule: Rule
    private let maxClients: Int
    private let clock = ContinuousClock()
    private let buckets = Mutex<[String: Bucket]>([:])

    public init(rule: Rule, maxClients: Int = 100_000) {
        self.rule = rule
        self.maxClients = maxClients
    }

    /// Takes a token for `client`, or says how long to wait.
    public func take(for client: String) -> Decision {
        let now = clock.now
        return buckets.withLock { buckets in
            var bucket = buckets[client] ?? Bucket(tokens: rule.burst, updated: now)
            bucket.tokens = refilled(bucket, now: now)
            bucket.updated = now
            let decision: Decision
            if bucket.tokens >= 1 {
                bucket.tokens -= 1
                decision = .allowed
            } else {
                let wait = (1 - bucket.tokens) / rule.perSecond
                decision = .limited(retryAfter: max(1, Int(wait.rounded(.up))))
            }
            if buckets[client] == nil, buckets.count >= maxClients {
                buckets = buckets.filter { refilled($0.value, now: now) < rule.burst }
                if buckets.count >= maxClients { buckets.removeAll(keepingCapacity: true) }
            }
            buckets[client] = bucket
            return decision
        }
    }

    private func refilled(_ bucket: Bucket, now: ContinuousClock.Instant) -> Double {
        let elapsed = bucket.updated.duration(to: now)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        return min(rule.burst, bucket.tokens + seconds * rule.perSecond)
    }
}
