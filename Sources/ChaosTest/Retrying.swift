import Foundation
import Messaging
import OnboardingAPI

/// The failures after which the chaos test sends a request again: the bus's own (`timeout`,
/// `noResponder`), a service turning work away (`overloaded`, `shuttingDown`), and a service
/// whose dependency or store failed while another service was being killed.
public let transientErrorCodes: Set<ErrorCode> = [
    .timeout, .noResponder, .overloaded, .shuttingDown, .dependencyUnavailable, .storeUnavailable,
]

/// What happened to one call over all its attempts.
public struct CallLog: Sendable {
    /// The codes of the failed attempts, in order.
    public var failures: [ErrorCode] = []

    public init() {}

    /// Whether an attempt may have been acted on without its reply arriving: then a later
    /// attempt can find the first one's work done (`profileExists`, an account that is not new…).
    public var mayHaveActedBefore: Bool { failures.contains(.timeout) }
    public var resent: Bool { !failures.isEmpty }
}

/// Sends requests again after transient failures, with exponential backoff and jitter, until a
/// deadline.
///
/// The one place the chaos test retries: when `MessageBus.callRetrying` lands in OnboardingAPI,
/// ``call(_:to:uid:sessionToken:serviceToken:attachment:until:log:)`` can become a call to it
/// (keeping the failure log, which callers use to tell a resend's answers apart).
public struct RetryingCaller: Sendable {
    public let bus: any MessageBus
    public let source: String
    /// How long one attempt waits for its reply.
    public let attemptTimeout: Duration
    public let firstBackoff: Duration
    public let maximumBackoff: Duration

    public init(
        bus: any MessageBus, source: String, attemptTimeout: Duration,
        firstBackoff: Duration = .milliseconds(50), maximumBackoff: Duration = .seconds(2)
    ) {
        self.bus = bus
        self.source = source
        self.attemptTimeout = attemptTimeout
        self.firstBackoff = firstBackoff
        self.maximumBackoff = maximumBackoff
    }

    /// Sends `request` until it is answered, a non-transient error comes back, or `deadline`
    /// passes; every attempt carries the same request (so the same idempotency key).
    ///
    /// - Throws: the service's refusal at once; the last transient ``ServiceError`` once the
    ///   deadline has passed; `CancellationError` when the task is cancelled.
    public func call<Request: APIRequest>(
        _ request: Request, to endpoint: Endpoint, uid: String? = nil, sessionToken: String? = nil,
        serviceToken: String? = nil, attachment: Data? = nil, until deadline: ContinuousClock.Instant,
        log: inout CallLog
    ) async throws -> Request.Response {
        let clock = ContinuousClock()
        var attempt = 0
        while true {
            let left = clock.now.duration(to: deadline)
            let timeout = max(min(attemptTimeout, left), .milliseconds(50))
            do {
                return try await bus.call(
                    request, to: endpoint, source: source, uid: uid, sessionToken: sessionToken,
                    serviceToken: serviceToken, attachment: attachment, timeout: timeout)
            } catch let error as ServiceError {
                guard transientErrorCodes.contains(error.code) else { throw error }
                log.failures.append(error.code)
                attempt += 1
                let ceiling = min(firstBackoff * (1 << min(attempt - 1, 16)), maximumBackoff)
                let delay = ceiling * Double.random(in: 0.5...1)
                guard clock.now.advanced(by: delay).duration(to: deadline) > .milliseconds(50) else { throw error }
                try await Task.sleep(for: delay)
            }
        }
    }

    /// ``call(_:to:uid:sessionToken:serviceToken:attachment:until:log:)`` without a log.
    public func call<Request: APIRequest>(
        _ request: Request, to endpoint: Endpoint, uid: String? = nil, sessionToken: String? = nil,
        serviceToken: String? = nil, attachment: Data? = nil, until deadline: ContinuousClock.Instant
    ) async throws -> Request.Response {
        var log = CallLog()
        return try await call(
            request, to: endpoint, uid: uid, sessionToken: sessionToken, serviceToken: serviceToken,
            attachment: attachment, until: deadline, log: &log)
    }
}
