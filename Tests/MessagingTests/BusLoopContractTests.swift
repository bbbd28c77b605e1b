import Foundation
import Messaging
import Synchronization
import Testing

/// The contract of handlers on the bus's own thread (`serve(onLoop:)`, `subscribe(onLoop:)`),
/// run against the in-process bus and the ZeroMQ bus.
@Suite("message bus contract: loop handlers", .timeLimit(.minutes(1)))
struct BusLoopContractTests {
    @Test("a loop server answers every request, on one thread that is not a Swift concurrency thread", arguments: BusKind.allCases)
    func loopServerAnswers(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let threads = Mutex<Set<UInt>>([])
            let (endpoint, registration) = try await bindRetrying { endpoint in
                try await buses.server.serve(at: endpoint, limits: MessageLimits(maxAttachmentBytes: 64)) { batch in
                    threads.withLock { _ = $0.insert(UInt(pthread_self())) }
                    for raw in batch { Self.echo(raw) }
                }
            }
            defer { registration.close() }
            let client = buses.client
            try await withThrowingTaskGroup(of: (Int, Int).self) { group in
                for number in 0..<200 {
                    group.addTask {
                        let reply = try await client.request(
                            try echoRequest("n", number: number, attachment: number == 7 ? Data([7]) : nil), to: endpoint,
                            timeout: .seconds(10))
                        if number == 7 { #expect(reply.attachment == Data([7])) }
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
            #expect(threads.withLock { $0.count } == 1)
        }
    }

    @Test("the bus answers a request over a loop server's limits itself", arguments: BusKind.allCases)
    func loopServerLimits(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let calls = Atomic(0)
            let (endpoint, registration) = try await bindRetrying { endpoint in
                try await buses.server.serve(at: endpoint, limits: MessageLimits(maxEnvelopeBytes: 256, maxAttachmentBytes: 8)) {
                    batch in
                    calls.add(batch.count, ordering: .relaxed)
                    for raw in batch { Self.echo(raw) }
                }
            }
            defer { registration.close() }
            let reply = try await buses.client.request(
                try echoRequest(String(repeating: "x", count: 400)), to: endpoint, timeout: .seconds(10))
            #expect(reply.serviceError?.code == .messageTooLarge)
            #expect(reply.header.correlationId == nil, "the envelope was not read")
            let heavy = try echoRequest("heavy", attachment: Data(count: 9))
            let heavyReply = try await buses.client.request(heavy, to: endpoint, timeout: .seconds(10))
            #expect(heavyReply.serviceError?.code == .messageTooLarge)
            #expect(heavyReply.header.correlationId == (try Message(body: heavy.body).header.id), "the envelope was read")
            #expect(calls.load(ordering: .relaxed) == 0)
            // Still serving.
            let small = try await buses.client.request(try echoRequest("ok", number: 3), to: endpoint, timeout: .seconds(10))
            #expect(try small.payload(as: Echo.self).number == 3)
        }
    }

    @Test("a loop handler may answer later, from a task", arguments: BusKind.allCases)
    func answerLater(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let (endpoint, registration) = try await bindRetrying { endpoint in
                try await buses.server.serve(at: endpoint, limits: MessageLimits()) { batch in
                    for raw in batch {
                        Task {
                            try? await Task.sleep(for: .milliseconds(20))
                            Self.echo(raw)
                        }
                    }
                }
            }
            defer { registration.close() }
            let reply = try await buses.client.request(try echoRequest("later", number: 9), to: endpoint, timeout: .seconds(10))
            #expect(try reply.payload(as: Echo.self) == Echo(text: "later", number: 9))
        }
    }

    @Test("events published from a loop handler go out; a loop subscriber gets its topics only", arguments: BusKind.allCases)
    func loopEvents(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let publisher = try await buses.bindPublisher()
            defer { publisher.close() }
            // The server publishes one event per request, from its loop handler.
            let (endpoint, server) = try await bindRetrying { endpoint in
                try await buses.server.serve(at: endpoint, limits: MessageLimits()) { batch in
                    for raw in batch {
                        let number = (try? Message(body: raw.body).payload(as: Echo.self).number) ?? -1
                        try? publisher.publish(event(number.isMultiple(of: 2) ? "even.\(number)" : "odd.\(number)", text: "\(number)"))
                        Self.echo(raw)
                    }
                }
            }
            defer { server.close() }
            var (iterator, subscription) = try await joinedLoopSubscription(buses, to: publisher, topics: ["even."])
            defer { subscription.close() }
            for number in 0..<10 {
                _ = try await buses.client.request(try echoRequest("n", number: number), to: endpoint, timeout: .seconds(10))
            }
            var received: [String] = []
            while received.count < 5, let raw = await iterator.next() {
                let message = try Message(topic: raw.topic, body: raw.body)
                if message.header.type == probeType { continue }
                received.append(raw.topic)
            }
            #expect(received == ["even.0", "even.2", "even.4", "even.6", "even.8"])
        }
    }

    @Test("closing a loop server unbinds it", arguments: BusKind.allCases)
    func closeUnbinds(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let (endpoint, registration) = try await bindRetrying { endpoint in
                try await buses.server.serve(at: endpoint, limits: MessageLimits()) { batch in
                    for raw in batch { Self.echo(raw) }
                }
            }
            _ = try await buses.client.request(try echoRequest("first"), to: endpoint, timeout: .seconds(10))
            registration.close()
            registration.close()
            // The endpoint is free again: a new server can bind it.
            var rebound: (any BusLoopRegistration)?
            for _ in 0..<100 where rebound == nil {
                rebound = try? await buses.server.serve(at: endpoint, limits: MessageLimits()) { _ in }
                if rebound == nil { try await Task.sleep(for: .milliseconds(20)) }
            }
            #expect(rebound != nil)
            rebound?.close()
        }
    }

    @Test("a request from the loop gets its reply on the loop; one to nowhere fails with noResponder", arguments: BusKind.allCases)
    func loopRequests(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let (endpoint, server) = try await bindRetrying { endpoint in
                try await buses.server.serve(at: endpoint, limits: MessageLimits()) { batch in
                    for raw in batch { Self.echo(raw) }
                }
            }
            defer { server.close() }
            let (outcomes, sink) = AsyncStream.makeStream(of: (Int, Result<Message, ServiceError>).self)
            let client = buses.client
            for number in 0..<20 {
                client.request(try echoRequest("n", number: number), to: endpoint, timeout: .seconds(10)) { result in
                    sink.yield((number, result))
                }
            }
            client.request(try echoRequest("anyone?"), to: Endpoints.fresh(), timeout: .seconds(30)) { result in
                sink.yield((-1, result))
            }
            var seen = Set<Int>()
            for await (number, result) in outcomes {
                if number == -1 {
                    #expect(throws: ServiceError.self) { try result.get() }
                    #expect((try? result.get()) == nil)
                    if case .failure(let error) = result { #expect(error.code == .noResponder) }
                } else {
                    #expect(try result.get().payload(as: Echo.self).number == number)
                }
                seen.insert(number)
                if seen.count == 21 { break }
            }
        }
    }

    @Test("a loop handler can call another server and answer from the reply's callback", arguments: BusKind.allCases)
    func chainedOnLoop(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let (backend, backendRegistration) = try await bindRetrying { endpoint in
                try await buses.server.serve(at: endpoint, limits: MessageLimits()) { batch in
                    for raw in batch { Self.echo(raw) }
                }
            }
            defer { backendRegistration.close() }
            // The front asks the back end on behalf of each caller, all on its bus's thread.
            let front = buses.server
            let (endpoint, frontRegistration) = try await bindRetrying { endpoint in
                try await front.serve(at: endpoint, limits: MessageLimits()) { batch in
                    for raw in batch {
                        let forwarded = OutgoingMessage(body: raw.body)
                        front.request(forwarded, to: backend, timeout: .seconds(10)) { result in
                            switch result {
                            case .success(let reply): raw.reply(OutgoingMessage(body: reply.body))
                            case .failure(let error): raw.reply(Message.errorReply(error, correlationId: nil, source: "front"))
                            }
                        }
                    }
                }
            }
            defer { frontRegistration.close() }
            let reply = try await buses.client.request(try echoRequest("via", number: 42), to: endpoint, timeout: .seconds(10))
            #expect(try reply.payload(as: Echo.self) == Echo(text: "via", number: 42))
        }
    }

    @Test("a loop subscription joins like any: the first events may be lost, what arrives is an unbroken, ordered run", arguments: BusKind.allCases)
    func loopSubscriptionTiming(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let publisher = try await buses.bindPublisher()
            defer { publisher.close() }
            let (events, sink) = AsyncStream.makeStream(of: RawEvent.self)
            let subscription = try await buses.client.subscribe(to: [publisher.endpoint], topics: ["user."], limits: MessageLimits()) { batch in
                for event in batch { sink.yield(event) }
            }
            defer { subscription.close() }
            let sending = Task {
                var number = 0
                while !Task.isCancelled {
                    try publisher.publish(event("user.numbered", text: "\(number)"))
                    number += 1
                    if number % 10 == 0 { try await Task.sleep(for: .milliseconds(2)) }
                }
            }
            var received: [Int] = []
            for await raw in events {
                received.append(Int(try Message(topic: raw.topic, body: raw.body).payload(as: Echo.self).text) ?? -1)
                if received.count == 50 { break }
            }
            sending.cancel()
            let first = try #require(received.first)
            #expect(received == Array(first..<(first + 50)), "lost or reordered after the first: \(received)")
        }
    }

    @Test(
        "events numbered in turn go out in that order, whether tasks or jobs on the bus's thread numbered them",
        arguments: BusKind.allCases)
    func numberedEventsKeepTheirOrder(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let publisher = try await buses.bindPublisher()
            defer { publisher.close() }
            var (iterator, subscription) = try await joinedLoopSubscription(buses, to: publisher, topics: ["numbered"])
            defer { subscription.close() }
            // As the outbox does: an event is numbered and handed to its publisher under the
            // writer's lock (its commit), by tasks and by jobs on the bus's thread, in a random
            // mix; jobs queue behind the tasks' sends and the tasks' sends behind jobs.
            let writer = Mutex(0)
            let commit: @Sendable () -> Void = {
                writer.withLock { number in
                    number += 1
                    try? publisher.publish(event("numbered", text: "\(number)"))
                }
            }
            let server = buses.server
            let perProducer = 500
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<4 {
                    group.addTask {
                        for _ in 0..<perProducer {
                            if Bool.random() { #expect(server.perform(onLoop: commit)) } else { commit() }
                            if Int.random(in: 0..<16) == 0 { await Task.yield() }
                        }
                    }
                }
            }
            var received: [Int] = []
            while received.count < 4 * perProducer, let raw = await iterator.next() {
                if raw.topic == "probe" { continue }
                received.append(Int(try Message(topic: raw.topic, body: raw.body).payload(as: Echo.self).text) ?? -1)
            }
            let outOfOrder = zip(received, received.dropFirst()).first { $0.0 + 1 != $0.1 }
            #expect(outOfOrder == nil, "\(received.count) events; the first out of order: \(String(describing: outOfOrder))")
        }
    }

    /// Answers `raw` with its own payload, or with the error reading it gives.
    static func echo(_ raw: RawRequest) {
        do throws(ServiceError) {
            let request = raw.incoming(try Message(body: raw.body, attachment: raw.attachment))
            request.reply(type: "test.echoed", source: "server", payload: try request.message.payload(as: Echo.self), attachment: raw.attachment)
        } catch {
            raw.reply(Message.errorReply(error, correlationId: nil, source: "server"))
        }
    }
}

/// A loop subscription of `buses.client` to `publisher` for `topics` (and the probes), its events
/// as a stream, returned once it has joined.
func joinedLoopSubscription(
    _ buses: Harness, to publisher: any EventPublisher, topics: [String]
) async throws -> (AsyncStream<RawEvent>.Iterator, any BusLoopRegistration) {
    let (events, sink) = AsyncStream.makeStream(of: RawEvent.self)
    let subscription = try await buses.client.subscribe(to: [publisher.endpoint], topics: topics + ["probe"], limits: MessageLimits()) {
        batch in
        for event in batch { sink.yield(event) }
    }
    var iterator = events.makeAsyncIterator()
    do {
        try await waitUntilLoopJoined(&iterator, publisher: publisher)
    } catch {
        subscription.close()
        throw error
    }
    return (iterator, subscription)
}

/// Publishes probes until the loop subscriber has seen one (the ZeroMQ slow joiner).
func waitUntilLoopJoined(_ events: inout AsyncStream<RawEvent>.Iterator, publisher: any EventPublisher) async throws {
    let prober = Task {
        let deadline = ContinuousClock.now + .seconds(20)
        while !Task.isCancelled, ContinuousClock.now < deadline {
            try? publisher.publish(event("probe", type: probeType))
            try? await Task.sleep(for: .milliseconds(10))
        }
    }
    defer { prober.cancel() }
    while let raw = await events.next() {
        if raw.topic == "probe" { return }
    }
    Issue.record("The subscription ended before it joined")
}
