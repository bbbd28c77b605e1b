import AuthPostgres
import AuthService
import Foundation
import ImageUploadService
import Logging
import Messaging
import OnboardingAPI
import OnboardingOrchestrator
import OnboardingTesting
import OrchestratorPostgres
import ProfilePostgres
import ProfileService
import ServiceLifecycle
import ServiceRuntime
import Testing
import TestSupport

@Suite("The whole system in one process")
struct InProcessSystemTests {
    // Waits for readiness are long: on a 2-core machine loaded by the other tests (and other
    // builds), the services have taken over 10 s to start.
    @Test("the orchestrator stops promptly on graceful shutdown while its checks keep failing")
    func shutdownWhileChecksFail() async throws {
        let bus = InProcessBus()
        let e = SystemEndpoints.inProcess
        var logger = Logger(label: "shutdown-test")
        logger.logLevel = .critical
        let auth = try AuthService(configuration: .init(rpc: e.authRPC, events: e.authEvents, databasePath: nil, devMode: true), bus: bus, logger: logger)
        let orchestrator = try OnboardingOrchestrator(
            configuration: .init(
                rpc: e.orchestratorRPC, routes: e.routes, authRPC: e.authRPC, authEvents: e.authEvents,
                profileRPC: e.profileRPC, profileEvents: e.profileEvents, imageRPC: e.imageRPC,
                callTimeout: .milliseconds(100), retryPolicy: RetryPolicy(initial: .seconds(30), maximum: .seconds(30))),
            bus: bus, logger: logger)
        let group = ServiceGroup(services: [auth, orchestrator], logger: logger)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            try await bus.waitUntilAnswering(e.orchestratorRPC, source: "test", timeout: .seconds(30))
            // The orchestrator answers within its 100 ms call timeout; the client's own is for a loaded machine.
            let client = e.client(bus, timeout: .seconds(30))
            _ = try await client.signIn(provider: .google, subject: "stopping")
            await expectCode(.dependencyUnavailable) { _ = try await client.checkNow() }
            // A retry now waits 30 s; shutting down must not wait for it.
            let clock = ContinuousClock()
            let started = clock.now
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
            #expect(clock.now - started < .seconds(10))
        }
    }

    @Test("sign in, set up a profile, sign out, sign in again, withdraw", arguments: StoreKind.available)
    func journey(kind: StoreKind) async throws {
        try await InProcessSystem.run(on: kind) { system in
            try await runJourney(bus: system.bus, endpoints: system.endpoints, imagesRoot: system.imagesDirectory)
        }
    }

    @Test("two of every service on PostgreSQL: the journey works, every replica answers, one orchestrator decides",
          arguments: StoreKind.available.filter { $0 == .postgres })
    func replicas(kind: StoreKind) async throws {
        var configuration = InProcessSystem.Configuration()
        configuration.replicas = 2
        try await InProcessSystem.run(on: kind, configuration) { system in
            let e = system.endpoints
            #expect(e.authRPC.replicas == ["inproc://auth", "inproc://auth-2"])
            try await runJourney(bus: system.bus, endpoints: e, imagesRoot: system.imagesDirectory)
            for replica in e.authRPC.replicas + e.profileRPC.replicas + e.imageRPC.replicas {
                _ = try await system.bus.call(HealthCheck(), to: replica, source: "test", timeout: .seconds(10))
            }
            // The standby binds no request endpoint: only the leader answers.
            var answering = 0
            for replica in e.orchestratorRPC.replicas {
                do {
                    _ = try await system.bus.call(HealthCheck(), to: replica, source: "test", timeout: .seconds(10))
                    answering += 1
                } catch let error as ServiceError where error.code == .noResponder {}
            }
            #expect(answering == 1)
        }
    }

    @Test("replicas on SQLite files are refused: they would each keep their own")
    func replicasNeedSharedStores() async throws {
        var configuration = InProcessSystem.Configuration()
        configuration.replicas = 2
        let error = await #expect(throws: ServiceError.self) { try await InProcessSystem.start(configuration) }
        #expect(error?.message.contains("profileDatabase") == true)
    }

    @Test("bad input at every endpoint gets a typed error and no service goes down", arguments: StoreKind.available)
    func badInput(kind: StoreKind) async throws {
        try await InProcessSystem.run(on: kind) { system in
            try await runBadInput(bus: system.bus, endpoints: system.endpoints, serviceToken: system.serviceToken)
        }
    }

    @Test("two people claiming one free name at once: exactly one gets it", arguments: StoreKind.available)
    func simultaneousClaims(kind: StoreKind) async throws {
        try await InProcessSystem.run(on: kind) { system in
            let name = "race\(Int.random(in: 100...999))"
            let people = (0..<8).map { system.endpoints.client(system.bus, name: "racer-\($0)") }
            for (index, person) in people.enumerated() {
                _ = try await person.signIn(provider: .apple, subject: "racer-\(index)-\(UUID().uuidString)")
            }
            let outcomes = await withTaskGroup(of: ErrorCode?.self) { group in
                for person in people {
                    group.addTask {
                        do {
                            _ = try await person.setUpProfile(username: name)
                            return nil
                        } catch let error as ServiceError {
                            return error.code
                        } catch {
                            return .internalError
                        }
                    }
                }
                return await group.reduce(into: [ErrorCode?]()) { $0.append($1) }
            }
            #expect(outcomes.filter { $0 == nil }.count == 1)
            #expect(outcomes.compactMap { $0 }.allSatisfy { $0 == .usernameTaken })
        }
    }

    @Test("a profile check that fails is retried until the profile side answers, never decided on a guess")
    func checkRetriedUntilProfileAnswers() async throws {
        // Only auth and the orchestrator run at first: the profile side is down.
        let bus = InProcessBus()
        let e = SystemEndpoints.inProcess
        var logger = Logger(label: "retry-test")
        logger.logLevel = .critical
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("onboarding-\(UUID().uuidString)")
        let auth = try AuthService(configuration: .init(rpc: e.authRPC, events: e.authEvents, databasePath: nil, devMode: true), bus: bus, logger: logger)
        let orchestrator = try OnboardingOrchestrator(
            configuration: .init(
                rpc: e.orchestratorRPC, routes: e.routes, authRPC: e.authRPC, authEvents: e.authEvents,
                profileRPC: e.profileRPC, profileEvents: e.profileEvents, imageRPC: e.imageRPC,
                callTimeout: .milliseconds(200), retryPolicy: RetryPolicy(initial: .milliseconds(20), maximum: .milliseconds(100))),
            bus: bus, logger: logger)
        let profile = try ProfileService(
            configuration: .init(rpc: e.profileRPC, events: e.profileEvents, authRPC: e.authRPC, databasePath: nil),
            bus: bus, logger: logger)
        let first = ServiceGroup(services: [auth, orchestrator], logger: logger)
        let second = ServiceGroup(services: [profile], logger: logger)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await first.run() }
            try await bus.waitUntilAnswering(e.authRPC, source: "test", timeout: .seconds(30))
            try await bus.waitUntilAnswering(e.orchestratorRPC, source: "test", timeout: .seconds(30))
            let client = e.client(bus)
            let tap = IntentRecorder(try await client.routeIntents(for: nil))
            // A new account needs no question: no profile can exist for a uid just minted.
            let uid = try await client.signIn(provider: .google, subject: "patient").uid
            let asked = await tap.next { $0.uid == uid && $0.reason == .signedIn }

            // "Check me now" must ask the profile side, which is down: nothing is decided, and a
            // second caller while the retry waits is told at once rather than left waiting.
            await expectCode(.dependencyUnavailable) { _ = try await client.checkNow() }
            await expectCode(.dependencyUnavailable) { _ = try await client.checkNow() }
            #expect(tap.intents(for: uid).count == 1, "nothing is decided on a guess")

            // Once the profile side answers, the retried check confirms the intent in force and
            // publishes it again, with the same id: the same decision, not a new one.
            tasks.addTask { try await second.run() }
            let again = await tap.next(2) { $0.uid == uid }
            #expect(again == asked)
            await second.triggerGracefulShutdown()
            await first.triggerGracefulShutdown()
            try await tasks.waitForAll()
        }
        try? FileManager.default.removeItem(at: directory)
    }
}

extension InProcessSystem {
    /// ``run(_:_:)`` with auth, profile and the orchestrator on stores of `kind` (SQLite files, or
    /// fresh schemas of the test database).
    static func run<Result: Sendable>(
        on kind: StoreKind, _ configuration: Configuration = Configuration(), _ body: (InProcessSystem) async throws -> Result
    ) async throws -> Result {
        guard kind == .postgres else { return try await run(configuration, body) }
        return try await TestPostgres.withSchemas(3) { locations in
            var configuration = configuration
            // Tests run many systems at once on a loaded machine: small pools, and time.
            configuration.authDatabase = AuthPostgresDatabase(location: locations[0], maxConnections: 4, timeout: .seconds(15))
            configuration.profileDatabase = ProfilePostgresDatabase(location: locations[1], maxConnections: 4, timeout: .seconds(15))
            configuration.orchestratorDatabase = OrchestratorPostgresDatabase(
                location: locations[2], maxConnections: 4, timeout: .seconds(15))
            return try await run(configuration, body)
        }
    }
}
