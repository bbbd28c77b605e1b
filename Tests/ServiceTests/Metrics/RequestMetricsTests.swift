import CoreMetrics
import Foundation
import FuzzKit
import GRDB
import Messaging
import MetricsTestKit
import OnboardingAPI
@testable import ServiceRuntime
import Synchronization
import Testing

/// What a service counts and times per request, without sockets: a dispatcher made under a
/// test's own metrics factory, handed batches directly.
@Suite("Request metrics: count and latency by type and outcome")
struct RequestMetricsTests {
    struct Add: APIRequest {
        typealias Response = Acknowledged
        static let type = "test.add"
        var name: String
    }

    struct Slow: APIRequest {
        typealias Response = Acknowledged
        static let type = "test.slow"
    }

    /// `test.add` refuses "taken" and fails inside the store for "broken"; `test.slow` is answered by a task.
    func dispatcher(_ database: any DatabaseWriter) -> RequestDispatcher {
        var dispatcher = RequestDispatcher(source: "test", sessions: nil, serviceToken: nil, logger: quietLogger)
        dispatcher.onLoop(Add.self, access: .open, database: database) { request, _, db in
            if request.name == "taken" { throw ServiceError(.usernameTaken, "taken") }
            if request.name == "broken" { try db.execute(sql: "INSERT INTO nowhere VALUES (1)") }
            try db.execute(sql: "INSERT INTO item (name) VALUES (?)", arguments: [request.name])
            return Acknowledged()
        }
        dispatcher.on(Slow.self, access: .open) { _, _ in Acknowledged() }
        return dispatcher
    }

    final class Replies: Sendable {
        let list = Mutex<[OutgoingMessage]>([])
        var count: Int { list.withLock { $0.count } }
    }

    func raw(_ body: Data, replies: Replies) -> RawRequest {
        RawRequest(body: body, attachment: nil) { reply in replies.list.withLock { $0.append(reply) } }
    }

    func request<R: APIRequest>(_ payload: R, replies: Replies) throws -> RawRequest {
        raw(try Envelope(header: EnvelopeHeader(type: R.type, source: "test"), payload: payload).encoded(), replies: replies)
    }

    @Test("answers, refusals, store failures, unknown types and unreadable requests each count under their own outcome")
    func outcomes() throws {
        let metrics = TestMetrics()
        let database = try DatabaseQueue()
        try database.write { try $0.execute(sql: "CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT NOT NULL)") }
        let dispatcher = withMetricsFactory(metrics) { self.dispatcher(database) }
        let replies = Replies()
        let batch = [
            try request(Add(name: "a"), replies: replies),
            try request(Add(name: "b"), replies: replies),
            try request(Add(name: "taken"), replies: replies),
            try request(Add(name: "broken"), replies: replies),
            raw(Data(#"{"type":"#.utf8), replies: replies),
            raw(try Envelope(header: EnvelopeHeader(type: "test.nothing", source: "test"), payload: Acknowledged()).encoded(), replies: replies),
        ]
        dispatcher.handleOnLoop(batch, refusing: nil, rejected: {}) { incoming in
            incoming.fail(ServiceError(.unknownType, "no"), source: "test")
        }
        #expect(replies.count == 6)

        func count(_ type: String, _ outcome: String) throws -> Int64 {
            try metrics.expectCounter("onboarding_requests_total", [("type", type), ("outcome", outcome)]).totalValue
        }
        #expect(try count(Add.type, "ok") == 2)
        #expect(try count(Add.type, "usernameTaken") == 1)
        #expect(try count(Add.type, "storeUnavailable") == 1)
        #expect(try count("unreadable", "invalidMessage") == 1)
        #expect(try count("unknown", "unknownType") == 1)
        let answered = try metrics.expectTimer("onboarding_request_duration_seconds", [("type", Add.type), ("outcome", "ok")])
        #expect(answered.values.count == 2)
        #expect(answered.values.allSatisfy { $0 >= 0 && $0 < 10_000_000_000 })
        let failed = try metrics.expectTimer("onboarding_request_duration_seconds", [("type", Add.type), ("outcome", "error")])
        #expect(failed.values.count == 2)
    }

    @Test("in any order and any batching, every reply is counted once, under the outcome it carries")
    func anyOrder() throws {
        for index in 0..<200 {
            var random = FuzzRandom(seed: 20261128, case: index)
            let metrics = TestMetrics()
            let database = try DatabaseQueue()
            try database.write { try $0.execute(sql: "CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT NOT NULL)") }
            let dispatcher = withMetricsFactory(metrics) { self.dispatcher(database) }
            let replies = Replies()
            var sent = 0
            // Batches as they come off the bus: of any size, in any order of kinds.
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                var batch: [RawRequest] = []
                for _ in 0..<Int.random(in: 1...12, using: &random) {
                    sent += 1
                    switch Int.random(in: 0..<5, using: &random) {
                    case 0: batch.append(try request(Add(name: "n\(sent)"), replies: replies))
                    case 1: batch.append(try request(Add(name: "taken"), replies: replies))
                    case 2: batch.append(try request(Add(name: "broken"), replies: replies))
                    case 3: batch.append(raw(Data(#"{"type":"#.utf8), replies: replies))
                    default:
                        let header = EnvelopeHeader(type: "test.nothing", source: "test")
                        batch.append(raw(try Envelope(header: header, payload: Acknowledged()).encoded(), replies: replies))
                    }
                }
                dispatcher.handleOnLoop(batch, refusing: nil, rejected: {}) { incoming in
                    incoming.fail(ServiceError(.unknownType, "no"), source: "test")
                }
            }
            let outcomes = replies.list.withLock { $0.map { $0.failure?.rawValue ?? "ok" } }
            #expect(outcomes.count == sent, "case \(index)")
            var counted: [String: Int64] = [:]
            for counter in metrics.counters(label: "onboarding_requests_total") {
                let outcome = counter.dimensions.first { $0.0 == "outcome" }?.1 ?? "?"
                counted[outcome, default: 0] += counter.totalValue
            }
            let expected = Dictionary(outcomes.map { ($0, Int64(1)) }, uniquingKeysWith: +)
            #expect(counted.filter { $0.value > 0 } == expected, "case \(index)")
            let timed = metrics.timers(label: "onboarding_request_duration_seconds").reduce(0) { $0 + $1.values.count }
            #expect(timed == sent, "case \(index)")
        }
    }

    @Test("no label carries what a request says: an unknown type is 'unknown', and error codes are bounded")
    func boundedLabels() throws {
        let metrics = TestMetrics()
        let figures = withMetricsFactory(metrics) { RequestFigures(type: "test.add") }
        for index in 0..<(RequestFigures.maxCodes + 10) {
            var reply = OutgoingMessage(body: Data())
            reply.failure = ErrorCode(rawValue: "code\(index)x")
            figures.replied(reply, received: .now)
        }
        var odd = OutgoingMessage(body: Data())
        odd.failure = ErrorCode(rawValue: "not a code {uid=\"x\"}")
        figures.replied(odd, received: .now)
        let outcomes = Set(metrics.counters(label: "onboarding_requests_total").compactMap { counter in
            counter.dimensions.first { $0.0 == "outcome" }?.1
        })
        #expect(outcomes.count <= RequestFigures.maxCodes + 2)
        #expect(outcomes.contains("other"))
        #expect(!outcomes.contains { $0.contains(" ") || $0.contains("{") })
    }

    @Test("a task route's reply is counted too, with the time since the request arrived")
    func taskRoutes() async throws {
        let metrics = TestMetrics()
        let database = try DatabaseQueue()
        let dispatcher = withMetricsFactory(metrics) { self.dispatcher(database) }
        let replies = Replies()
        let slow = try request(Slow(), replies: replies)
        var deferred: IncomingRequest?
        dispatcher.handleOnLoop([slow], refusing: nil, rejected: {}) { deferred = $0 }
        let incoming = try #require(deferred)
        await dispatcher.handle(incoming)
        #expect(try metrics.expectCounter("onboarding_requests_total", [("type", Slow.type), ("outcome", "ok")]).totalValue == 1)
        #expect(try metrics.expectTimer("onboarding_request_duration_seconds", [("type", Slow.type), ("outcome", "ok")]).values.count == 1)
    }
}

@Suite("Event and feed metrics")
struct EventMetricsTests {
    final class Sink: EventPublisher {
        let endpoint = Endpoint("inproc://sink")
        func publish(_ message: OutgoingMessage) throws {}
        func close() {}
    }

    @Test("published events count by type; a route intent's topic (which names the person) counts as route.intent")
    func published() throws {
        let metrics = TestMetrics()
        let publisher = withMetricsFactory(metrics) { CountingPublisher(Sink(), types: [SignedIn.self]) }
        try publisher.publish(OutgoingMessage(topic: SignedIn.type, body: Data()))
        try publisher.publish(OutgoingMessage(topic: SignedIn.type, body: Data()))
        try publisher.publish(OutgoingMessage(topic: Topics.route(uid: "0190f2a4-0000-7000-8000-000000000001"), body: Data()))
        try publisher.publish(OutgoingMessage(topic: "something.else", body: Data()))
        func count(_ type: String) throws -> Int64 {
            try metrics.expectCounter("onboarding_events_published_total", [("type", type)]).totalValue
        }
        #expect(try count(SignedIn.type) == 2)
        #expect(try count(RouteIntent.type) == 1)
        #expect(try count("other") == 1)
        #expect(metrics.counters(label: "onboarding_events_published_total").allSatisfy { counter in
            !counter.dimensions.contains { $0.1.contains("0190f2a4") }
        })
    }

    @Test("a feed's lag: events the publisher has that are not handled, and how long ago the last handled one was committed")
    func lag() {
        var statistics = FeedStatistics(publisher: "tcp://x", sequence: 10)
        #expect(statistics.lag() == (0, 0))
        statistics.newest = 10
        statistics.lastHandledTime = "2026-11-27T10:00:00.000Z"
        #expect(statistics.lag() == (0, 0))
        statistics.newest = 25
        let now = Timestamp.parse("2026-11-27T10:00:07.500Z")!
        #expect(statistics.lag(now: now) == (15, 7.5))
        statistics.lastHandledTime = nil
        #expect(statistics.lag(now: now) == (15, 0))
    }

    @Test("the fast timestamp reader agrees with the formatter, and falls back for other forms")
    func timestamps() throws {
        for seconds in [0.0, 951_782_400.123, 1_795_000_000.999, 4_102_444_799.5] {
            let text = Timestamp.format(Date(timeIntervalSince1970: seconds))
            let fast = try #require(Timestamp.parseFast(text)), slow = try #require(Timestamp.parse(text))
            #expect(abs(fast.timeIntervalSince(slow)) < 1e-6, "\(text)")
        }
        #expect(Timestamp.parseFast("2026-11-27T10:00:00Z") == Timestamp.parse("2026-11-27T10:00:00Z"))
        #expect(Timestamp.parseFast("2026-13-27T10:00:00.000Z") == nil)
        #expect(Timestamp.parseFast("not a time") == nil)
    }
}
