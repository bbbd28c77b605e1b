import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI

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
/// transaction each, so one failure costs the others nothing but time.
///
/// Only requests whose access needs no call to another service can run here (``Access/open``,
/// ``Access/service``, ``Access/serviceWithoutUID``, and the service side of
/// ``Access/sessionOrService``); their handlers must not wait for anything but the database.
struct LoopRoutes: Sendable {
    struct Route: Sendable {
        var access: Access
        var attachment: AttachmentRule
        var writes: Bool
        var database: any DatabaseWriter
        /// Runs the handler in `db` and returns the encoded reply.
        var run: @Sendable (_ payload: any Sendable, _ context: RequestContext, _ db: Database) throws -> OutgoingMessage
    }

    private(set) var routes: [String: Route] = [:]
    private(set) var reader = EnvelopeReader()

    var types: [String] { Array(routes.keys) }
    var isEmpty: Bool { routes.isEmpty }

    subscript(type: String) -> Route? { routes[type] }

    mutating func add<Request: APIRequest>(_: Request.Type, route: Route) {
        reader.register(Request.self, for: Request.type)
        routes[Request.type] = route
    }
}

extension RequestDispatcher {
    /// Adds a handler that runs on the bus's own thread, inside the write (or, with
    /// `writes: false`, read) transaction its batch shares (see ``LoopRoutes``).
    ///
    /// - Parameters:
    ///   - access: ``Access/open``, ``Access/service`` or ``Access/serviceWithoutUID``; or
    ///     ``Access/sessionOrService``, for requests that carry the service token: those with a
    ///     session go to the handler registered with ``on(_:access:attachment:replyUID:_:)``
    ///     for the same type, which must exist.
    ///   - database: where the batch's transaction runs.
    ///   - replyUID: the person the reply names, from the response; by default the request's uid.
    ///   - handler: decides and writes; throws a ``ServiceError`` to refuse.
    public mutating func onLoop<Request: APIRequest>(
        _: Request.Type,
        access: Access,
        database: any DatabaseWriter,
        writes: Bool = true,
        attachment: AttachmentRule = .none,
        replyUID: (@Sendable (Request.Response) -> String?)? = nil,
        _ handler: @escaping @Sendable (Request, RequestContext, Database) throws -> Request.Response
    ) {
        switch access {
        case .open: break
        case .service, .serviceWithoutUID, .sessionOrService: hasServiceRoutes = true
        default: preconditionFailure("\(Request.type): a loop route cannot verify sessions; use on(_:access:...) instead")
        }
        let source = self.source
        loop.add(
            Request.self,
            route: LoopRoutes.Route(
                access: access, attachment: attachment, writes: writes, database: database,
                run: { payload, context, db in
                    guard let request = payload as? Request else {
                        throw ServiceError(.internalError, "\(Request.type) was read as the wrong type.")
                    }
                    let response = try handler(request, context, db)
                    var header = context.message.replyHeader(type: Request.replyType, source: source)
                    if let uid = replyUID?(response) ?? context.uid { header.uid = uid }
                    return OutgoingMessage(body: try Envelope(header: header, payload: response).encoded())
                }))
    }

    /// Whether any request type is answered on the bus's own thread.
    var hasLoopRoutes: Bool { !loop.isEmpty }

    /// Handles one batch on the bus's own thread: loop routes are read, checked, committed together
    /// and answered; every other request is read as far as its header and handed to `defer`.
    ///
    /// - Parameters:
    ///   - refusing: when set, every request is answered with this error instead (shutting down).
    ///   - rejected: counts requests that could not be read.
    func handleOnLoop(
        _ batch: [RawRequest], refusing: ServiceError?, rejected: () -> Void, defer deferred: (IncomingRequest) -> Void
    ) {
        struct Job {
            var raw: RawRequest
            var route: LoopRoutes.Route
            var payload: any Sendable
            var context: RequestContext
        }
        var jobs: [Job] = []
        for raw in batch {
            let read: EnvelopeReader.Read
            do throws(ServiceError) {
                read = try loop.reader.read(raw.body)
            } catch {
                rejected()
                raw.reply(Message.errorReply(error, correlationId: nil, source: source))
                continue
            }
            let message = Message(read: read, body: raw.body, attachment: raw.attachment)
            if let refusing {
                raw.reply(message.errorReply(refusing, source: source))
                continue
            }
            guard let route = loop[read.header.type], let payload = read.payload, !needsSession(read.header, route.access) else {
                deferred(raw.incoming(message))
                continue
            }
            do throws(ServiceError) {
                try route.attachment.check(raw.attachment, type: read.header.type)
                let access: Access = route.access == .sessionOrService ? .service : route.access
                let uid = try Self.resolveWithoutSession(header: read.header, access: access, serviceToken: serviceToken)
                jobs.append(Job(raw: raw, route: route, payload: payload, context: RequestContext(message: message, uid: uid)))
            } catch {
                raw.reply(message.errorReply(error, source: source))
            }
        }
        guard !jobs.isEmpty else { return }

        let replies: [OutgoingMessage]
        do {
            replies = try runTogether(jobs.map { ($0.route, $0.payload, $0.context) })
        } catch {
            // One of them refused (or the store failed): each on its own, so the others commit.
            replies = jobs.map { job in
                do {
                    return try runTogether([(job.route, job.payload, job.context)])[0]
                } catch let error as ServiceError {
                    return job.context.message.errorReply(error, source: source)
                } catch {
                    logger.error("\(job.context.message.header.type) failed: \(error)", metadata: ["id": "\(job.context.message.header.id)"])
                    let failure = ServiceError(.storeUnavailable, "The store failed. Nothing was changed; try again.")
                    return job.context.message.errorReply(failure, source: source)
                }
            }
        }
        for (job, reply) in zip(jobs, replies) { job.raw.reply(reply) }
    }

    /// Whether a request of a ``Access/sessionOrService`` route is an app's, whose session must
    /// be verified (by the handler off the loop), as ``resolveUID`` decides.
    private func needsSession(_ header: EnvelopeHeader, _ access: Access) -> Bool {
        guard access == .sessionOrService else { return false }
        if header.sessionToken != nil { return true }
        return serviceToken != nil && header.serviceToken == nil
    }

    /// Runs the jobs' handlers: the writing ones in one write transaction, the others in one read.
    /// A refusal before any change becomes that job's error reply; any other failure is thrown
    /// (after rolling back).
    private func runTogether(
        _ jobs: [(route: LoopRoutes.Route, payload: any Sendable, context: RequestContext)]
    ) throws -> [OutgoingMessage] {
        var replies = [OutgoingMessage?](repeating: nil, count: jobs.count)
        let source = self.source
        for writes in [true, false] {
            let indices = jobs.indices.filter { jobs[$0].route.writes == writes }
            guard let first = indices.first else { continue }
            let database = jobs[first].route.database
            let run = { (db: Database) throws -> [OutgoingMessage] in
                try indices.map { index in
                    let changes = db.totalChangesCount
                    do {
                        return try jobs[index].route.run(jobs[index].payload, jobs[index].context, db)
                    } catch let refusal as ServiceError where db.totalChangesCount == changes {
                        return jobs[index].context.message.errorReply(refusal, source: source)
                    }
                }
            }
            let made = writes ? try database.write(run) : try database.read(run)
            for (index, reply) in zip(indices, made) { replies[index] = reply }
        }
        return replies.map { $0! }
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
