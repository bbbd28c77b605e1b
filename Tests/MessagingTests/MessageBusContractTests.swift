import Foundation
import Messaging
import Synchronization
import Testing

/// The contract every ``MessageBus`` keeps, run against the in-process bus and the ZeroMQ bus.
@Suite("message bus contract", .timeLimit(.minutes(1)))
struct MessageBusContractTests {
    // MARK: Requests

    @Test("a request gets its reply, payload and attachment included", arguments: BusKind.allCases)
    func roundTrip(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let (endpoint, _) = try await buses.startServer(limits: MessageLimits(maxAttachmentBytes: 1024), handler: echoHandler)
            let request = try echoRequest("hello", number: 7, attachment: Data([1, 2, 3, 0, 255]))
            // A generous timeout: this test is about the reply, not its speed, and a CI run once
            // took over 5 s to answer it while the whole suite started at once on two cores.
            let reply = try await buses.client.request(request, to: endpoint, timeout: .seconds(30))

            #expect(reply.header.type == "test.echoed")
            #expect(reply.header.correlationId == (try Message(body: request.body).header.id))
            #expect(try reply.payload(as: Echo.self) == Echo(text: "hello", number: 7))
            #expect(reply.attachment == Data([1, 2, 3, 0, 255]))
            #expect(reply.serviceError == nil)
        }
    }

    @Test("many requests from one caller are in flight at once", arguments: BusKind.allCases)
    func concurrentRequests(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let (endpoint, _) = try await buses.startServer(handler: echoHandler)
            let client = buses.client
            try await withThrowingTaskGroup(of: (Int, Int).self) { group in
                for number in 0..<200 {
                    group.addTask {
                        let reply = try await client.request(
                            try echoRequest("n", number: number), to: endpoint, timeout: .seconds(10))
                        return (number, try reply.payload(as: Echo.self).number)
                    }
                }
                var answered = 0
                for try await (sent, received) in group {
                    #expect(sent == received)
                    answered += 1
                }
                #expect(answered == 200)
            }
        }
    }

    // MARK: Replicas

    @Test("requests to an endpoint listing replicas are spread over those that answer; one never started costs nothing",
          arguments: BusKind.allCases)
    func replicas(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            func replica(_ name: String) -> @Sendable (IncomingRequest) async -> Void {
                { request in request.reply(type: "test.echoed", source: name, payload: Echo(text: name)) }
            }
            let (first, _) = try await buses.startServer(handler: replica("first"))
            let (second, _) = try await buses.startServer(handler: replica("second"))
            let list = Endpoint(replicas: [first, Endpoints.fresh(), second])
            #expect(list.replicas.count == 3)
            var answeredBy: [String: Int] = [:]
            // Until both have answered: a connection may still be under way for the first few.
            for _ in 0..<200 where answeredBy.count < 2 {
                let reply = try await buses.client.request(try echoRequest("who?"), to: list, timeout: .seconds(30))
                answeredBy[try reply.payload(as: Echo.self).text, default: 0] += 1
            }
            #expect(Set(answeredBy.keys) == ["first", "second"])
        }
    }

    @Test("an endpoint listing replicas cannot be bound", arguments: BusKind.allCases)
    func bindingAList(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let list = Endpoint(replicas: [Endpoints.fresh(), Endpoints.fresh()])
            #expect(await serviceError { try await buses.server.serve(at: list, limits: MessageLimits()) }?.code == .invalidEndpoint)
            #expect(await serviceError { try await buses.server.publisher(at: list) }?.code == .invalidEndpoint)
        }
    }

    @Test("a subscription to an endpoint listing replicas hears every replica", arguments: BusKind.allCases)
    func subscribingToReplicas(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let first = try await buses.bindPublisher()
            let second = try await buses.bindPublisher()
            let stream = try await buses.client.subscribe(
                to: [Endpoint(replicas: [first.endpoint, second.endpoint])], topics: ["user."], limits: MessageLimits())
            var events = stream.makeAsyncIterator()
            try await waitUntilJoined(&events, publishers: [first, second], probeTopic: "user.probe")
            try first.publish(event("user.end", text: "first"))
            try second.publish(event("user.end", text: "second"))
            var heard: Set<String> = []
            while heard.count < 2, let message = await nextEvent(&events) {
                if message.topic == "user.end" { heard.insert(try message.payload(as: Echo.self).text) }
            }
            #expect(heard == ["first", "second"])
            first.close()
            second.close()
        }
    }

    @Test("a request to an endpoint where nothing listens fails fast with noResponder", arguments: BusKind.allCases)
    func noResponder(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let error = await serviceError {
                try await buses.client.request(try echoRequest("anyone?"), to: Endpoints.fresh(), timeout: .seconds(30))
            }
            // `noResponder`, not `timeout`: the caller was told before its timeout ran out. (No
            // clock check: a loaded machine runs everything late.)
            #expect(error?.code == .noResponder)
        }
    }

    @Test("a request the server never answers fails with timeout", arguments: BusKind.allCases)
    func timeout(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let (endpoint, requests) = try await buses.bindServer()
            var incoming = requests.makeAsyncIterator()
            let client = buses.client
            let call = Task { try await client.request(try echoRequest("hello?"), to: endpoint, timeout: .milliseconds(300)) }
            let received = await incoming.next()
            #expect(received != nil)
            let error = await serviceError { try await call.value }
            #expect(error?.code == .timeout)
        }
    }

    @Test("a reply that comes after the caller gave up is counted as late", arguments: BusKind.allCases)
    func lateReply(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let (endpoint, requests) = try await buses.bindServer()
            var incoming = requests.makeAsyncIterator()
            let client = buses.client
            let call = Task { try await client.request(try echoRequest("slow"), to: endpoint, timeout: .milliseconds(200)) }
            let request = try #require(await incoming.next())
            #expect(await serviceError { try await call.value }?.code == .timeout)

            request.reply(type: "test.echoed", source: "server", payload: Echo(text: "too late"))
            await eventually { client.statistics.lateReplies == 1 }
        }
    }

    @Test("cancelling the caller ends the call with CancellationError", arguments: BusKind.allCases)
    func cancellation(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let (endpoint, requests) = try await buses.bindServer()
            var incoming = requests.makeAsyncIterator()
            let client = buses.client
            let call = Task { try await client.request(try echoRequest("wait"), to: endpoint, timeout: .seconds(30)) }
            _ = try #require(await incoming.next())
            call.cancel()
            await #expect(throws: CancellationError.self) { try await call.value }
        }
    }

    @Test("an error reply comes back as a message carrying the service error", arguments: BusKind.allCases)
    func errorReply(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let (endpoint, _) = try await buses.startServer { request in
                request.fail(ServiceError("userNotFound", "No such person.", reason: "unknownUid"), source: "server")
            }
            // 30 s: a failure bound only (a full parallel run on two cores once took over 5 s).
            let reply = try await buses.client.request(try echoRequest("who?"), to: endpoint, timeout: .seconds(30))
            #expect(reply.header.type == ServiceError.messageType)
            #expect(reply.serviceError == ServiceError("userNotFound", "No such person.", reason: "unknownUid"))
        }
    }

    enum BadRequest: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case malformedJSON, unsupportedVersion, envelopeTooLarge, unexpectedAttachment, attachmentTooLarge

        var testDescription: String { rawValue }

        func message() throws -> OutgoingMessage {
            switch self {
            case .malformedJSON: OutgoingMessage(body: Data("{not json".utf8))
            case .unsupportedVersion: try echoRequest("future", version: 99)
            case .envelopeTooLarge: try echoRequest(String(repeating: "x", count: 2000))
            case .unexpectedAttachment: try echoRequest("with bytes", attachment: Data([1, 2, 3]))
            case .attachmentTooLarge: try echoRequest("with many bytes", attachment: Data(count: 100))
            }
        }

        var limits: MessageLimits {
            MessageLimits(maxEnvelopeBytes: 1024, maxAttachmentBytes: self == .attachmentTooLarge ? 64 : 0)
        }

        var expected: ErrorCode {
            switch self {
            case .malformedJSON: .invalidMessage
            case .unsupportedVersion: .unsupportedVersion
            case .envelopeTooLarge, .attachmentTooLarge: .messageTooLarge
            case .unexpectedAttachment: .unexpectedFrames
            }
        }

        /// Whether the reply names the request: only an envelope that was not read (over its
        /// limit) or that has no id to read goes without.
        var repliesWithID: Bool { self != .malformedJSON && self != .envelopeTooLarge }
    }

    @Test("the bus answers requests the server cannot read with a typed error, naming the request when its envelope was read",
          arguments: BusKind.allCases, BadRequest.allCases)
    func unreadableRequest(kind: BusKind, bad: BadRequest) async throws {
        try await withHarness(kind) { buses in
            let handled = Atomic<Int>(0)
            let (endpoint, _) = try await buses.startServer(limits: bad.limits) { request in
                handled.add(1, ordering: .relaxed)
                await echoHandler(request)
            }
            let request = try bad.message()
            let reply = try await buses.client.request(request, to: endpoint, timeout: .seconds(30))
            #expect(reply.serviceError?.code == bad.expected)
            #expect(reply.header.source == "bus")
            let sentID = (try? JSONSerialization.jsonObject(with: request.body) as? [String: Any])?["id"] as? String
            #expect(!bad.repliesWithID || sentID != nil)
            #expect(reply.header.correlationId == (bad.repliesWithID ? sentID : nil))
            #expect(handled.load(ordering: .relaxed) == 0)
            #expect(buses.server.statistics.rejectedRequests == 1)
        }
    }

    @Test("a request that finds the server's queue full is answered with overloaded", arguments: BusKind.allCases)
    func overloaded(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            // Queue of one and nobody taking requests: the first waits, the others are refused.
            let (endpoint, requests) = try await buses.bindServer(limits: MessageLimits(queueLimit: 1))
            let client = buses.client
            let outcomes = try await withThrowingTaskGroup(of: ErrorCode?.self) { group in
                for number in 0..<3 {
                    group.addTask {
                        do {
                            let reply = try await client.request(
                                try echoRequest("n", number: number), to: endpoint, timeout: .seconds(1))
                            return reply.serviceError?.code
                        } catch let error as ServiceError {
                            return error.code
                        }
                    }
                }
                return try await group.reduce(into: [ErrorCode?]()) { $0.append($1) }
            }
            #expect(outcomes.filter { $0 == .overloaded }.count == 2)
            #expect(outcomes.filter { $0 == .timeout }.count == 1)
            #expect(buses.server.statistics.overloadedRequests == 2)
            withExtendedLifetime(requests) {}
        }
    }

    @Test("binding the same endpoint twice fails with addressInUse", arguments: BusKind.allCases)
    func addressInUse(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let (endpoint, requests) = try await buses.bindServer()
            let error = await serviceError { try await buses.client.serve(at: endpoint, limits: MessageLimits()) }
            #expect(error?.code == .addressInUse)

            let publisher = try await buses.bindPublisher()
            let second = await serviceError { try await buses.client.publisher(at: publisher.endpoint) }
            #expect(second?.code == .addressInUse)
            withExtendedLifetime(requests) {}
            publisher.close()
        }
    }

    /// In-process the first request after unbinding already fails with `noResponder`. Over ZeroMQ
    /// a request racing the caller's noticing of the closed connection can still go out and time
    /// out; once the disconnection is seen (milliseconds), it is `noResponder` too.
    @Test("a server that stops taking requests leaves callers with noResponder", arguments: BusKind.allCases)
    func unbind(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let (endpoint, server) = try await buses.startServer(handler: echoHandler)
            _ = try await buses.client.request(try echoRequest("first"), to: endpoint, timeout: .seconds(30))
            server.cancel()
            await server.value

            let deadline = ContinuousClock.now + .seconds(10)
            var codes: [ErrorCode] = []
            while codes.last != .noResponder, ContinuousClock.now < deadline {
                let error = await serviceError {
                    try await buses.client.request(try echoRequest("again"), to: endpoint, timeout: .milliseconds(500))
                }
                codes.append(error?.code ?? "none")
            }
            #expect(codes.last == .noResponder)
            #expect(codes.allSatisfy { $0 == .noResponder || $0 == .timeout })
            if kind == .inProcess { #expect(codes == [.noResponder]) }
        }
    }

    /// The replies are handed over, then the stream ends at once (the task that owned it
    /// returns). On ZeroMQ the close of the ROUTER is queued right behind the replies; they must
    /// still reach every caller before the connections go down.
    @Test("replies given just before a server stops are all delivered", arguments: BusKind.allCases)
    func repliesBeforeUnbind(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let count = 64
            let attachment = Data(repeating: 0xAB, count: 16 * 1024)
            let limits = MessageLimits(maxAttachmentBytes: attachment.count)
            let (endpoints, endpointSink) = AsyncStream.makeStream(of: Endpoint.self)
            let server = Task {
                // The stream lives only in this task: when the task returns, it ends.
                let (endpoint, requests) = try await buses.bindServer(limits: limits)
                endpointSink.yield(endpoint)
                var received: [IncomingRequest] = []
                for await request in requests {
                    received.append(request)
                    if received.count == count { break }
                }
                for request in received { await echoHandler(request) }
                // Only now may the stream end (Swift may otherwise release it after its last use).
                withExtendedLifetime(requests) {}
                return received.count
            }
            var endpointIterator = endpoints.makeAsyncIterator()
            let endpoint = try #require(await endpointIterator.next())
            let client = buses.client
            try await withThrowingTaskGroup(of: (Int, Int?).self) { group in
                for number in 0..<count {
                    group.addTask {
                        let request = try echoRequest("n", number: number, attachment: attachment)
                        let reply = try await client.request(request, to: endpoint, timeout: .seconds(20))
                        #expect(reply.attachment == attachment)
                        return (number, try reply.payload(as: Echo.self).number)
                    }
                }
                var answered = 0
                for try await (sent, received) in group {
                    #expect(sent == received)
                    answered += 1
                }
                #expect(answered == count)
            }
            #expect(try await server.value == count)
        }
    }

    @Test("limits near Int.max are accepted and do not trap", arguments: BusKind.allCases)
    func hugeLimits(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let limits = MessageLimits(maxEnvelopeBytes: .max, maxAttachmentBytes: .max, queueLimit: 16)
            let (endpoint, _) = try await buses.startServer(limits: limits, handler: echoHandler)
            let reply = try await buses.client.request(
                try echoRequest("big limits", attachment: Data([7])), to: endpoint, timeout: .seconds(30))
            #expect(reply.attachment == Data([7]))

            let publisher = try await buses.bindPublisher()
            let stream = try await buses.client.subscribe(to: [publisher.endpoint], topics: ["user."], limits: limits)
            var events = stream.makeAsyncIterator()
            try await waitUntilJoined(&events, publishers: [publisher], probeTopic: "user.probe")
            publisher.close()
        }
    }

    // MARK: Events

    @Test("a subscriber gets the events of every endpoint whose topic matches a prefix", arguments: BusKind.allCases)
    func topicPrefixes(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let first = try await buses.bindPublisher()
            let second = try await buses.bindPublisher()
            let stream = try await buses.client.subscribe(
                to: [first.endpoint, second.endpoint], topics: ["user.", "auth.signIn"], limits: MessageLimits())
            var events = stream.makeAsyncIterator()
            try await waitUntilJoined(&events, publishers: [first, second], probeTopic: "user.probe")

            try first.publish(event("profile.updated"))
            try first.publish(event("user.created"))
            try first.publish(event("auth.signOut"))
            try second.publish(event("auth.signIn"))
            try second.publish(event("users"))
            try second.publish(event("user.deleted"))
            try first.publish(event("user.end", text: "first"))
            try second.publish(event("user.end", text: "second"))

            var received: [String] = []
            var ends = 0
            while ends < 2, let message = await nextEvent(&events) {
                received.append(message.topic ?? "?")
                if message.topic == "user.end" { ends += 1 }
            }
            #expect(received.sorted() == ["auth.signIn", "user.created", "user.deleted", "user.end", "user.end"])
            first.close()
            second.close()
        }
    }

    @Test("an event that cannot be read is dropped and counted", arguments: BusKind.allCases)
    func unreadableEvent(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let publisher = try await buses.bindPublisher()
            let stream = try await buses.client.subscribe(to: [publisher.endpoint], topics: ["user."], limits: MessageLimits())
            var events = stream.makeAsyncIterator()
            try await waitUntilJoined(&events, publishers: [publisher], probeTopic: "user.probe")

            try publisher.publish(OutgoingMessage(topic: "user.garbled", body: Data("not an envelope".utf8)))
            try publisher.publish(event("user.fine"))
            let next = await nextEvent(&events)
            #expect(next?.topic == "user.fine")
            #expect(buses.client.statistics.unreadableEvents == 1)
            publisher.close()
        }
    }

    @Test("a subscriber that falls behind loses the newest events, counted", arguments: BusKind.allCases)
    func droppedEvents(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let publisher = try await buses.bindPublisher()
            let stream = try await buses.client.subscribe(
                to: [publisher.endpoint], topics: ["user."], limits: MessageLimits(queueLimit: 2))
            var events = stream.makeAsyncIterator()
            try await waitUntilJoined(&events, publishers: [publisher], probeTopic: "user.probe")

            // Nobody reads now: at most two of these (or probes still in flight) fit.
            for number in 0..<5 { try publisher.publish(event("user.burst", text: "\(number)")) }
            let client = buses.client
            await eventually { client.statistics.droppedEvents >= 3 }
            publisher.close()
        }
    }

    @Test("a closed publisher refuses to publish", arguments: BusKind.allCases)
    func closedPublisher(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let publisher = try await buses.bindPublisher()
            publisher.close()
            #expect(throws: ServiceError(.closed, "The publisher at \(publisher.endpoint) is closed.")) {
                try publisher.publish(event("user.late"))
            }
        }
    }
}
