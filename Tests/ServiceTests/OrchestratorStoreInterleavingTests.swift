import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import PropertyBased
import ServiceRuntime
import Testing

@testable import OnboardingOrchestrator
@testable import OrchestratorPostgres
import PostgresNIO
import TestSupport

/// The orchestrator's commit over random inputs for a few people, cut into transactions at
/// random: a person's row (written once per transaction) must always name the intent last put in
/// the route outbox for them, with that row's route sequence; and a "check me now" that carries
/// its profile answer (asked ahead) does not ask profile again.
@Suite("The orchestrator's store over random batches")
struct OrchestratorStoreInterleavingTests {
    static let people = ["p0", "p1", "p2"]
    /// Step kinds: 0 sign in, 1 sign out, 2 profile created, 3 profile deleted, 4 withdrawn,
    /// 5 "check me now" with the profile answer asked ahead, 6 commit what is batched; the rest
    /// of the code picks the person.
    static let kinds = 7
    static let steps = Gen.int(in: 0...(kinds * people.count - 1)).array(of: 1...80)

    @Test(
        "a person's row names the intent last put in the route outbox for them, with its sequence; an answer asked ahead is used",
        arguments: StoreKind.available)
    func rowMatchesRouteOutbox(kind: StoreKind) async throws {
        // Each case a fresh store; fewer on PostgreSQL, where each is a schema.
        try await withOrchestratorDatabase(kind) { database async throws in
            await propertyCheck(count: kind == .sqlite ? 150 : 40, input: Self.steps) { steps in
                // An error becomes a problem: the property library's report of a thrown error
                // does not say what it was.
                let problems: [String]
                do { problems = try await Self.run(steps, on: database) } catch { problems = ["threw \(error)"] }
                #expect(problems.isEmpty, "\(problems) after steps \(steps)")
            }
        }
    }

    @Test("after a failed commit the machine starts again from the store, people it was tracking included", arguments: StoreKind.available)
    func restartKeepsTrackedPeople(kind: StoreKind) async throws {
        try await withOrchestratorDatabase(kind) { database async throws in
            let bus = InProcessBus()
            let publisher = try await bus.publisher(at: Endpoint("inproc://routes"))
            defer { publisher.close() }
            let logger = Logger(label: "restart") { _ in SwiftLogNoOpLogHandler() }
            let context = OrchestratorStorageContext(publisher: publisher, retention: Outbox.Retention(), logger: logger)
            try await database.withStorage(context) { storage in
                let (_, work) = AsyncStream.makeStream(of: Work.self)
                let engine = try Engine(
                    configuration: OnboardingOrchestrator.Configuration(), bus: bus, storage: storage, logger: logger, work: work)
                func commit(_ input: OnboardingStateMachine.Input) async throws {
                    let batch = [Engine.Submission(inputs: [input])]
                    switch engine.commits {
                    case .onLoop(let sqlite): _ = try engine.decide(batch, in: sqlite)
                    case .buffered(let store): _ = try await engine.decide(batch, in: store)
                    }
                }
                try await commit(.signedIn(uid: "u1", isNewAccount: true, sessions: 1))
                let first = try #require(try await storage.routeState(of: "u1").intent)
                #expect(first.intent == .presentProfileSetup)
                // As after a failed commit: the next one starts the machine again from the store.
                engine.stale.store(true, ordering: .releasing)
                try await commit(.signedIn(uid: "u1", isNewAccount: false, sessions: 2))
                let state = try await storage.routeState(of: "u1")
                #expect(state.intent == first, "the intent in force stays the one decided, repeated for the new session")
                #expect(engine.machine.withLock { $0.isTracking("u1") })
            }
        }
    }

    /// Runs `steps` on a fresh store of `database` (on PostgreSQL, the schema is emptied first).
    static func run(_ steps: [Int], on database: any OrchestratorDatabase) async throws -> [String] {
        let bus = InProcessBus()
        let publisher = try await bus.publisher(at: Endpoint("inproc://routes"))
        defer { publisher.close() }
        let logger = Logger(label: "store-interleaving") { _ in SwiftLogNoOpLogHandler() }
        let context = OrchestratorStorageContext(publisher: publisher, retention: Outbox.Retention(), logger: logger)
        return try await database.withStorage(context) { storage in
            try await emptied(storage)
            let (_, work) = AsyncStream.makeStream(of: Work.self)
            let engine = try Engine(
                configuration: OnboardingOrchestrator.Configuration(), bus: bus, storage: storage, logger: logger, work: work)
            return try await run(steps, engine: engine)
        }
    }

    static func run(_ steps: [Int], engine: Engine) async throws -> [String] {

        var sessions: [String: Int] = [:]
        var withdrawn: Set<String> = []
        var profileSequence: UInt64 = 0
        var hasProfile: Set<String> = []
        var waiter: OnboardingStateMachine.WaiterID = 0
        var batch: [Engine.Submission] = []
        var problems: [String] = []

        func commit() async throws {
            guard !batch.isEmpty else { return }
            let submissions = batch
            batch = []
            let actions: [OnboardingStateMachine.Action]
            switch engine.commits {
            case .onLoop(let sqlite): actions = try engine.decide(submissions, in: sqlite)
            case .buffered(let store): actions = try await engine.decide(submissions, in: store)
            }
            // People whose only inputs in this transaction are checks that carry their answer
            // (another input, a returning sign-in say, may start a check of its own).
            let others = Set(submissions.filter(\.profiles.isEmpty).flatMap { $0.inputs.map(\.uid) })
            let answeredAhead = Set(submissions.flatMap(\.profiles.keys)).subtracting(others)
            for case .checkProfile(let uid, _) in actions where answeredAhead.contains(uid) {
                problems.append("\(uid): profile asked again although its answer came with the check")
            }
            problems += try await Self.check(engine.storage)
        }

        for code in steps {
            let uid = people[(code / kinds) % people.count]
            let input: OnboardingStateMachine.Input
            switch code % kinds {
            case 0:
                guard !withdrawn.contains(uid) else { continue }
                let isNew = sessions[uid] == nil
                sessions[uid, default: 0] += 1
                input = .signedIn(uid: uid, isNewAccount: isNew, sessions: sessions[uid])
            case 1:
                guard let count = sessions[uid], count > 0, !withdrawn.contains(uid) else { continue }
                sessions[uid] = count - 1
                input = .signedOut(uid: uid, sessions: count - 1)
            case 2:
                profileSequence += 1
                hasProfile.insert(uid)
                input = .profileCreated(uid: uid, asOf: profileSequence)
            case 3:
                profileSequence += 1
                hasProfile.remove(uid)
                input = .profileDeleted(uid: uid, reason: .request, asOf: profileSequence)
            case 4:
                guard sessions[uid] != nil, withdrawn.insert(uid).inserted else { continue }
                input = .withdrawn(uid: uid)
            case 5:
                guard !withdrawn.contains(uid) else { continue }
                waiter += 1
                let profile = hasProfile.contains(uid)
                    ? Profile(uid: uid, username: "name", imagePath: nil, createdAt: "t", updatedAt: "t") : nil
                var submission = Engine.Submission(inputs: [.checkRequested(uid: uid, waiter: waiter)])
                submission.profiles[uid] = ProfileResult(profile: profile, asOfSequence: profileSequence)
                batch.append(submission)
                continue
            default:
                try await commit()
                continue
            }
            batch.append(Engine.Submission(inputs: [input]))
        }
        try await commit()
        return problems
    }

    /// What is wrong between the person rows and the route outbox, read as clients read them
    /// (`onboarding.routes` and `events.after`), so the same on every store.
    static func check(_ storage: any OrchestratorStorage) async throws -> [String] {
        var problems: [String] = []
        var last: [String: (sequence: UInt64, intent: RouteIntent)] = [:]
        for event in try await storage.events(after: 0, limit: nil).events {
            let envelope = try WireFormat.decoder().decode(Envelope<RouteIntent>.self, from: Data(event.envelope.utf8))
            last[envelope.payload.uid] = (event.sequence, envelope.payload)
        }
        for state in try await storage.routeStates(after: nil, limit: 1_000).states {
            guard let intent = state.intent else { continue }
            guard let recorded = last[state.uid] else {
                problems.append("\(state.uid): intent \(intent.intentId) in force, none in the route outbox")
                continue
            }
            if recorded.intent.intentId != intent.intentId || recorded.intent.intent != intent.intent {
                problems.append("\(state.uid): row says \(intent.intentId), the outbox's last is \(recorded.intent.intentId)")
            }
            if state.sequence != recorded.sequence {
                problems.append("\(state.uid): row's route sequence \(String(describing: state.sequence)), the outbox's \(recorded.sequence)")
            }
        }
        return problems
    }

    /// Empties `storage` between cases that share a PostgreSQL schema (SQLite's is new each time).
    static func emptied(_ storage: any OrchestratorStorage) async throws {
        guard let postgres = storage as? OrchestratorPostgresStore else { return }
        try await postgres.store.transaction { connection in
            for table in ["person", "cursor", "outbox"] {
                try await connection.query(PostgresQuery(unsafeSQL: "DELETE FROM \(table)"), logger: postgres.logger)
            }
            try await connection.query("UPDATE outbox_head SET sequence = 0", logger: postgres.logger)
        }
    }
}

/// Runs `body` with the orchestrator's database of `kind`: SQLite in memory, or a fresh
/// PostgreSQL schema.
func withOrchestratorDatabase<Result: Sendable>(
    _ kind: StoreKind, _ body: (any OrchestratorDatabase) async throws -> Result
) async throws -> Result {
    switch kind {
    case .sqlite:
        return try await body(SQLiteOrchestratorDatabase(path: nil))
    case .postgres:
        return try await TestPostgres.withSchema { location in
            try await body(
                OrchestratorPostgresDatabase(location: location, maxConnections: 4, timeout: .seconds(15), leaseCheck: .milliseconds(50)))
        }
    }
}
