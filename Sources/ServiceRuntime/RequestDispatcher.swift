import Foundation
import Logging
import Messaging
import OnboardingAPI
import Tracing

/// Who may make a request.
public enum Access: Sendable {
    /// Anyone: no person is involved (`auth.signIn`, `profile.checkUsername`, `health`).
    case open
    /// An app acting for a person: the envelope must carry a valid `sessionToken`; the uid is
    /// the session's, whatever the envelope's `uid` says.
    case session
    /// Another service of ours: the envelope must carry the service token; its `uid` names the
    /// person and is trusted.
    case service
    /// Either of the two above: a `sessionToken` when there is one, otherwise the `uid`.
    case sessionOrService
    /// An app ending its own session (auth's `auth.signOut` and `auth.withdraw`): the envelope
    /// must carry a `sessionToken` (or the request is `unauthenticated`), but the handler checks
    /// it, not the dispatcher, so that a retry that arrives after the session has ended can be
    /// answered as the first request was. The context's `uid` is `nil`: the envelope's `uid` is
    /// not trusted. Pass `replyUID` to ``RequestDispatcher/on(_:access:attachment:replyUID:_:)``
    /// to name the person in the reply.
    case endingSession
    /// Another service of ours, on a request about no one in particular (such as
    /// `events.after`): the envelope must carry the service token; a `uid` is not needed.
    case serviceWithoutUID
}

/// Whether a request takes a binary frame.
public enum AttachmentRule: Sendable {
    case none
    case optional
    case required
}

/// What a handler knows about the request it handles.
public struct RequestContext: Sendable {
    public let message: Message
    /// The person the request is for: verified from the session, or named by a trusted service.
    /// `nil` only for ``Access/open`` requests.
    public let uid: String?
    /// The binary frame, if the request had one.
    public var attachment: Data? { message.attachment }

    /// The uid of a request that must have one.
    public func requireUID() throws -> String {
        guard let uid else {
            throw ServiceError(.invalidRequest, "This request must name a person (the envelope's uid).")
        }
        return uid
    }
}

/// Answers requests by their type: decodes the payload, checks access and frames, runs the
/// handler, and replies with its result or its ``ServiceError``. Unknown types get `unknownType`.
///
/// Build it once with ``on(_:access:attachment:_:)``, then hand it to a ``RequestServer``. It
/// answers `health` by itself.
public struct RequestDispatcher: Sendable {
    public typealias Handler = @Sendable (IncomingRequest) async -> Void

    public let source: String
    let sessions: (any SessionVerifier)?
    let serviceToken: String?
    let logger: Logger
    /// Requests answered by a task each.
    private(set) var handlers: [String: Handler] = [:]
    /// Requests answered on the bus's own thread (see `LoopRoutes.swift`).
    var loop = LoopRoutes()
    /// Each registered type's count and latency, made when it is registered; `health` too.
    var figures: [String: RequestFigures] = [HealthCheck.type: RequestFigures(type: HealthCheck.type)]
    /// Requests of a type this service does not answer, and requests that could not be read:
    /// one series each, whatever the type says.
    let unknownFigures = RequestFigures(type: "unknown"), unreadableFigures = RequestFigures(type: "unreadable")
    private let startedAt = Timestamp.now()
    /// How the service follows other services' events, for `health` replies.
    public var feedStatistics: (@Sendable () -> [FeedStatistics])?
    /// Adds what only the service knows to its `health` replies (auth: its unlink queue).
    public var healthDetails: (@Sendable (inout HealthStatus) async -> Void)?

    /// - Parameters:
    ///   - sessions: verifies session tokens; required when any route uses ``Access/session`` or
    ///     ``Access/sessionOrService``.
    ///   - serviceToken: the secret that ``Access/service`` requests must carry. `nil` accepts
    ///     every caller as a service: only for tests that run every service in one process.
    public init(source: String, sessions: (any SessionVerifier)?, serviceToken: String?, logger: Logger) {
        self.source = source
        self.sessions = sessions
        self.serviceToken = serviceToken
        self.logger = logger
    }

    /// Says loudly, once at start, when service-only requests are open to anyone.
    func warnIfTrustingEveryone() {
        guard hasServiceRoutes, serviceToken == nil else { return }
        logger.warning("\(source) has no service token: requests meant for our own services are accepted from anyone. Only for tests in one process.")
    }

    /// Whether any route takes requests from our own services.
    var hasServiceRoutes = false

    /// Adds the handler for requests of type `Request.type`.
    ///
    /// - Parameter replyUID: the person the reply names, from the response; by default the
    ///   request's resolved uid.
    public mutating func on<Request: APIRequest>(
        _: Request.Type,
        access: Access,
        attachment: AttachmentRule = .none,
        replyUID: (@Sendable (Request.Response) -> String?)? = nil,
        _ handler: @escaping @Sendable (Request, RequestContext) async throws -> Request.Response
    ) {
        precondition(loop[Request.type] == nil, "\(Request.type) is already answered on the bus's thread (onLoop)")
        if case .service = access { hasServiceRoutes = true }
        if case .sessionOrService = access { hasServiceRoutes = true }
        if case .serviceWithoutUID = access { hasServiceRoutes = true }
        figures[Request.type] = RequestFigures(type: Request.type)
        let source = self.source
        let sessions = self.sessions
        let serviceToken = self.serviceToken
        let logger = self.logger
        let handle: Handler = { incoming in
            do {
                let message = incoming.message
                try attachment.check(message.attachment, type: Request.type)
                let request = try message.payload(as: Request.self)
                let uid = try await Self.resolveUID(
                    message: message, access: access, sessions: sessions, serviceToken: serviceToken, server: source)
                let response = try await handler(request, RequestContext(message: message, uid: uid))
                incoming.reply(type: Request.replyType, source: source, payload: response, uid: replyUID?(response) ?? uid)
            } catch let error as ServiceError {
                incoming.fail(error, source: source)
            } catch is CancellationError {
                // The service is stopping under the handler (an orchestrator that lost its lead,
                // say): the caller tries again, and reaches it or its successor.
                incoming.fail(ServiceError(.shuttingDown, "\(source) stopped before it answered \(Request.type); try again."), source: source)
            } catch {
                logger.error("\(Request.type) failed: \(error)", metadata: ["id": "\(incoming.message.header.id)"])
                incoming.fail(ServiceError(.internalError, "\(Request.type) failed inside \(source); see its log."), source: source)
            }
        }
        // A request that carries a trace is handled in a span of it, so that the calls the
        // handler makes and the events it records carry the trace on (see ``Traces``).
        handlers[Request.type] = { incoming in
            guard let span = Traces.span(Request.type, for: incoming.message.header, ofKind: .server) else {
                return await handle(incoming)
            }
            await ServiceContext.withValue(span.context) { await handle(incoming) }
            span.end()
        }
    }

    private static func resolveUID(
        message: Message, access: Access, sessions: (any SessionVerifier)?, serviceToken: String?, server: String
    ) async throws -> String? {
        func presentToken() throws -> String {
            guard let token = message.header.sessionToken, !token.isEmpty else {
                throw ServiceError.missingSessionToken
            }
            return token
        }
        func verifiedSession() async throws -> String {
            let token = try presentToken()
            guard let sessions else {
                throw ServiceError(.internalError, "This service cannot verify sessions.")
            }
            return try await sessions.uid(forSessionToken: token)
        }
        switch access {
        case .open, .service, .serviceWithoutUID:
            return try resolveWithoutSession(
                header: message.header, caller: message.caller, access: access, serviceToken: serviceToken, server: server)
        case .session: return try await verifiedSession()
        case .sessionOrService:
            if message.header.sessionToken != nil { return try await verifiedSession() }
            if message.caller != nil || serviceToken == nil || message.header.serviceToken != nil {
                return try resolveWithoutSession(
                    header: message.header, caller: message.caller, access: .service, serviceToken: serviceToken, server: server)
            }
            return try await verifiedSession()
        case .endingSession:
            _ = try presentToken()
            return nil
        }
    }

    /// The uid of a request whose access needs no session to be verified: ``Access/open``,
    /// ``Access/service`` or ``Access/serviceWithoutUID``.
    ///
    /// A request from a caller the bus authenticated by its key (`caller`, over CURVE) may make
    /// ``Access/service`` and ``Access/serviceWithoutUID`` requests only as ``BusRights`` allow,
    /// whatever token it carries; without a known caller (a bus without keys, the in-process
    /// bus), the service token decides.
    static func resolveWithoutSession(
        header: EnvelopeHeader, caller: String?, access: Access, serviceToken: String?, server: String
    ) throws(ServiceError) -> String? {
        func checkServiceToken() throws(ServiceError) {
            if let caller {
                guard BusRights.may(caller, make: header.type, at: server) else {
                    throw BusRights.refusal(caller, header.type, at: server)
                }
                return
            }
            if let serviceToken, !constantTimeEqual(header.serviceToken ?? "", serviceToken) {
                throw ServiceError(
                    .unauthenticated,
                    "\(header.type) is for our own services only (it needs the service token). "
                        + "Apps call it with the sessionToken from auth.signIn, where the request allows that.")
            }
        }
        switch access {
        case .service:
            try checkServiceToken()
            guard let uid = header.uid, !uid.isEmpty else {
                throw ServiceError(.invalidRequest, "This request must name a person in the envelope's uid.")
            }
            return uid
        case .serviceWithoutUID:
            try checkServiceToken()
            return header.uid
        default:
            return header.uid
        }
    }

    /// Answers one request. Never throws: every failure becomes an error reply.
    public func handle(_ request: IncomingRequest, statistics: @autoclosure () -> BusStatistics = BusStatistics()) async {
        let type = request.message.header.type
        if type == HealthCheck.type {
            guard request.message.attachment == nil else {
                request.fail(ServiceError(.unexpectedFrames, "health takes no binary frame; send the envelope alone."), source: source)
                return
            }
            var status = HealthStatus(service: source, startedAt: startedAt, statistics: statistics(), feeds: feedStatistics?())
            await healthDetails?(&status)
            request.reply(type: HealthCheck.replyType, source: source, payload: status)
            return
        }
        guard let handler = handlers[type] else {
            let known = Set([HealthCheck.type] + handlers.keys + loop.types).sorted().joined(separator: ", ")
            request.fail(ServiceError(.unknownType, "\(source) does not answer \(type). It answers: \(known)."), source: source)
            return
        }
        await handler(request)
    }
}

/// Compares two secrets in time that depends on their lengths only, not on where they differ.
func constantTimeEqual(_ lhs: String, _ rhs: String) -> Bool {
    let a = Array(lhs.utf8), b = Array(rhs.utf8)
    guard a.count == b.count else { return false }
    return zip(a, b).reduce(UInt8(0)) { $0 | ($1.0 ^ $1.1) } == 0
}
