import Messaging

/// Exponential backoff: `initial`, doubled each attempt, at most `maximum`.
public struct RetryPolicy: Sendable, Hashable {
    public var initial: Duration
    public var maximum: Duration

    public init(initial: Duration = .milliseconds(100), maximum: Duration = .seconds(5)) {
        self.initial = initial
        self.maximum = maximum
    }

    /// The wait before retry number `attempt` (1 is the first retry).
    public func delay(attempt: Int) -> Duration {
        let factor = 1 << min(max(attempt - 1, 0), 20)
        return min(initial * factor, maximum)
    }
}

extension RetryPolicy {
    /// Runs `operation` until it succeeds, waiting ``delay(attempt:)`` after each failure: for
    /// work that must happen eventually and has no one waiting for an answer (following a feed,
    /// asking where a stream starts). A call that someone waits for retries by a
    /// ``RetrySchedule`` instead, with a deadline.
    ///
    /// - Parameter failed: hears each failure, with the number of the retry to come (1 for the
    ///   first) and the wait before it; for the log.
    /// - Returns: the result, or `nil` once the calling task is cancelled (no attempt is started
    ///   after that).
    public func untilSuccess<T>(
        _ operation: () async throws -> T, failed: (_ error: any Error, _ retry: Int, _ delay: Duration) -> Void
    ) async -> T? {
        var attempt = 0
        while !Task.isCancelled {
            do {
                return try await operation()
            } catch {
                if Task.isCancelled { return nil }
                attempt += 1
                let delay = delay(attempt: attempt)
                failed(error, attempt, delay)
                guard (try? await Task.sleep(for: delay)) != nil else { return nil }
            }
        }
        return nil
    }
}

extension ErrorCode {
    /// The failures that may pass by themselves, after which a request that is safe to repeat
    /// is sent again: no reply in time (`timeout`: the service may or may not have acted),
    /// nothing listening (`noResponder`), a service that turned the request away before
    /// handling it (`overloaded`, `shuttingDown`), and a service whose store or dependency (a
    /// provider's key set, another service) failed for a moment (`storeUnavailable`,
    /// `dependencyUnavailable`). The one list of them: clients, the services' own calls and
    /// the chaos test all retry on these.
    ///
    /// Not `closed`: that is the caller's own bus shutting down, and no retry can succeed.
    /// Not a service's refusal (`profileExists`, `usernameTaken`, `unauthenticated`, …): the
    /// same request would be refused again.
    public static let retryable: Set<ErrorCode> = [
        .timeout, .noResponder, .overloaded, .shuttingDown, .storeUnavailable, .dependencyUnavailable,
    ]

    /// The failures that prove the request was not acted on: never delivered (`noResponder`)
    /// or turned away before any handler ran (`overloaded`, `shuttingDown`). Retrying on these
    /// alone is safe even for a request that is not idempotent, such as `auth.signIn`.
    public static let notHandled: Set<ErrorCode> = [.noResponder, .overloaded, .shuttingDown]
}

/// What became of a call's attempts that failed: their codes, in order.
public struct RetryLog: Sendable, Hashable {
    public var failures: [ErrorCode] = []

    public init() {}

    /// Whether an attempt may have been acted on without its reply arriving (it timed out):
    /// then a later attempt can find the first one's work done (`profileExists`, an account
    /// that is not new…).
    public var mayHaveActedBefore: Bool { failures.contains(.timeout) }
    /// Whether the request was sent more than once.
    public var resent: Bool { !failures.isEmpty }
}

/// When to send a request again, as a value: which failures are retried, the backoff between
/// attempts, and the deadline for the whole call. ``MessageBus/callRetrying(_:to:source:uid:sessionToken:serviceToken:correlationId:attachment:timeout:retry:deadline:retryingOn:)``
/// carries it out; this type only decides, so it is tested without a bus or a clock.
public struct RetrySchedule: Sendable, Hashable {
    /// The backoff between attempts, before jitter.
    public var backoff: RetryPolicy
    /// The longest the whole call may take, from the first attempt to the last reply.
    public var deadline: Duration
    /// How long one attempt waits for its reply (shortened so that no attempt outlives the
    /// deadline).
    public var attemptTimeout: Duration
    /// The error codes that are retried; any other error ends the call at once.
    public var retryable: Set<ErrorCode>
    /// The share of each backoff delay that is random, from 0 (none) to 1: the wait is between
    /// `(1 - jitter) × delay` and `delay`, so callers that failed together do not all come back
    /// at the same moment.
    public var jitter: Double

    /// An attempt is not started with less time than this before the deadline: it could hardly
    /// get a reply.
    public static let shortestAttempt: Duration = .milliseconds(20)

    public init(
        backoff: RetryPolicy = RetryPolicy(), deadline: Duration, attemptTimeout: Duration = Defaults.requestTimeout,
        retryable: Set<ErrorCode> = ErrorCode.retryable, jitter: Double = 0.5
    ) {
        self.backoff = backoff
        self.deadline = deadline
        self.attemptTimeout = attemptTimeout
        self.retryable = retryable
        self.jitter = min(max(jitter, 0), 1)
    }

    /// The timeout of the first attempt: the attempt timeout, or the deadline when that is
    /// shorter (but at least ``shortestAttempt``).
    public var firstAttemptTimeout: Duration {
        max(min(attemptTimeout, deadline), Self.shortestAttempt)
    }

    /// What to do after an attempt failed.
    public enum Decision: Sendable, Hashable {
        /// Wait `delay`, then send again with this `timeout`.
        case retry(delay: Duration, timeout: Duration)
        /// Stop, and throw the error of the attempt that just failed.
        case giveUp
    }

    /// Decides whether to send again after attempt number `attempt` (1 is the first) failed with
    /// `error`, `elapsed` after the call began.
    ///
    /// - Parameter random: a number in `0..<1` that picks the jitter.
    public func decision(after error: ServiceError, attempt: Int, elapsed: Duration, random: Double) -> Decision {
        guard retryable.contains(error.code) else { return .giveUp }
        let delay = backoff.delay(attempt: attempt) * (1 - jitter * min(max(random, 0), 1))
        let remaining = deadline - elapsed - delay
        guard remaining >= Self.shortestAttempt else { return .giveUp }
        return .retry(delay: delay, timeout: min(attemptTimeout, remaining))
    }
}
