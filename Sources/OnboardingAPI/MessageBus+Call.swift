import Foundation
import Messaging

extension MessageBus {
    /// Sends a typed request and decodes its reply.
    ///
    /// - Parameters:
    ///   - uid: the person the request is about, on calls between services.
    ///   - sessionToken: the caller's session, on user-scoped calls from an app.
    ///   - serviceToken: the secret our services share, on calls between them.
    ///   - attachment: bytes sent as a binary frame after the envelope.
    /// - Throws: ``ServiceError``: the service's refusal with its code, or `timeout`,
    ///   `noResponder`, `closed` from the bus, or `invalidMessage` when the reply cannot be read.
    public func call<Request: APIRequest>(
        _ request: Request,
        to endpoint: Endpoint,
        source: String,
        uid: String? = nil,
        sessionToken: String? = nil,
        serviceToken: String? = nil,
        correlationId: String? = nil,
        attachment: Data? = nil,
        timeout: Duration = Defaults.requestTimeout
    ) async throws -> Request.Response {
        let outgoing = try Self.outgoing(
            request, source: source, uid: uid, sessionToken: sessionToken, serviceToken: serviceToken,
            correlationId: correlationId, attachment: attachment)
        return try Self.response(to: request, from: try await self.request(outgoing, to: endpoint, timeout: timeout), endpoint: endpoint)
    }

    /// ``call(_:to:source:uid:sessionToken:serviceToken:correlationId:attachment:timeout:)`` from
    /// the bus's own thread: the response, or the error, goes to `callback` on that thread.
    public func call<Request: APIRequest>(
        _ request: Request,
        to endpoint: Endpoint,
        source: String,
        uid: String? = nil,
        serviceToken: String? = nil,
        correlationId: String? = nil,
        timeout: Duration = Defaults.requestTimeout,
        onLoop callback: @escaping @Sendable (Result<Request.Response, ServiceError>) -> Void
    ) {
        let outgoing: OutgoingMessage
        do {
            outgoing = try Self.outgoing(
                request, source: source, uid: uid, sessionToken: nil, serviceToken: serviceToken,
                correlationId: correlationId, attachment: nil)
        } catch {
            callback(.failure(error))
            return
        }
        self.request(outgoing, to: endpoint, timeout: timeout) { result in
            callback(result.flatMap { reply in
                Result { () throws(ServiceError) in try Self.response(to: request, from: reply, endpoint: endpoint) }
            })
        }
    }

    private static func outgoing<Request: APIRequest>(
        _ request: Request, source: String, uid: String?, sessionToken: String?, serviceToken: String?,
        correlationId: String?, attachment: Data?
    ) throws(ServiceError) -> OutgoingMessage {
        var header = EnvelopeHeader(
            type: Request.type, source: source, correlationId: correlationId, uid: uid, sessionToken: sessionToken,
            serviceToken: serviceToken)
        Traces.inject(into: &header)
        do {
            return try OutgoingMessage(Envelope(header: header, payload: request), attachment: attachment)
        } catch {
            throw ServiceError(.invalidMessage, "The \(Request.type) request could not be encoded: \(error)")
        }
    }

    private static func response<Request: APIRequest>(
        to _: Request, from reply: Message, endpoint: Endpoint
    ) throws(ServiceError) -> Request.Response {
        if let error = reply.serviceError { throw error }
        guard reply.header.type == Request.replyType else {
            throw ServiceError(
                .invalidMessage,
                "\(endpoint) answered \(Request.type) with \(reply.header.type), not \(Request.replyType).")
        }
        return try reply.payload(as: Request.Response.self)
    }
}

extension MessageBus {
    /// Sends a request that is safe to repeat, and sends it again after a failure that may pass
    /// (by default ``ErrorCode/retryable``: `timeout`, `noResponder`, `overloaded`,
    /// `shuttingDown`, `storeUnavailable`, `dependencyUnavailable`), waiting with exponential backoff and jitter between attempts, until
    /// `deadline` has passed since the first attempt.
    ///
    /// Use it for queries, and for commands that are idempotent: those that carry an
    /// `idempotencyKey`, and `auth.signOut` / `auth.withdraw`, which answer a retry with the
    /// first result. Every attempt sends the same `request` (so the same idempotency key) in a
    /// new envelope with its own `id`.
    ///
    /// Each attempt waits at most `timeout` for its reply, less when the deadline is nearer.
    /// A retry is not started when its backoff would end too close to the deadline (see
    /// ``RetrySchedule``).
    ///
    /// - Parameters:
    ///   - retry: the backoff between attempts, before jitter.
    ///   - deadline: the longest the whole call may take.
    ///   - retryingOn: the error codes that are retried; any other error is thrown at once.
    /// - Throws: the service's refusal at once; after the deadline, the last attempt's
    ///   ``ServiceError``, except that `timeout` wins over a later `noResponder`, `overloaded` or
    ///   `shuttingDown` (an attempt that timed out may have been carried out); `CancellationError`
    ///   when the calling task is cancelled, without another attempt.
    public func callRetrying<Request: APIRequest>(
        _ request: Request,
        to endpoint: Endpoint,
        source: String,
        uid: String? = nil,
        sessionToken: String? = nil,
        serviceToken: String? = nil,
        correlationId: String? = nil,
        attachment: Data? = nil,
        timeout: Duration = Defaults.requestTimeout,
        retry: RetryPolicy = RetryPolicy(),
        deadline: Duration = Defaults.retryDeadline,
        retryingOn codes: Set<ErrorCode> = ErrorCode.retryable
    ) async throws -> Request.Response {
        let schedule = RetrySchedule(backoff: retry, deadline: deadline, attemptTimeout: timeout, retryable: codes)
        return try await call(request, to: endpoint, source: source, uid: uid, sessionToken: sessionToken,
            serviceToken: serviceToken, correlationId: correlationId, attachment: attachment, schedule: schedule)
    }

    /// ``callRetrying(_:to:source:uid:sessionToken:serviceToken:correlationId:attachment:timeout:retry:deadline:retryingOn:)``
    /// with every choice in one ``RetrySchedule``.
    public func call<Request: APIRequest>(
        _ request: Request,
        to endpoint: Endpoint,
        source: String,
        uid: String? = nil,
        sessionToken: String? = nil,
        serviceToken: String? = nil,
        correlationId: String? = nil,
        attachment: Data? = nil,
        schedule: RetrySchedule
    ) async throws -> Request.Response {
        var log = RetryLog()
        return try await call(
            request, to: endpoint, source: source, uid: uid, sessionToken: sessionToken, serviceToken: serviceToken,
            correlationId: correlationId, attachment: attachment, schedule: schedule, log: &log)
    }

    /// The same, noting each failed attempt's code in `log` (to tell a resend's answers apart:
    /// see ``RetryLog/mayHaveActedBefore``).
    public func call<Request: APIRequest>(
        _ request: Request,
        to endpoint: Endpoint,
        source: String,
        uid: String? = nil,
        sessionToken: String? = nil,
        serviceToken: String? = nil,
        correlationId: String? = nil,
        attachment: Data? = nil,
        schedule: RetrySchedule,
        log: inout RetryLog
    ) async throws -> Request.Response {
        let clock = ContinuousClock()
        let start = clock.now
        var attempt = 1
        var timeout = schedule.firstAttemptTimeout
        /// An attempt that timed out may have been carried out.
        var unanswered: ServiceError?
        while true {
            do {
                return try await call(
                    request, to: endpoint, source: source, uid: uid, sessionToken: sessionToken,
                    serviceToken: serviceToken, correlationId: correlationId, attachment: attachment, timeout: timeout)
            } catch let error as ServiceError {
                if error.code == .timeout { unanswered = error }
                let decision = schedule.decision(
                    after: error, attempt: attempt, elapsed: start.duration(to: clock.now), random: Double.random(in: 0..<1))
                guard case .retry(let delay, let next) = decision else {
                    // Later attempts that were turned away say nothing of an earlier one that timed
                    // out: its outcome stays unknown, and the caller must hear that.
                    if let unanswered, ErrorCode.notHandled.contains(error.code) { throw unanswered }
                    throw error
                }
                log.failures.append(error.code)
                try await Task.sleep(for: delay, clock: clock)
                attempt += 1
                // The sleep may have run late: no attempt outlives the deadline.
                let left = schedule.deadline - start.duration(to: clock.now)
                timeout = max(min(next, left), RetrySchedule.shortestAttempt)
            }
        }
    }
}

extension EventPublisher {
    /// Publishes `event` under its own type as topic (or `topic` when given).
    public func publish<Event: APIEvent>(
        _ event: Event, source: String, sequence: UInt64, uid: String?, correlationId: String? = nil,
        topic: String? = nil
    ) throws {
        let header = EnvelopeHeader(
            type: Event.type, source: source, sequence: sequence, correlationId: correlationId, uid: uid)
        try publish(OutgoingMessage(topic: topic ?? Event.type, Envelope(header: header, payload: event)))
    }
}
