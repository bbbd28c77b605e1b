import Foundation
import FuzzKit
import GRDB
import Logging
import Messaging
import OnboardingAPI
@testable import ServiceRuntime
import TestSupport
import Testing

@Suite("Event feed", .timeLimit(.minutes(1)))
struct EventFeedTests {
    /// Runs `body` with a publisher that answers `events.after`, on a bus that counts requests.
    func withPublisher<Result: Sendable>(
        serving: Bool = true, _ body: (OutboxPublisher, ObservedBus) async throws -> Result
    ) async throws -> Result {
        try await withTemporaryDirectory { directory in
            let bus = ObservedBus()
            let publisher = try await OutboxPublisher.make(bus: bus, directory: directory)
            defer { publisher.publisher.close() }
            guard serving else { return try await body(publisher, bus) }
            return try await publisher.serving { try await body(publisher, bus) }
        }
    }

    /// Waits until the feed has asked `events.after` successfully `count` times: after the first,
    /// it is caught up and reading the live stream.
    func waitUntilReplayed(_ bus: ObservedBus, times count: Int = 1) async throws {
        // The publisher's own `health` check counts too.
        try await bus.requests.wait { $0.succeeded >= count + 1 }
    }

    @Test("events published before the feed started are fetched, then live ones follow", arguments: FeedMode.allCases)
    func catchesUp(mode: FeedMode) async throws {
        try await withPublisher { publisher, bus in
            for _ in 1...5 { try await publisher.append() }
            let feed = makeFeed(bus: bus)
            let recorder = FeedRecorder()
            try await withFeed(feed, recorder: recorder, mode: mode) {
                try await recorder.waitUntilHandled(through: 5)
                try await waitUntilReplayed(bus)
                try await publisher.append()
                try await recorder.waitUntilHandled(through: 6)
            }
            #expect(recorder.delivered == [1, 2, 3, 4, 5, 6])
            let statistics = feed.statistics
            #expect(statistics.sequence == 6)
            #expect(statistics.handled == 6)
            #expect(statistics.replayed == 5)
            #expect(statistics.lost == 0)
            #expect(statistics.publisher == OutboxPublisher.rpc.rawValue)
        }
    }

    @Test("a feed starting from its stored cursor gets only what came after it", arguments: FeedMode.allCases)
    func startsAfterCursor(mode: FeedMode) async throws {
        try await withPublisher { publisher, bus in
            for _ in 1...4 { try await publisher.append() }
            let recorder = FeedRecorder()
            try await withFeed(makeFeed(bus: bus), after: 2, recorder: recorder, mode: mode) {
                try await recorder.waitUntilHandled(through: 4)
            }
            #expect(recorder.calls.value == [.init(sequences: [3, 4], through: 4)])
        }
    }

    @Test("an event missing from the live stream is fetched before the one after it is handled", arguments: FeedMode.allCases)
    func fillsGap(mode: FeedMode) async throws {
        try await withPublisher { publisher, bus in
            let feed = makeFeed(bus: bus)
            let recorder = FeedRecorder()
            try await withFeed(feed, recorder: recorder, mode: mode) {
                try await waitUntilReplayed(bus)
                try await publisher.append()
                try await recorder.waitUntilHandled(through: 1)
                try await publisher.append(live: false)
                try await publisher.append()
                try await recorder.waitUntilHandled(through: 3)
            }
            #expect(recorder.calls.value == [.init(sequences: [1], through: 1), .init(sequences: [2, 3], through: 3)])
            let statistics = feed.statistics
            #expect(statistics.replayed == 2)
            #expect(statistics.handled == 3)
            #expect(statistics.duplicatesDropped == 0)
        }
    }

    @Test("events that arrive a little out of order, as two replicas publish them, are put in order without a fetch")
    func reordersReplicas() async throws {
        try await withPublisher { publisher, bus in
            // Long enough that the test never fetches on a slow machine.
            let feed = makeFeed(bus: bus, reorderWait: .seconds(30))
            let recorder = FeedRecorder()
            try await withFeed(feed, recorder: recorder, mode: .task) {
                try await waitUntilReplayed(bus)
                // Replica A commits 1 and B commits 2, but B publishes first.
                try await publisher.append(live: false)
                try await publisher.append()
                try await publisher.republish(1)
                try await recorder.waitUntilHandled(through: 2)
            }
            #expect(recorder.delivered == [1, 2])
            let statistics = feed.statistics
            #expect(statistics.replayed == 0)
            #expect(statistics.handled == 2)
            #expect(statistics.duplicatesDropped == 0)
        }
    }

    @Test("a lost last event is found when the live stream stays quiet", arguments: FeedMode.allCases)
    func idleCheckFindsTail(mode: FeedMode) async throws {
        try await withPublisher { publisher, bus in
            let feed = makeFeed(bus: bus, idleCheck: .milliseconds(20))
            let recorder = FeedRecorder()
            try await withFeed(feed, recorder: recorder, mode: mode) {
                try await waitUntilReplayed(bus)
                try await publisher.append(live: false)
                try await recorder.waitUntilHandled(through: 1)
            }
            #expect(recorder.delivered == [1])
            #expect(feed.statistics.replayed == 1)
        }
    }

    @Test("an event received again is dropped and counted", arguments: FeedMode.allCases)
    func dropsDuplicates(mode: FeedMode) async throws {
        try await withPublisher { publisher, bus in
            let feed = makeFeed(bus: bus)
            let recorder = FeedRecorder()
            try await withFeed(feed, recorder: recorder, mode: mode) {
                try await waitUntilReplayed(bus)
                try await publisher.append()
                try await recorder.waitUntilHandled(through: 1)
                try await publisher.republish(1)
                // A duplicate makes the feed check with events.after (a reset store repeats numbers too).
                try await waitUntilReplayed(bus, times: 2)
                try await publisher.append()
                try await recorder.waitUntilHandled(through: 2)
            }
            #expect(recorder.delivered == [1, 2])
            let statistics = feed.statistics
            #expect(statistics.duplicatesDropped == 1)
            #expect(statistics.handled == 2)
            #expect(statistics.replayed == 0)
        }
    }

    @Test("events pruned before the feed could fetch them are logged and counted as lost", arguments: FeedMode.allCases)
    func countsPrunedAsLost(mode: FeedMode) async throws {
        try await withPublisher { publisher, bus in
            for _ in 1...5 { try await publisher.append(live: false) }
            try await Outbox.prune(Outbox.Retention(maxEvents: 2), in: publisher.writer)
            let logs = LogCapture()
            let feed = makeFeed(bus: bus, logger: logs.logger)
            let recorder = FeedRecorder()
            try await withFeed(feed, after: 1, recorder: recorder, mode: mode) {
                try await recorder.waitUntilHandled(through: 5)
            }
            #expect(recorder.calls.value == [.init(sequences: [4, 5], through: 5)])
            #expect(feed.statistics.lost == 2)
            #expect(logs.entries.contains { $0.level == .error && $0.message.contains("2 events after 1") })
        }
    }

    @Test("when every event it missed was pruned, the feed moves its cursor to the newest", arguments: FeedMode.allCases)
    func everythingPruned(mode: FeedMode) async throws {
        try await withPublisher { publisher, bus in
            for _ in 1...3 { try await publisher.append(live: false) }
            try await Outbox.prune(Outbox.Retention(maxEvents: 0), in: publisher.writer)
            let feed = makeFeed(bus: bus)
            let recorder = FeedRecorder()
            try await withFeed(feed, recorder: recorder, mode: mode) {
                try await recorder.waitUntilHandled(through: 3)
            }
            #expect(recorder.calls.value == [.init(sequences: [], through: 3)])
            #expect(feed.statistics.lost == 3)
        }
    }

    @Test("a publisher whose store was reset is followed from its start", arguments: FeedMode.allCases)
    func followsResetStore(mode: FeedMode) async throws {
        try await withPublisher { publisher, bus in
            for _ in 1...2 { try await publisher.append(live: false) }
            let logs = LogCapture()
            let feed = makeFeed(bus: bus, logger: logs.logger)
            let recorder = FeedRecorder()
            try await withFeed(feed, after: 10, recorder: recorder, mode: mode) {
                try await recorder.calls.wait { $0.count >= 2 }
            }
            #expect(recorder.calls.value == [.init(sequences: [], through: 0), .init(sequences: [1, 2], through: 2)])
            #expect(logs.entries.contains { $0.level == .warning && $0.message.contains("reset") })
        }
    }

    @Test("a store reset behind a busy live stream is noticed from the numbers it repeats", arguments: FeedMode.allCases)
    func noticesResetFromLiveStream(mode: FeedMode) async throws {
        try await withPublisher { publisher, bus in
            let feed = makeFeed(bus: bus)
            let recorder = FeedRecorder()
            try await withFeed(feed, recorder: recorder, mode: mode) {
                try await waitUntilReplayed(bus)
                for _ in 1...3 { try await publisher.append() }
                try await recorder.waitUntilHandled(through: 3)
                // The publisher starts again from an empty store, as after its database was
                // deleted and it restarted (a new outbox, which reads the numbering afresh).
                try await publisher.writer.write { db in
                    try db.execute(sql: "DELETE FROM outbox")
                    try db.execute(sql: "DELETE FROM outboxFloor")
                }
                #expect(try await publisher.restarted().append() == 1)
                try await recorder.calls.wait { $0.last == .init(sequences: [1], through: 1) }
            }
            #expect(recorder.calls.value.suffix(2) == [.init(sequences: [], through: 0), .init(sequences: [1], through: 1)])
            #expect(feed.statistics.sequence == 1)
        }
    }

    @Test("events.after is retried until the publisher answers; nothing is skipped", arguments: FeedMode.allCases)
    func retriesReplay(mode: FeedMode) async throws {
        try await withPublisher(serving: false) { publisher, bus in
            for _ in 1...3 { try await publisher.append(live: false) }
            let feed = makeFeed(bus: bus)
            let recorder = FeedRecorder()
            try await withFeed(feed, recorder: recorder, mode: mode) {
                try await bus.requests.wait { $0.failed >= 3 }
                #expect(recorder.calls.value.isEmpty)
                try await publisher.serving {
                    try await recorder.waitUntilHandled(through: 3)
                }
            }
            #expect(recorder.delivered == [1, 2, 3])
        }
    }

    @Test("a batch whose handler throws is handed over again, and the cursor waits for it", arguments: FeedMode.allCases)
    func retriesHandler(mode: FeedMode) async throws {
        try await withPublisher { publisher, bus in
            for _ in 1...3 { try await publisher.append(live: false) }
            let feed = makeFeed(bus: bus)
            let recorder = FeedRecorder(failFirst: 2)
            try await withFeed(feed, recorder: recorder, mode: mode) {
                try await recorder.calls.wait { $0.count >= 3 }
                try await waitUntilReplayed(bus)
                try await publisher.append()
                try await recorder.waitUntilHandled(through: 4)
            }
            let batch = FeedRecorder.Batch(sequences: [1, 2, 3], through: 3)
            #expect(recorder.calls.value == [batch, batch, batch, .init(sequences: [4], through: 4)])
            #expect(feed.statistics.handled == 4)
            #expect(feed.statistics.sequence == 4)
        }
    }

    @Test("only the feed's topics are handed over, but the cursor moves past the others", arguments: FeedMode.allCases)
    func filtersTopics(mode: FeedMode) async throws {
        try await withPublisher { publisher, bus in
            try await publisher.append("auth.signedOut", live: false)
            try await publisher.append("auth.signedIn", live: false)
            try await publisher.append("auth.signedOut", live: false)
            let feed = makeFeed(bus: bus, topics: ["auth.signedIn"])
            let recorder = FeedRecorder()
            try await withFeed(feed, recorder: recorder, mode: mode) {
                try await recorder.waitUntilHandled(through: 3)
                try await waitUntilReplayed(bus)
                try await publisher.append("auth.signedOut")
                try await recorder.waitUntilHandled(through: 4)
                try await publisher.append("auth.signedIn")
                try await recorder.waitUntilHandled(through: 5)
            }
            #expect(
                recorder.calls.value == [
                    .init(sequences: [2], through: 3), .init(sequences: [], through: 4), .init(sequences: [5], through: 5),
                ])
            #expect(feed.statistics.handled == 2)
        }
    }

    @Test("many events in a burst arrive once each and in order", arguments: FeedMode.allCases)
    func burst(mode: FeedMode) async throws {
        try await withPublisher { publisher, bus in
            let feed = makeFeed(bus: bus, idleCheck: .milliseconds(50))
            let recorder = FeedRecorder()
            try await withFeed(feed, recorder: recorder, mode: mode) {
                try await waitUntilReplayed(bus)
                for index in 1...300 { try await publisher.append(live: index % 7 != 0) }
                try await recorder.waitUntilHandled(through: 300)
            }
            #expect(recorder.delivered == Array(1...300))
            #expect(feed.statistics.handled == 300)
        }
    }
}

@Suite("Event feed decisions")
struct FeedProgressTests {
    func event(_ sequence: UInt64, topic: String = "auth.signedIn") throws -> Message {
        let header = EnvelopeHeader(type: topic, source: "publisher", sequence: sequence)
        return try Message(topic: topic, body: Envelope(header: header, payload: Empty()).encoded())
    }

    func recorded(_ sequence: UInt64, topic: String = "auth.signedIn") throws -> RecordedEvent {
        RecordedEvent(sequence: sequence, topic: topic, envelope: String(decoding: try event(sequence, topic: topic).body, as: UTF8.self))
    }

    func progress(at cursor: UInt64, topics: [String] = [""]) -> FeedProgress {
        FeedProgress(topics: topics, statistics: FeedStatistics(publisher: "p", sequence: cursor))
    }

    @Test("live events: duplicates are counted and dropped, a gap stops the batch")
    func live() throws {
        var state = progress(at: 3)
        var pending = try [2, 3, 4, 5, 5, 7, 8].map { try event($0) }
        let step = state.planLive(&pending)
        #expect(step.batch.map(\.header.sequence) == [4, 5])
        #expect(step.through == 5)
        #expect(step.gap == 7)
        #expect(pending.map(\.header.sequence) == [7, 8], "held: the missing 6 may still arrive")
        #expect(state.statistics.duplicatesDropped == 3)
        #expect(state.cursor == 3, "the cursor moves only once the batch is handled")
        state.handled(step.batch.count, through: step.through, replayed: false)
        #expect(state.cursor == 5)
        #expect(state.statistics.handled == 2)
        #expect(state.statistics.replayed == 0)
    }

    @Test("events of two replicas in any interleaving are handed over once each, in order; a gap is only ever a number still on its way",
          arguments: 0..<200)
    func replicaInterleavings(seed: Int) throws {
        var random = FuzzRandom(seed: 0x5EED_F00D, case: seed)
        let count = random.int(1...40)
        // Each event is one replica's; each replica publishes its own in order.
        var replicas: [[UInt64]] = [[], []]
        for sequence in 1...UInt64(count) { replicas[random.int(0..<2)].append(sequence) }
        var arrivals: [UInt64] = []
        while !replicas[0].isEmpty || !replicas[1].isEmpty {
            let from = replicas[0].isEmpty ? 1 : replicas[1].isEmpty ? 0 : random.int(0..<2)
            arrivals.append(replicas[from].removeFirst())
        }
        var state = progress(at: 0)
        var pending: [Message] = []
        var delivered: [UInt64] = []
        var arrived = 0
        var rounds = 0
        while arrived < arrivals.count || !pending.isEmpty {
            rounds += 1
            try #require(rounds < 10_000, "the feed stopped taking what had all arrived")
            // The live queue is read in chunks of any size, as they happen to have arrived.
            let chunk = random.int(0...(arrivals.count - arrived))
            pending += try arrivals[arrived..<(arrived + chunk)].map { try event($0) }
            arrived += chunk
            let step = state.planLive(&pending)
            delivered += step.batch.map(\.header.sequence)
            state.handled(step.batch.count, through: step.through, replayed: false)
            if let gap = step.gap {
                let missing = (step.through + 1)..<gap
                #expect(missing.contains { !arrivals[..<arrived].contains($0) }, "a gap at \(gap) with nothing missing below it")
            }
        }
        #expect(delivered == Array(1...UInt64(count)))
        #expect(state.statistics.duplicatesDropped == 0)
    }

    @Test("a page: events after the cursor, caught up at the newest")
    func page() throws {
        var state = progress(at: 1, topics: ["auth.signedIn"])
        let page = EventPage(
            events: [try recorded(2), try recorded(3, topic: "auth.signedOut")], firstSequence: 1, lastSequence: 5)
        let step = state.planPage(page)
        #expect(step.batch.map(\.header.sequence) == [2])
        #expect(step.through == 3)
        #expect(!step.caughtUp)
        #expect(step.lost == 0)
        #expect(state.planPage(EventPage(events: [], firstSequence: 1, lastSequence: 1)).caughtUp)
    }

    @Test("a page after pruning: the missing events are lost")
    func pruned() throws {
        var state = progress(at: 2)
        let step = state.planPage(EventPage(events: [try recorded(6)], firstSequence: 6, lastSequence: 6))
        #expect(step.lost == 3)
        #expect(step.through == 6)
        #expect(step.caughtUp)
        #expect(state.statistics.lost == 3)
    }

    @Test("a page from a reset store: start again from 0")
    func reset() {
        var state = progress(at: 9)
        let step = state.planPage(EventPage(events: [], firstSequence: 1, lastSequence: 4))
        #expect(step.reset)
        #expect(step.through == 0)
        #expect(!step.caughtUp)
    }

    @Test("an unreadable recorded event is skipped and counted as lost")
    func unreadable() throws {
        var state = progress(at: 0)
        let page = EventPage(
            events: [RecordedEvent(sequence: 1, topic: "auth.signedIn", envelope: "{"), try recorded(2)],
            firstSequence: 1, lastSequence: 2)
        let step = state.planPage(page)
        #expect(step.unreadable == [1])
        #expect(step.batch.map(\.header.sequence) == [2])
        #expect(state.statistics.lost == 1)
    }

    @Test("backoff doubles up to its maximum")
    func backoff() {
        let backoff = RetryPolicy(initial: .milliseconds(100), maximum: .seconds(5))
        #expect((1...8).map { backoff.delay(attempt: $0) } == [
            .milliseconds(100), .milliseconds(200), .milliseconds(400), .milliseconds(800), .milliseconds(1600),
            .milliseconds(3200), .seconds(5), .seconds(5),
        ])
        #expect(backoff.delay(attempt: 1_000) == .seconds(5))
    }
}
