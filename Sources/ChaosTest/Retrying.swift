import Foundation
import Messaging
import OnboardingAPI

/// What happened to one call over all its attempts.
public typealias CallLog = RetryLog

/// Sends requests again after failures that may pass (``ErrorCode/retryable``), with
/// exponential backoff and jitter, until a deadline: `MessageBus.call(_:to:…:schedule:log:)`
/// with the chaos test's backoff and an absolute deadline.
public struct RetryingCaller: Sendable {
    public let bus: any MessageBus
    public let source: String
    /// How long one attempt waits for its reply.
    public let attemptTimeout: Duration
    public let backoff: RetryPolicy

    public init(
        bus: any MessageBus, source: String, attemptTimeout: Duration,
        backoff: RetryPolicy = RetryPolicy(initial: .milliseconds(50), maximum: .seconds(2))
    ) {
        self.bus = bus
        self.source = source
        self.attemptTimeout = attemptTimeout
        self.backoff = backoff
    }

    /// Sends `request` until it is answered, an error that will not pass comes back, or
    /// `deadline` passes; every attempt carries the same request (so the same idempotency key).
    ///
    /// - Throws: the service's refusal at once; the last attempt's ``ServiceError`` once the
    ///   deadline has passed (`timeout` when an attempt timed out); `CancellationError` when
    ///   the task is cancelled.
    public func call<Request: APIRequest>(
        _ request: Request, to endpoint: Endpoint, uid: String? = nil, sessionToken: String? = nil,
        serviceToken: String? = nil, attachment: Data? = nil, until deadline: ContinuousClock.Instant,
        log: inout CallLog
    ) async throws -> Request.Response {
        let schedule = RetrySchedule(
            backoff: backoff, deadline: max(ContinuousClock.now.duration(to: deadline), RetrySchedule.shortestAttempt),
            attemptTimeout: attemptTimeout)
        return try await bus.call(
            request, to: endpoint, source: source, uid: uid, sessionToken: sessionToken, serviceToken: serviceToken,
            attachment: attachment, schedule: schedule, log: &log)
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
