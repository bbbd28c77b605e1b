import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import PropertyBased
import ServiceRuntime
import Testing

@testable import OnboardingOrchestrator

/// The engine reads nobody's row whose uid is above the largest stored as of its last commit
/// (a new account's sign-in, on the hot path). Someone with a row must never be taken for new:
/// not after the machine has forgotten them, and not after another connection stored them.
@Suite("The orchestrator skips the look-up only for people above every stored uid")
struct OrchestratorLargestUIDTests {
    /// Two engines on one database file through two connections (as two processes would be),
    /// and helpers to commit an input and read a person's intent in force.
    struct Fixture {
        let database: any DatabaseWriter
        let here: (engine: Engine, storage: SQLiteOrchestratorStorage)
        let elsewhere: (engine: Engine, storage: SQLiteOrchestratorStorage)

        init(path: String, publisher: any EventPublisher, bus: InProcessBus) throws {
            var logger = Logger(label: "largest-uid")
            logger.logLevel = .critical
            func engine(_ database: any DatabaseWriter) throws -> (Engine, SQLiteOrchestratorStorage) {
                let (_, work) = AsyncStream.makeStream(of: Work.self)
                let storage = SQLiteOrchestratorStorage(
                    database: database, outbox: Outbox(source: ServiceName.orchestrator, publisher: publisher), logger: logger)
                return (
                    try Engine(configuration: OnboardingOrchestrator.Configuration(), bus: bus, storage: storage, logger: logger, work: work),
                    storage
                )
            }
            database = try OrchestratorStore.openDatabase(path: path)
            here = try engine(database)
            elsewhere = try engine(try DatabaseQueue(path: path))
        }

        func commit(_ input: OnboardingStateMachine.Input, by engine: (engine: Engine, storage: SQLiteOrchestratorStorage)) throws {
            _ = try engine.engine.decide([Engine.Submission(inputs: [input])], in: engine.storage)
        }

        func intent(of uid: String) throws -> RouteIntent.Kind? {
            try database.read { try OrchestratorStore.routeState(of: uid, in: $0) }.intent?.intent
        }
    }

    static func withFixture(_ body: (Fixture) async throws -> Void) async throws {
        try await withTemporaryDirectory { directory in
            let bus = InProcessBus()
            let publisher = try await bus.publisher(at: Endpoint("inproc://largest-uid"))
            defer { publisher.close() }
            try await body(try Fixture(path: "\(directory)/orchestrator.sqlite", publisher: publisher, bus: bus))
        }
    }

    @Test("a sign-in marked new of someone with a stored profile is not asked to set one up, whoever stored it")
    func storedPeopleAreRead() async throws {
        try await Self.withFixture { fixture in
            let (here, elsewhere) = (fixture.here, fixture.elsewhere)
            try fixture.commit(.signedIn(uid: "m-new", isNewAccount: true, sessions: 1), by: here)
            #expect(try fixture.intent(of: "m-new") == .presentProfileSetup)
            // Stored here, then forgotten by the machine (as when it is over capacity).
            try fixture.commit(.profileCreated(uid: "n-profiled", asOf: 1), by: here)
            here.engine.machine.withLock { $0.reset() }
            try fixture.commit(.signedIn(uid: "n-profiled", isNewAccount: true, sessions: 1), by: here)
            #expect(try fixture.intent(of: "n-profiled") != .presentProfileSetup)
            // Stored by another connection, above everything this engine has stored.
            try fixture.commit(.profileCreated(uid: "z-profiled", asOf: 2), by: elsewhere)
            try fixture.commit(.signedIn(uid: "z-profiled", isNewAccount: true, sessions: 1), by: here)
            #expect(try fixture.intent(of: "z-profiled") != .presentProfileSetup)
            try fixture.commit(.signedIn(uid: "zz-new", isNewAccount: true, sessions: 1), by: here)
            #expect(try fixture.intent(of: "zz-new") == .presentProfileSetup)
        }
    }

    /// Step kinds, each for one of five people: 0 this engine stores their profile, 1 the other
    /// connection's engine does (and this engine's machine forgets everyone: a person it holds in
    /// memory is newer than the store, so only someone it does not hold is read), 2 this engine's
    /// machine forgets everyone, 3 they sign in (marked new) through this engine.
    static let steps = Gen.int(in: 0...19).array(of: 1...40)

    @Test("whatever the order of profiles stored here or elsewhere, forgetting and sign-ins: nobody with a profile is asked to set one up")
    func anyOrder() async throws {
        await propertyCheck(count: 60, input: Self.steps) { steps in
            try await Self.withFixture { fixture in
                var profiled: Set<String> = []
                var asOf: UInt64 = 0
                for code in steps {
                    let uid = "p\(code % 5)"
                    switch code / 5 {
                    case 0:
                        asOf += 1
                        try fixture.commit(.profileCreated(uid: uid, asOf: asOf), by: fixture.here)
                        profiled.insert(uid)
                    case 1:
                        asOf += 1
                        try fixture.commit(.profileCreated(uid: uid, asOf: asOf), by: fixture.elsewhere)
                        profiled.insert(uid)
                        fixture.here.engine.machine.withLock { $0.reset() }
                    case 2:
                        fixture.here.engine.machine.withLock { $0.reset() }
                    default:
                        try fixture.commit(.signedIn(uid: uid, isNewAccount: true, sessions: 1), by: fixture.here)
                        if profiled.contains(uid) {
                            #expect(try fixture.intent(of: uid) != .presentProfileSetup, "\(uid) after steps \(steps)")
                        }
                    }
                }
            }
        }
    }
}
