import Foundation
import Messaging
import OnboardingAPI

extension Engine {
    /// A call to another service on behalf of `uid`, with the service token.
    ///
    /// - Parameter retrying: the call is safe to repeat: resend it after a timeout or while the
    ///   service restarts, for up to two call timeouts. The state machine retries checks and
    ///   clean-ups itself, with backoff and without end.
    func call<Request: APIRequest>(
        _ request: Request, to endpoint: Endpoint, uid: String, correlationId: String? = nil, attachment: Data? = nil,
        retrying: Bool = false
    ) async throws -> Request.Response {
        if retrying {
            return try await bus.callRetrying(
                request, to: endpoint, source: source, uid: uid, serviceToken: configuration.serviceToken,
                correlationId: correlationId, attachment: attachment, timeout: configuration.callTimeout,
                retry: RetryPolicy(initial: .milliseconds(50), maximum: .milliseconds(500)), deadline: configuration.callTimeout * 2)
        }
        return try await bus.call(
            request, to: endpoint, source: source, uid: uid, serviceToken: configuration.serviceToken,
            correlationId: correlationId, attachment: attachment, timeout: configuration.callTimeout)
    }

    /// A cancelled step (the orchestrator stopping, or losing its lead) is `shuttingDown`, which
    /// callers send again, to whichever orchestrator answers next.
    static func serviceError(_ error: any Error) -> ServiceError {
        if let error = error as? ServiceError { return error }
        if error is CancellationError {
            return ServiceError(.shuttingDown, "This orchestrator stopped before it finished; send the request again.")
        }
        return ServiceError(.internalError, "\(error)")
    }
}
