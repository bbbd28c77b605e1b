import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime
import Testing

@testable import OnboardingOrchestrator

/// The engine reads nobody's row whose uid is above the largest stored as of its last commit
/// (a new account's sign-in, on the hot path). Someone with a row must never be taken for new:
/// not after the machine has forgotten them, and not after another connection stored them.
@Suite("The orchestrator skips the look-up only for people above every stored uid")
struct OrchestratorLargestUIDTests {
    @Test("a sign-in marked new of someone with a stored profile is not asked to set one up, whoever stored it")
    func storedPeopleAreRead() async throws {
        try await withTemporaryDirectory { directory in
            let path = "\(directory)/orchestrator.sqlite"
            let bus = InProcessBus()
            let publisher = try await bus.publisher(at: Endpoint("inproc://largest-uid"))
            defer { publisher.close() }
            func engine(_ database: any DatabaseWriter) -> Engine {
                var logger = Logger(label: "largest-uid")
                logger.logLevel = .critical
                let (_, work) = AsyncStream.makeStream(of: Work.self)
                return Engine(
                    configuration: OnboardingOrchestrator.Configuration(), bus: bus, database: database,
                    outbox: Outbox(source: ServiceName.orchestrator, publisher: publisher), logger: logger, work: work)
            }
            let database = try OrchestratorStore.openDatabase(path: path)
            let here = engine(database)
            let elsewhere = engine(try DatabaseQueue(path: path))
            func commit(_ input: OnboardingStateMachine.Input, by engine: Engine) throws {
                try engine.database.writeTransaction { db in
                    _ = try engine.machine.withLock { machine in
                        try engine.apply([Engine.Submission(inputs: [input])], to: &machine, in: db)
                    }
                }
            }
            func intent(of uid: String) throws -> RouteIntent.Kind? {
                try database.read { try OrchestratorStore.routeState(of: uid, in: $0) }.intent?.intent
            }

            try commit(.signedIn(uid: "m-new", isNewAccount: true, sessions: 1), by: here)
            #expect(try intent(of: "m-new") == .presentProfileSetup)
            // Stored here, then forgotten by the machine (as when it is over capacity).
            try commit(.profileCreated(uid: "n-profiled", asOf: 1), by: here)
            here.machine.withLock { $0.reset() }
            try commit(.signedIn(uid: "n-profiled", isNewAccount: true, sessions: 1), by: here)
            #expect(try intent(of: "n-profiled") != .presentProfileSetup)
            // Stored by another connection, above everything this engine has stored.
            try commit(.profileCreated(uid: "z-profiled", asOf: 2), by: elsewhere)
            try commit(.signedIn(uid: "z-profiled", isNewAccount: true, sessions: 1), by: here)
            #expect(try intent(of: "z-profiled") != .presentProfileSetup)
            try commit(.signedIn(uid: "zz-new", isNewAccount: true, sessions: 1), by: here)
            #expect(try intent(of: "zz-new") == .presentProfileSetup)
        }
    }
}
