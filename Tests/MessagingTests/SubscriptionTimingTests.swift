import Foundation
import Messaging
import Synchronization
import Testing

/// When a subscription starts to receive: the guarantees `MessageBus` states, on both buses
/// (the in-process one with its slow joiner on, as in every contract test).
@Suite("message bus contract: subscription timing", .timeLimit(.minutes(1)))
struct SubscriptionTimingTests {
    @Test("nothing published before subscribing is delivered", arguments: BusKind.allCases)
    func nothingFromBefore(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let publisher = try await buses.bindPublisher()
            for number in 0..<3 { try publisher.publish(event("user.before", text: "\(number)")) }
            let stream = try await buses.client.subscribe(to: [publisher.endpoint], topics: ["user."], limits: MessageLimits())
            var events = stream.makeAsyncIterator()
            try await waitUntilJoined(&events, publishers: [publisher], probeTopic: "user.probe")
            try publisher.publish(event("user.after"))
            #expect(await nextEvent(&events)?.topic == "user.after")
            publisher.close()
        }
    }

    @Test(
        "events published from the moment of subscribing: the first may be lost, what arrives is an unbroken, ordered run",
        arguments: BusKind.allCases)
    func joiningLosesOnlyAPrefix(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let publisher = try await buses.bindPublisher()
            let stream = try await buses.client.subscribe(to: [publisher.endpoint], topics: ["user."], limits: MessageLimits())
            // Numbered events from the moment `subscribe` returned, until 50 have arrived.
            let sending = Task {
                var number = 0
                while !Task.isCancelled {
                    try publisher.publish(event("user.numbered", text: "\(number)"))
                    number += 1
                    if number % 10 == 0 { try await Task.sleep(for: .milliseconds(2)) }
                }
            }
            var received: [Int] = []
            for await message in stream {
                received.append(Int(try message.payload(as: Echo.self).text) ?? -1)
                if received.count == 50 { break }
            }
            sending.cancel()
            let first = try #require(received.first)
            #expect(received == Array(first..<(first + 50)), "lost or reordered after the first: \(received)")
            publisher.close()
        }
    }

    @Test("a subscriber that has received one event receives every later one", arguments: BusKind.allCases)
    func joinedMeansComplete(kind: BusKind) async throws {
        try await withHarness(kind) { buses in
            let publisher = try await buses.bindPublisher()
            let stream = try await buses.client.subscribe(to: [publisher.endpoint], topics: ["user."], limits: MessageLimits())
            var events = stream.makeAsyncIterator()
            try await waitUntilJoined(&events, publishers: [publisher], probeTopic: "user.probe")
            for number in 0..<500 { try publisher.publish(event("user.burst", text: "\(number)")) }
            var received: [String] = []
            while received.count < 500, let message = await nextEvent(&events) {
                received.append(try message.payload(as: Echo.self).text)
            }
            #expect(received == (0..<500).map(String.init))
            publisher.close()
        }
    }
}
