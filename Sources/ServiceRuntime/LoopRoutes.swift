import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import Tracing

/// The requests a service answers on the bus's own thread: the hot path.
///
/// Everything that arrived together is handled as one batch: each request's JSON is read once
/// (header and payload in one pass), access is checked, and the handlers of the whole batch run
/// in **one** write transaction (group commit); the replies, and the events the handlers
/// recorded in the outbox, leave only after that commit. A batch is what queued up while the
/// previous one was being handled: one request when idle, hundreds under load, with no timer.
///
/// A handler that refuses with a ``ServiceError`` before it has changed anything (a bad subject,
/// a name taken) is answered with that error and the batch goes on. When one throws after it
/// has written, the batch's transaction is rolled back and its requests run again, one
/// transaction each, so one failure costs the others nothing but time. Replies are encoded after
/// the commit, so that the commit (and the events it publishes) does not wait for them; a
/// response that cannot be encoded (none of ours can fail) is answered with `internalError`
/// saying the request was carried out, and logged.
///
/// Access: ``Access/open``, ``Access/service`` and ``Access/serviceWithoutUID`` are checked on
/// the spot. ``Access/session`` asks the ``SessionVerifier`` with a callback and runs the
/// handler when the answer comes: on the bus's thread with ``RemoteSessionVerifier``, alone
/// rather than in the batch. ``Access/sessionOrService`` is checked as ``Access/service`` when
/// the request carries the service token and as ``Access/session`` otherwise. A type is answered
/// either here or by a handler registered with `on`, never both: which one is said once, where
/// it is registered. Handlers must not wait for anything but the database.
struct LoopRoutes: Sendable {
    struct Route: Sendable {
        var access: Access
        var attachment: AttachmentRule
        var writes: Bool
        var database: any DatabaseWriter
        /// Runs the handler in `db`: how to make the reply once the transaction has committed
        /// (so that the commit, and the events it publishes, do not wait for the encoding), or
        /// `nil` when the handler answers later through `responder`.
        var run:
            @Sendable (_ payload: any Sendable, _ context: RequestContext, _ db: Database, _ responder: RawRequest) throws ->
                LoopRoutes.Answer?
    }

    /// A reply decided in a transaction, made once that transaction has committed: the commit,
    /// and the events it publishes, do not wait for the reply's encoding.
    typealias Answer = () -> OutgoingMessage

    private(set) var routes: [String: Route] = [:]
    private(set) var reader = EnvelopeReader()

    var types: [String] { Array(routes.keys) }

    subscript(type: String) -> Route? { routes[type] }

    mutating func add<Request: APIRequest>(_: Request.Type, route: Route) {
        reader.register(Request.self, for: Request.type)
        routes[Request.type] = route
    }
}

/// The answer to a request handled on the bus's thread that its handler gives later (see
/// ``RequestDispatcher/onLoop(_:access:database:writes:attachment:replyUID:answeringLater:)``).
/// Only the first answer is sent.
public struct LoopReply<Response: Codable & Sendable>: Sendable {
    let responder: RawRequest
    let context: RequestContext
    let source: String
    let replyType: String
    let replyUID: (@Sendable (Response) -> String?)?
    let logger: Logger

    /// Answers with `result`: the response, or the error.
    public func send(_ result: Result<Response, ServiceError>) {
        switch result {
        case .success(let response): responder.reply(reply(response))
        case .failure(let error): responder.reply(context.message.errorReply(error, source: source))
        }
    }

    /// `response` encoded, or an `internalError` reply when it cannot be (logged: the request
    /// itself was carried out, and its changes are committed).
    func reply(_ response: Response) -> OutgoingMessage {
        do {
            return try encode(response)
        } catch {
            let type = context.message.header.type
            logger.error("\(type) was carried out, but its reply could not be encoded: \(error)", metadata: ["id": "\(context.message.header.id)"])
            let failure = ServiceError(
                .internalError, "\(type) was carried out, but its reply could not be encoded; see \(source)'s log.")
            return context.message.errorReply(failure, source: source)
        }
    }

    func encode(_ response: Response) throws -> OutgoingMessage {
        var header = context.message.replyHeader(type: replyType, source: source)
        if let uid = replyUID?(response) ?? context.uid { header.uid = uid }
        return OutgoingMessage(body: try Envelope(header: header, payload: response).encoded())
    }
}

extension RequestDispatcher {
    /// Adds a handler that runs on the bus's own thread, inside the write (or, with
    /// `writes: false`, read) transaction its batch shares (see ``LoopRoutes``).
    ///
    /// - Parameters:
    ///   - access: who may ask (see ``LoopRoutes`` for how each is checked).
    ///   - database: where the batch's transaction runs (one database per dispatcher).
    ///   - replyUID: the person the reply names, from the response; by default the request's uid.
    ///   - handler: decides and writes; throws a ``ServiceError`` to refuse.
    public mutating func onLoop<Request: APIRequest>(
        _ type: Request.Type,
        access: Access,
        database: any DatabaseWriter,
        writes: Bool = true,
        attachment: AttachmentRule = .none,
        replyUID: (@Sendable (Request.Response) -> String?)? = nil,
        _ handler: @escaping @Sendable (Request, RequestContext, Database) throws -> Request.Response
    ) {
        onLoop(type, access: access, database: database, writes: writes, attachment: attachment, replyUID: replyUID) {
            request, context, db, _ in try handler(request, context, db)
        }
    }

    /// ``onLoop(_:access:database:writes:attachment:replyUID:_:)`` for a handler that may answer
    /// later: it returns `nil` and keeps the ``LoopReply`` (for an answer that depends on another
    /// service, for example). ``LoopReply/send(_:)`` sends at once, so call it once what the
    /// reply reports has committed: never from inside the handler, whose batch's transaction is
    /// still open, but later (from another task, or from `afterNextTransaction`'s `onCommit`).
    public mutating func onLoop<Request: APIRequest>(
        _: Request.Type,
        access: Access,
        database: any DatabaseWriter,
        writes: Bool = true,
        attachment: AttachmentRule = .none,
        replyUID: (@Sendable (Request.Response) -> String?)? = nil,
        answeringLater handler: @escaping @Sendable (Request, RequestContext, Database, LoopReply<Request.Response>) throws ->
            Request.Response?
    ) {
        precondition(handlers[Request.type] == nil, "\(Request.type) is already answered by a task (on)")
        switch access {
        case .open, .session: break
        case .service, .serviceWithoutUID, .sessionOrService: hasServiceRoutes = true
        case .endingSession: preconditionFailure("\(Request.type): endingSession is checked by its handler; use on(_:access:...)")
        }
        let source = self.source
        let logger = self.logger
        figures[Request.type] = RequestFigures(type: Request.type)
        // Built once here: `replyType` is a concatenation, made anew on every use.
        let replyType = Request.replyType
        loop.add(
            Request.self,
            route: LoopRoutes.Route(
                access: access, attachment: attachment, writes: writes, database: database,
                run: { payload, context, db, responder in
                    guard let request = payload as? Request else {
                        throw ServiceError(.internalError, "\(Request.type) was read as the wrong type.")
                    }
                    let reply = LoopReply<Request.Response>(
                        responder: responder, context: context, source: source, replyType: replyType,
                        replyUID: replyUID, logger: logger)
                    guard let response = try handler(request, context, db, reply) else { return nil }
                    return { reply.reply(response) }
                }))
    }

    /// One request for a loop route, ready to run.
    struct LoopJob: Sendable {
        var raw: RawRequest
        var route: LoopRoutes.Route
        var payload: any Sendable
        var context: RequestContext
        /// Its span, when it continues a trace (see ``Traces``).
        var span: (any Tracing.Span)?

        /// Runs `body` in the job's trace, so that the events it records and the calls it
        /// makes carry it on.
        func traced<T>(_ body: () throws -> T) rethrows -> T {
            guard let span else { return try body() }
            return try ServiceContext.withValue(span.context, operation: body)
        }

        /// Sends `reply`, and ends the job's span (an error reply marks it failed).
        func answer(_ reply: OutgoingMessage) {
            raw.reply(reply)
            guard let span else { return }
            if let code = reply.failure { span.setStatus(SpanStatus(code: .error, message: code.rawValue)) }
            span.end()
        }
    }

    /// Handles one batch on the bus's own thread: loop routes are read, checked, committed together
    /// and answered; every other request is read as far as its header and handed to `defer`.
    ///
    /// - Parameters:
    ///   - refusing: when set, every request is answered with this error instead (shutting down).
    ///   - rejected: counts requests that could not be read.
    func handleOnLoop(
        _ batch: [RawRequest], refusing: ServiceError?, rejected: () -> Void, defer deferred: (IncomingRequest) -> Void
    ) {
        var jobs: [LoopJob] = []
        for var raw in batch {
            let read: EnvelopeReader.Read
            do throws(ServiceError) {
                read = try loop.reader.read(raw.body)
            } catch {
                raw.observer = unreadableFigures
                rejected()
                // Within the envelope limit (the bus saw to it): the id is worth reading again.
                raw.reply(Message.errorReply(error, correlationId: Message.requestID(in: raw.body), source: source))
                continue
            }
            raw.observer = figures[read.header.type] ?? unknownFigures
            var message = Message(read: read, body: raw.body, attachment: raw.attachment)
            message.caller = raw.caller
            if let refusing {
                raw.reply(message.errorReply(refusing, source: source))
                continue
            }
            guard let route = loop[read.header.type], let payload = read.payload else {
                deferred(raw.incoming(message))
                continue
            }
            let span = Traces.span(read.header.type, for: read.header, ofKind: .server)
            do throws(ServiceError) {
                try route.attachment.check(raw.attachment, type: read.header.type)
                if needsSession(read.header, caller: raw.caller, route.access) {
                    try verifyThenRun(raw: raw, route: route, payload: payload, message: message, span: span)
                    continue
                }
                let access: Access = route.access == .sessionOrService ? .service : route.access
                let uid = try Self.resolveWithoutSession(
                    header: read.header, caller: raw.caller, access: access, serviceToken: serviceToken, server: source)
                jobs.append(
                    LoopJob(raw: raw, route: route, payload: payload, context: RequestContext(message: message, uid: uid), span: span))
            } catch {
                span?.setStatus(SpanStatus(code: .error, message: error.code.rawValue))
                span?.end()
                raw.reply(message.errorReply(error, source: source))
            }
        }
        run(jobs)
    }

    /// Asks for the session of a request that needs one, then runs it.
    private func verifyThenRun(
        raw: RawRequest, route: LoopRoutes.Route, payload: any Sendable, message: Message, span: (any Tracing.Span)?
    ) throws(ServiceError) {
        guard let token = message.header.sessionToken, !token.isEmpty else {
            throw ServiceError.missingSessionToken
        }
        guard let sessions else {
            throw ServiceError(.internalError, "This service cannot verify sessions.")
        }
        let dispatcher = self
        sessions.uid(forSessionToken: token) { result in
            switch result {
            case .success(let uid):
                dispatcher.run([
                    LoopJob(raw: raw, route: route, payload: payload, context: RequestContext(message: message, uid: uid), span: span)
                ])
            case .failure(let error):
                span?.setStatus(SpanStatus(code: .error, message: error.code.rawValue))
                span?.end()
                raw.reply(message.errorReply(error, source: dispatcher.source))
            }
        }
    }

    /// Runs `jobs` together and answers them (those whose handlers answer later, later).
    private func run(_ jobs: [LoopJob]) {
        guard !jobs.isEmpty else { return }
        let answers: [LoopRoutes.Answer?]
        do {
            answers = try runTogether(jobs)
        } catch {
            // One of them failed after writing (or the store failed): each on its own, so the
            // others commit.
            answers = jobs.map { job in
                do {
                    return try runTogether([job])[0]
                } catch let error as ServiceError {
                    return { job.context.message.errorReply(error, source: source) }
                } catch {
                    logger.error("\(job.context.message.header.type) failed: \(error)", metadata: ["id": "\(job.context.message.header.id)"])
                    let failure = ServiceError(.storeUnavailable, "The store failed. Nothing was changed; try again.")
                    return { job.context.message.errorReply(failure, source: source) }
                }
            }
        }
        for (job, answer) in zip(jobs, answers) {
            if let answer {
                job.answer(answer())
            } else {
                // Answered later, by the handler: the span covers what was done here.
                job.span?.end()
            }
        }
    }

    /// Whether the request's person is known only from its session: a ``Access/session``
    /// request, or a ``Access/sessionOrService`` one from an app (as ``resolveUID`` decides).
    private func needsSession(_ header: EnvelopeHeader, caller: String?, _ access: Access) -> Bool {
        switch access {
        case .session: return true
        case .sessionOrService:
            return header.sessionToken != nil || (caller == nil && serviceToken != nil && header.serviceToken == nil)
        default: return false
        }
    }

    /// Runs the jobs' handlers: the reading ones on the writer's connection outside a
    /// transaction, then the writing ones in one write transaction.
    /// A refusal before any change becomes that job's error reply; any other failure is thrown
    /// (after rolling back).
    private func runTogether(_ jobs: [LoopJob]) throws -> [LoopRoutes.Answer?] {
        var answers = [LoopRoutes.Answer?](repeating: nil, count: jobs.count)
        let source = self.source
        // Reads first: when the writes fail and everything runs again one by one, nothing runs
        // twice that has committed.
        for writes in [false, true] {
            let indices = jobs.indices.filter { jobs[$0].route.writes == writes }
            guard let first = indices.first else { continue }
            let database = jobs[first].route.database
            let run = { (db: Database) throws -> [LoopRoutes.Answer?] in
                try indices.map { index in
                    let job = jobs[index]
                    let changes = db.totalChangesCount
                    do {
                        return try job.traced { try job.route.run(job.payload, job.context, db, job.raw) }
                    } catch let refusal as ServiceError
                        where db.totalChangesCount == changes && (!writes || db.isInsideTransaction)
                    {
                        // Refused before it wrote anything, and the batch's transaction is still
                        // open (SQLite had not rolled it back over a failed statement): answer
                        // this request alone and go on with the rest.
                        return { job.context.message.errorReply(refusal, source: source) }
                    }
                }
            }
            // Reads run on the writer's connection, between its transactions and outside one:
            // no snapshot to open and close, and no write can come between a read's statements.
            let made: [LoopRoutes.Answer?]
            if writes {
                let started = ContinuousClock.now
                let traced = indices.filter { jobs[$0].span != nil }
                let tracedStart = traced.isEmpty ? nil : DefaultTracerClock.now
                do {
                    made = try database.writeTransaction(run)
                    StoreFigures.transaction(committed: true, since: started)
                    StoreFigures.requestBatch(indices.count)
                    if let tracedStart {
                        for index in traced { jobs[index].span.map { Traces.child("commit", of: $0.context, at: tracedStart).end() } }
                    }
                } catch {
                    StoreFigures.transaction(committed: false, since: started)
                    throw error
                }
            } else {
                made = try database.writeWithoutTransaction(run)
            }
            for (index, answer) in zip(indices, made) { answers[index] = answer }
        }
        return answers
    }
}

extension AttachmentRule {
    /// Refuses a binary frame this rule does not allow, or a missing one it requires.
    func check(_ attachment: Data?, type: String) throws(ServiceError) {
        switch (self, attachment) {
        case (.none, .some):
            throw ServiceError(.unexpectedFrames, "\(type) takes no binary frame; send the envelope alone.")
        case (.required, .none):
            throw ServiceError(.unexpectedFrames, "\(type) needs the data as a binary frame after the envelope.")
        default:
            break
        }
    }
}
