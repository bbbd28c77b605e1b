import Foundation
import GRDB
import Messaging
import OnboardingAPI
@testable import ServiceRuntime
import Synchronization
import Testing

/// Batches on the bus's thread, driven directly (the in-process bus hands over one request at a
/// time; ZeroMQ hands over whole batches).
@Suite("Requests handled on the bus's thread, in batches")
struct LoopRoutesTests {
    struct Add: APIRequest {
        typealias Response = Count
        static let type = "test.add"
        var name: String
    }

    struct Peek: APIRequest {
        typealias Response = Count
        static let type = "test.peek"
        var broken: Bool
    }

    struct Count: Codable, Sendable, Hashable {
        var count: Int
    }

    /// A dispatcher whose `test.add` inserts a row (refusing the name "taken" before writing,
    /// and failing after writing for "late"), and whose `test.peek` reads the count (or runs
    /// broken SQL).
    func dispatcher(_ database: any DatabaseWriter) -> RequestDispatcher {
        var dispatcher = RequestDispatcher(source: "test", sessions: nil, serviceToken: nil, logger: quietLogger)
        dispatcher.onLoop(Add.self, access: .open, database: database) { request, _, db in
            if request.name == "taken" { throw ServiceError(.invalidRequest, "taken") }
            try db.execute(sql: "INSERT INTO item (name) VALUES (?)", arguments: [request.name])
            if request.name == "late" { throw ServiceError(.invalidRequest, "late") }
            return Count(count: try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM item") ?? 0)
        }
        dispatcher.onLoop(Peek.self, access: .open, database: database, writes: false) { request, _, db in
            if request.broken { try db.execute(sql: "SELECT * FROM nowhere") }
            return Count(count: try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM item") ?? 0)
        }
        return dispatcher
    }

    /// Raw requests whose replies are collected in order of sending.
    final class Replies: Sendable {
        let messages = Mutex<[Int: Message]>([:])

        func request<R: APIRequest>(_ payload: R, number: Int) throws -> RawRequest {
            let body = try Envelope(header: EnvelopeHeader(type: R.type, source: "test"), payload: payload).encoded()
            return RawRequest(body: body, attachment: nil) { [self] reply in
                let message = try? Message(body: reply.body)
                messages.withLock { $0[number] = message }
            }
        }

        func count(_ number: Int) -> Int? {
            messages.withLock { try? $0[number]?.payload(as: Count.self).count }
        }

        func error(_ number: Int) -> ErrorCode? {
            messages.withLock { $0[number]?.serviceError?.code }
        }
    }

    func withDatabase(_ body: (any DatabaseWriter) throws -> Void) throws {
        let database = try DatabaseQueue()
        try database.write { try $0.execute(sql: "CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT NOT NULL)") }
        try body(database)
    }

    @Test("a batch commits together; a refusal before writing leaves the others in the batch")
    func refusalKeepsTheBatch() throws {
        try withDatabase { database in
            let replies = Replies()
            let batch = [
                try replies.request(Add(name: "a"), number: 0),
                try replies.request(Add(name: "taken"), number: 1),
                try replies.request(Add(name: "b"), number: 2),
                try replies.request(Peek(broken: false), number: 3),
            ]
            dispatcher(database).handleOnLoop(batch, refusing: nil, rejected: {}, defer: { _ in Issue.record("deferred") })
            #expect(replies.count(0) == 1)
            #expect(replies.error(1) == .invalidRequest)
            #expect(replies.count(2) == 2)
            #expect(replies.count(3) == 0, "reads run first, on what was committed before the batch")
            #expect(try database.read { try Int.fetchOne($0, sql: "SELECT COUNT(*) FROM item") } == 2)
        }
    }

    @Test("a failure after writing rolls the batch back and runs each on its own: nothing twice")
    func failureRunsEachAlone() throws {
        try withDatabase { database in
            let replies = Replies()
            let batch = [
                try replies.request(Add(name: "a"), number: 0),
                try replies.request(Add(name: "late"), number: 1),
                try replies.request(Peek(broken: true), number: 2),
                try replies.request(Add(name: "b"), number: 3),
            ]
            dispatcher(database).handleOnLoop(batch, refusing: nil, rejected: {}, defer: { _ in Issue.record("deferred") })
            #expect(replies.count(0) == 1)
            #expect(replies.error(1) == .invalidRequest)
            #expect(replies.error(2) == .storeUnavailable)
            #expect(replies.count(3) == 2)
            let names = try database.read { try String.fetchAll($0, sql: "SELECT name FROM item ORDER BY id") }
            #expect(names == ["a", "b"], "each write committed once, the failed one not at all")
        }
    }

    @Test("while shutting down every request of a batch is refused, unread requests as unreadable")
    func refusing() throws {
        try withDatabase { database in
            let replies = Replies()
            let unreadable = RawRequest(body: Data("not json".utf8), attachment: nil) { reply in
                replies.messages.withLock { $0[9] = try? Message(body: reply.body) }
            }
            var rejected = 0
            dispatcher(database).handleOnLoop(
                [try replies.request(Add(name: "a"), number: 0), unreadable],
                refusing: ServiceError(.shuttingDown, "stopping"), rejected: { rejected += 1 }, defer: { _ in })
            #expect(replies.error(0) == .shuttingDown)
            #expect(replies.error(9) == .invalidMessage)
            #expect(rejected == 1)
            #expect(try database.read { try Int.fetchOne($0, sql: "SELECT COUNT(*) FROM item") } == 0)
        }
    }

    @Test("a request whose payload cannot be read is refused with invalidMessage, and the reply names the request")
    func unreadablePayload() throws {
        try withDatabase { database in
            let replies = Replies()
            let id = UUID().uuidString.lowercased()
            let body = Data(
                #"{"version":1,"id":"\#(id)","type":"test.add","source":"test","sequence":0,"time":"2026-11-21T05:30:00.123Z","payload":{"name":5}}"#
                    .utf8)
            let raw = RawRequest(body: body, attachment: nil) { reply in
                replies.messages.withLock { $0[0] = try? Message(body: reply.body) }
            }
            var rejected = 0
            dispatcher(database).handleOnLoop([raw], refusing: nil, rejected: { rejected += 1 }, defer: { _ in })
            #expect(replies.error(0) == .invalidMessage)
            #expect(replies.messages.withLock { $0[0]?.header.correlationId } == id)
            #expect(rejected == 1)
        }
    }

    struct Stamp: APIRequest {
        typealias Response = Stamped
        static let type = "test.stamp"
        var token: String
    }

    /// A response that says, in its JSON, whether its transaction had committed when it was
    /// encoded (that transaction's commit hook records its token).
    struct Stamped: Codable, Sendable {
        static let committed = Mutex<Set<String>>([])

        var token: String
        var encodedAfterCommit = false

        init(token: String) { self.token = token }

        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(token, forKey: .token)
            try container.encode(Self.committed.withLock { $0.contains(token) }, forKey: .encodedAfterCommit)
        }
    }

    @Test("a reply is encoded after its batch has committed: the commit and its events do not wait for it")
    func replyAfterCommit() throws {
        try withDatabase { database in
            var dispatcher = RequestDispatcher(source: "test", sessions: nil, serviceToken: nil, logger: quietLogger)
            dispatcher.onLoop(Stamp.self, access: .open, database: database) { request, _, db in
                try db.execute(sql: "INSERT INTO item (name) VALUES (?)", arguments: [request.token])
                db.afterNextTransaction(onCommit: { _ in _ = Stamped.committed.withLock { $0.insert(request.token) } })
                return Stamped(token: request.token)
            }
            let replies = Replies()
            let token = UUID().uuidString
            dispatcher.handleOnLoop(
                [try replies.request(Stamp(token: token), number: 0)], refusing: nil, rejected: {},
                defer: { _ in Issue.record("deferred") })
            let stamped = try #require(replies.messages.withLock { $0[0] }).payload(as: Stamped.self)
            #expect(stamped.token == token)
            #expect(stamped.encodedAfterCommit, "the reply was encoded inside the transaction, before its commit")
        }
    }
    struct Whom: APIRequest {
        typealias Response = Named
        static let type = "test.whom"
    }

    struct Named: Codable, Sendable, Hashable {
        var uid: String
    }

    /// Knows "token-<uid>" as a session of <uid>, and answers from a task (the protocol's default
    /// for callers on the bus's thread).
    struct TaskSessions: SessionVerifier {
        func uid(forSessionToken token: String) async throws -> String {
            guard token.hasPrefix("token-") else { throw ServiceError(.unauthenticated, "Unknown session.") }
            return String(token.dropFirst("token-".count))
        }
    }

    @Test(
        "a route for apps and services is registered once, on the loop: a service's request runs in the batch, an app's once its session is verified"
    )
    func sessionOrServiceOnTheLoop() async throws {
        let database = try DatabaseQueue()
        var dispatcher = RequestDispatcher(source: "test", sessions: TaskSessions(), serviceToken: "secret", logger: quietLogger)
        dispatcher.onLoop(Whom.self, access: .sessionOrService, database: database, writes: false) { _, context, _ in
            Named(uid: try context.requireUID())
        }
        let (replies, received) = AsyncStream.makeStream(of: (Int, Message?).self)
        func request(_ number: Int, uid: String?, sessionToken: String? = nil, serviceToken: String? = nil) throws -> RawRequest {
            var header = EnvelopeHeader(type: Whom.type, source: "test", uid: uid)
            header.sessionToken = sessionToken
            header.serviceToken = serviceToken
            return RawRequest(body: try Envelope(header: header, payload: Whom()).encoded(), attachment: nil) { reply in
                received.yield((number, try? Message(body: reply.body)))
            }
        }
        let batch = [
            try request(0, uid: "svc-named", serviceToken: "secret"),
            try request(1, uid: "ignored", sessionToken: "token-app-person"),
            try request(2, uid: "someone"),
            try request(3, uid: nil, sessionToken: "forged"),
        ]
        dispatcher.handleOnLoop(batch, refusing: nil, rejected: {}, defer: { _ in Issue.record("deferred to a task route") })
        var answers: [Int: Message?] = [:]
        for await (number, message) in replies {
            answers[number] = message
            if answers.count == batch.count { break }
        }
        #expect(try answers[0]??.payload(as: Named.self) == Named(uid: "svc-named"))
        #expect(try answers[1]??.payload(as: Named.self) == Named(uid: "app-person"), "the session decides, not the envelope's uid")
        #expect(answers[2]??.serviceError?.code == .unauthenticated, "neither token: an app without a session")
        #expect(answers[3]??.serviceError?.code == .unauthenticated)
    }
}
