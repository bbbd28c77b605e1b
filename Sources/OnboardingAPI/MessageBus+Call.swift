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
        let header = EnvelopeHeader(
            type: Request.type, source: source, correlationId: correlationId, uid: uid, sessionToken: sessionToken,
            serviceToken: serviceToken)
        let outgoing: OutgoingMessage
        do {
            outgoing = try OutgoingMessage(Envelope(header: header, payload: request), attachment: attachment)
        } catch {
            throw ServiceError(.invalidMessage, "The \(Request.type) request could not be encoded: \(error)")
        }
        let reply = try await self.request(outgoing, to: endpoint, timeout: timeout)
        if let error = reply.serviceError { throw error }
        guard reply.header.type == Request.replyType else {
            throw ServiceError(
                .invalidMessage,
                "\(endpoint) answered \(Request.type) with \(reply.header.type), not \(Request.replyType).")
        }
        return try reply.payload(as: Request.Response.self)
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
