import AuthService
import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import ProfileService
import OnboardingSettings
@testable import ServiceRuntime
import Testing

@Suite("Outbox replay and retention", .timeLimit(.minutes(1)))
struct OutboxReplayTests {
    func withPublisher<Result: Sendable>(_ body: (OutboxPublisher) async throws -> Result) async throws -> Result {
        try await withTemporaryDirectory { directory in
            let publisher = try await OutboxPublisher.make(bus: InProcessBus(), directory: directory)
            defer { publisher.publisher.close() }
            return try await body(publisher)
        }
    }

    func page(_ publisher: OutboxPublisher, after sequence: UInt64, limit: Int? = nil) async throws -> EventPage {
        try await publisher.writer.read { db in try Outbox.events(after: sequence, limit: limit, in: db) }
    }

    /// Makes the events up to `sequence` look `hours` old.
    func age(_ publisher: OutboxPublisher, through sequence: UInt64, hours: Double, only: [UInt64]? = nil) async throws {
        let old = Timestamp.format(Date().addingTimeInterval(-hours * 3600))
        try await publisher.writer.write { db in
            if let only {
                for item in only {
                    try db.execute(sql: "UPDATE outbox SET createdAt = ? WHERE sequence = ?", arguments: [old, Int64(item)])
                }
            } else {
                try db.execute(sql: "UPDATE outbox SET createdAt = ? WHERE sequence <= ?", arguments: [old, Int64(sequence)])
            }
        }
    }

    // MARK: Numbering

    @Test("events of one transaction number on; a rolled-back one leaves no gap; all are published after commit, in order")
    func numbering() async throws {
        try await withPublisher { publisher in
            let bus = publisher.bus
            let (events, sink) = AsyncStream.makeStream(of: RawEvent.self)
            let subscription = try await bus.subscribe(to: [OutboxPublisher.events], topics: [""], limits: MessageLimits()) { batch in
                for event in batch { sink.yield(event) }
            }
            defer { subscription.close() }
            let first = try await publisher.writer.write { db in
                try (0..<3).map { _ in try publisher.outbox.append(SignedOut(uid: "a"), uid: "a", in: db) }
            }
            #expect(first == [1, 2, 3])
            struct Abandon: Error {}
            await #expect(throws: Abandon.self) {
                try await publisher.writer.write { db in
                    try publisher.outbox.append(SignedOut(uid: "b"), uid: "b", in: db)
                    throw Abandon()
                }
            }
            let next = try await publisher.writer.write { db in try publisher.outbox.append(SignedOut(uid: "c"), uid: "c", in: db) }
            #expect(next == 4)
            var received: [UInt64] = []
            for await event in events {
                received.append(try Message(topic: event.topic, body: event.body).header.sequence)
                if received.count == 4 { break }
            }
            #expect(received == [1, 2, 3, 4])
        }
    }

    @Test("an outbox counts on from its last commit; should another writer take its next number, it reads the numbering again")
    func numberingWithAnotherWriter() async throws {
        try await withPublisher { publisher in
            // Both outboxes write the same table: each has counted on from what it last saw.
            let (first, second) = (publisher.outbox, publisher.silentOutbox)
            var sequences: [UInt64] = []
            for outbox in [first, second, first, first, second, second, first] {
                sequences.append(try await publisher.writer.write { db in try outbox.append(SignedOut(uid: "a"), uid: "a", in: db) })
            }
            #expect(sequences == Array(1...7))
            let stored = try await page(publisher, after: 0)
            #expect(stored.events.map(\.sequence) == Array(1...7))
            #expect(stored.lastSequence == 7)
        }
    }

    @Test("an outbox of an earlier version keeps its events and numbering, pruned numbers included", arguments: [false, true])
    func migratesNumbering(everyEventPruned: Bool) async throws {
        try await withTemporaryDirectory { directory in
            let writer = try ServiceDatabase.open(path: "\(directory)/old.sqlite")
            // The first version's table: numbered with AUTOINCREMENT.
            var old = DatabaseMigrator()
            old.registerMigration("outbox-v1") { db in
                try db.execute(
                    sql: """
                        CREATE TABLE outbox (sequence INTEGER PRIMARY KEY AUTOINCREMENT, type TEXT NOT NULL, topic TEXT NOT NULL,
                          uid TEXT, envelope BLOB NOT NULL, createdAt TEXT NOT NULL)
                        """)
            }
            try old.migrate(writer)
            try await writer.write { db in
                for _ in 1...5 {
                    try db.execute(
                        sql: "INSERT INTO outbox (type, topic, uid, envelope, createdAt) VALUES ('t', 't', 'u', x'7b7d', '2026-01-01T00:00:00.000Z')")
                }
                // Pruned: the newest two, or every one.
                try db.execute(sql: everyEventPruned ? "DELETE FROM outbox" : "DELETE FROM outbox WHERE sequence <= 3")
            }
            var migrator = DatabaseMigrator()
            Outbox.registerMigration(in: &migrator)
            try migrator.migrate(writer)
            let page = try await writer.read { try Outbox.events(after: 0, in: $0) }
            #expect(page.events.map(\.sequence) == (everyEventPruned ? [] : [4, 5]))
            #expect(page.lastSequence == 5)
            let outbox = Outbox(source: "publisher", publisher: SilentPublisher(endpoint: OutboxPublisher.events))
            let next = try await writer.write { try outbox.append(SignedOut(uid: "u"), uid: "u", in: $0) }
            #expect(next == 6)
            let autoincrementRows = try await writer.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM sqlite_sequence") }
            #expect(autoincrementRows == 0, "no table numbers with AUTOINCREMENT any more")
        }
    }

    @Test("after every event is pruned, the numbering goes on above the last one")
    func numberingAfterEverythingPruned() async throws {
        try await withPublisher { publisher in
            for _ in 1...4 { try await publisher.append() }
            try await age(publisher, through: 4, hours: 48)
            #expect(try await Outbox.prune(Outbox.Retention(), in: publisher.writer) == 4)
            #expect(try await page(publisher, after: 0) == EventPage(events: [], firstSequence: 0, lastSequence: 4))
            // A new outbox (a restarted service) reads the numbering from the store.
            #expect(try await publisher.restarted().append() == 5)
        }
    }

    // MARK: Pages

    @Test("pages come oldest first, respect the limit and name the bounds")
    func pages() async throws {
        try await withPublisher { publisher in
            for index in 1...7 { try await publisher.append(index.isMultiple(of: 2) ? SignedIn.type : SignedOut.type) }
            let first = try await page(publisher, after: 0, limit: 3)
            #expect(first.events.map(\.sequence) == [1, 2, 3])
            #expect(first.firstSequence == 1)
            #expect(first.lastSequence == 7)
            #expect(first.events.map(\.topic) == [SignedOut.type, SignedIn.type, SignedOut.type])
            #expect(try await page(publisher, after: 3, limit: 3).events.map(\.sequence) == [4, 5, 6])
            #expect(try await page(publisher, after: 6).events.map(\.sequence) == [7])
            #expect(try await page(publisher, after: 7).events.isEmpty)
            #expect(try await page(publisher, after: 70).events.isEmpty)

            // The envelope is the JSON that was published, with the event's own sequence.
            let message = try Message(topic: first.events[1].topic, body: Data(first.events[1].envelope.utf8))
            #expect(message.header.sequence == 2)
            #expect(message.header.type == SignedOut.type)
            #expect(message.header.source == "publisher")
        }
    }

    @Test("a limit below 1 is refused; one above the maximum is cut down; none gives 500")
    func limits() async throws {
        try await withPublisher { publisher in
            try await publisher.writer.write { db in
                for _ in 0..<1_005 { try publisher.silentOutbox.append(SignedOut(uid: "u"), uid: "u", in: db) }
            }
            for limit in [0, -1] {
                let error = await refusal { _ = try await page(publisher, after: 0, limit: limit) }
                #expect(error?.code == .invalidRequest)
                #expect(error?.message.contains("limit") == true)
            }
            #expect(try await page(publisher, after: 0, limit: 5_000).events.count == EventsAfter.maximumLimit)
            let defaultPage = try await page(publisher, after: 0)
            #expect(defaultPage.events.count == Outbox.defaultPageSize)
            #expect(defaultPage.events.map(\.sequence) == Array(1...500))
        }
    }

    @Test("an empty outbox has no bounds")
    func emptyOutbox() async throws {
        try await withPublisher { publisher in
            let empty = try await page(publisher, after: 0)
            #expect(empty == EventPage(events: [], firstSequence: 0, lastSequence: 0))
        }
    }

    // MARK: Retention

    @Test("events older than the window go; the newest sequence stays and keeps growing")
    func pruneByAge() async throws {
        try await withPublisher { publisher in
            for _ in 1...10 { try await publisher.append(live: false) }
            try await age(publisher, through: 4, hours: 25)
            let deleted = try await Outbox.prune(Outbox.Retention(), chunkSize: 3, in: publisher.writer)
            #expect(deleted == 4)
            let after = try await page(publisher, after: 0)
            #expect(after.firstSequence == 5)
            #expect(after.lastSequence == 10)
            #expect(after.events.map(\.sequence) == Array(5...10))

            // Everything old: all go, and the numbering carries on.
            try await age(publisher, through: 10, hours: 2)
            #expect(try await Outbox.prune(Outbox.Retention(maxAge: .seconds(3600)), chunkSize: 4, in: publisher.writer) == 6)
            #expect(try await page(publisher, after: 0) == EventPage(events: [], firstSequence: 0, lastSequence: 10))
            #expect(try await publisher.append(live: false) == 11)
        }
    }

    @Test("pruning keeps one unbroken run: a young event among old ones stops it")
    func prunePrefixOnly() async throws {
        try await withPublisher { publisher in
            for _ in 1...5 { try await publisher.append(live: false) }
            try await age(publisher, through: 0, hours: 48, only: [1, 2, 4])
            #expect(try await Outbox.prune(Outbox.Retention(), in: publisher.writer) == 2)
            #expect(try await page(publisher, after: 0).events.map(\.sequence) == [3, 4, 5])
        }
    }

    @Test("beyond the newest maxEvents, the oldest go, a chunk at a time")
    func pruneByCount() async throws {
        try await withPublisher { publisher in
            for _ in 1...25 { try await publisher.append(live: false) }
            #expect(try await Outbox.prune(Outbox.Retention(maxEvents: 3), chunkSize: 4, in: publisher.writer) == 22)
            let after = try await page(publisher, after: 0)
            #expect(after.events.map(\.sequence) == [23, 24, 25])
            #expect(after.firstSequence == 23)
            #expect(try await Outbox.prune(Outbox.Retention(maxEvents: 3), in: publisher.writer) == 0)
        }
    }

    @Test("the prune bound: the older of the two limits wins, within one chunk")
    func pruneBound() {
        let retention = Outbox.Retention(maxEvents: 10)
        // Nothing too old, nothing beyond the count.
        #expect(retention.pruneBound(oldest: 1, newest: 10, chunkEnd: 100, firstYoung: 1) == nil)
        // Beyond the count: 1...5 go.
        #expect(retention.pruneBound(oldest: 1, newest: 15, chunkEnd: 100, firstYoung: 1) == 5)
        // Too old up to 7.
        #expect(retention.pruneBound(oldest: 1, newest: 15, chunkEnd: 100, firstYoung: 8) == 7)
        // Everything in the chunk is too old: the chunk goes.
        #expect(retention.pruneBound(oldest: 1, newest: 500, chunkEnd: 100, firstYoung: nil) == 100)
        #expect(Outbox.Retention(maxEvents: -4).pruneBound(oldest: 3, newest: 9, chunkEnd: 20, firstYoung: 3) == 9)
    }

    @Test("the retention setting: hours from the flag, range-checked")
    func retentionOption() throws {
        #expect(try Outbox.Retention(Settings(flags: [.eventRetentionHours: "2"], environment: [:])).maxAge == .seconds(7200))
        #expect(throws: SettingError.self) { try Outbox.Retention(Settings(flags: [.eventRetentionHours: "0"], environment: [:])) }
        #expect(try Outbox.Retention(Settings(environment: [:])).maxAge == .seconds(24 * 3600))
        #expect(Outbox.Retention().maxAge == .seconds(24 * 3600))
    }

    @Test("the service prunes in the background, once at start")
    func prunesAtStart() async throws {
        try await withPublisher { publisher in
            for _ in 1...5 { try await publisher.append(live: false) }
            let logs = Observed<[String]>([])
            let logger = Logger(label: "test") { _ in ObservedLogHandler(lines: logs) }
            _ = try await withEventRetention(Outbox.Retention(maxEvents: 1), database: publisher.writer, every: .seconds(3600), logger: logger) {
                try await logs.wait { $0.contains { $0.contains("pruned 4 events") } }
            }
            #expect(try await page(publisher, after: 0).events.map(\.sequence) == [5])
        }
    }

    // MARK: The services

    @Test("auth answers events.after with its events, to the service token only")
    func authServesEvents() async throws {
        let bus = InProcessBus()
        let configuration = AuthService.Configuration(
            rpc: "inproc://auth", events: "inproc://auth-events", devMode: true, serviceToken: "secret")
        let auth = try AuthService(configuration: configuration, bus: bus, logger: quietLogger)
        try await withRunningService(auth, on: bus, answeringAt: configuration.rpc) {
            let signedIn = try await bus.call(SignIn(provider: .google, subject: "ann"), to: configuration.rpc, source: "test")
            _ = try await bus.call(SignOut(), to: configuration.rpc, source: "test", sessionToken: signedIn.sessionToken)
            for token in [nil, "wrong"] {
                let error = await refusal {
                    _ = try await bus.call(EventsAfter(sequence: 0), to: configuration.rpc, source: "test", serviceToken: token)
                }
                #expect(error?.code == .unauthenticated)
            }
            let page = try await bus.call(EventsAfter(sequence: 0), to: configuration.rpc, source: "test", serviceToken: "secret")
            #expect(page.events.map(\.sequence) == [1, 2])
            #expect(page.events.map(\.topic) == [SignedIn.type, SignedOut.type])
            #expect(page.lastSequence == 2)
            let error = await refusal {
                _ = try await bus.call(EventsAfter(sequence: 0, limit: 0), to: configuration.rpc, source: "test", serviceToken: "secret")
            }
            #expect(error?.code == .invalidRequest)
        }
    }

    @Test("profile answers events.after with its events, to the service token only")
    func profileServesEvents() async throws {
        let bus = InProcessBus()
        let configuration = ProfileService.Configuration(
            rpc: "inproc://profile", events: "inproc://profile-events", authRPC: "inproc://auth", serviceToken: "secret")
        let profile = try ProfileService(configuration: configuration, bus: bus, logger: quietLogger, sessions: StubSessions())
        try await withRunningService(profile, on: bus, answeringAt: configuration.rpc) {
            let uid = UUID().uuidString.lowercased()
            _ = try await bus.call(
                CreateProfile(username: "minji"), to: configuration.rpc, source: "test", uid: uid, serviceToken: "secret")
            let error = await refusal {
                _ = try await bus.call(EventsAfter(sequence: 0), to: configuration.rpc, source: "test", sessionToken: "token-\(uid)")
            }
            #expect(error?.code == .unauthenticated)
            let page = try await bus.call(
                EventsAfter(sequence: 0, limit: 10), to: configuration.rpc, source: "test", serviceToken: "secret")
            #expect(page.events.map(\.topic) == [ProfileCreated.type])
            let event = try #require(page.events.first)
            let message = try Message(topic: event.topic, body: Data(event.envelope.utf8))
            #expect(try message.payload(as: ProfileCreated.self).profile.username == "minji")
        }
    }

    @Test("a feed follows auth end to end: sign-ins before and after it started")
    func feedFollowsAuth() async throws {
        let bus = InProcessBus()
        let configuration = AuthService.Configuration(
            rpc: "inproc://auth", events: "inproc://auth-events", devMode: true, serviceToken: "secret")
        let auth = try AuthService(configuration: configuration, bus: bus, logger: quietLogger)
        try await withRunningService(auth, on: bus, answeringAt: configuration.rpc) {
            _ = try await bus.call(SignIn(provider: .kakao, subject: "early"), to: configuration.rpc, source: "test")
            let feed = EventFeed(
                bus: bus, events: configuration.events, replay: configuration.rpc, topics: ["auth."], source: "test",
                serviceToken: "secret", logger: quietLogger)
            let recorder = FeedRecorder()
            try await withFeed(feed, recorder: recorder) {
                try await recorder.waitUntilHandled(through: 1)
                _ = try await bus.call(SignIn(provider: .kakao, subject: "late"), to: configuration.rpc, source: "test")
                try await recorder.waitUntilHandled(through: 2)
            }
            #expect(recorder.delivered == [1, 2])
        }
    }
}

/// Sends every log line to an ``Observed`` list.
struct ObservedLogHandler: LogHandler {
    let lines: Observed<[String]>
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        lines.update { $0.append("\(event.message)") }
    }
}
