import Foundation
import Logging
import OnboardingTesting
import Synchronization
import Testing
import ZeroMQMessaging

/// The buses `intents()` must work on: the stub as it is, the stub with ZeroMQ's slow joiner,
/// and ZeroMQ itself (two buses, like two processes).
enum FeedBus: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case inProcess, slowJoiningInProcess, zeroMQ

    var testDescription: String { rawValue }

    /// Runs `body` with a stand-in orchestrator on one bus and the app's bus (the same one,
    /// in-process), then stops everything.
    func withOrchestrator(_ body: (StandInOrchestrator, any MessageBus) async throws -> Void) async throws {
        switch self {
        case .inProcess, .slowJoiningInProcess:
            let bus = InProcessBus(joinDelay: self == .inProcess ? .zero : .milliseconds(30))
            let orchestrator = try await StandInOrchestrator.start(on: bus)
            do { try await body(orchestrator, bus) } catch {
                await orchestrator.stop()
                throw error
            }
            await orchestrator.stop()
        case .zeroMQ:
            var logger = Logger(label: "test.zmq")
            logger.logLevel = .warning
            let server = ZeroMQBus(source: "server", logger: logger)
            var patient = ZeroMQBus.Configuration()
            patient.connectGrace = .seconds(3)
            let client = ZeroMQBus(source: "app", logger: logger, configuration: patient)
            var attempts = 0
            var started: StandInOrchestrator?
            while started == nil {
                // Below the contract tests' ports (20000 and up) and the system tests' (26000 and up).
                let endpoints = SystemEndpoints.tcp(base: 18_000 + Int.random(in: 0..<190) * 10)
                do {
                    started = try await StandInOrchestrator.start(on: server, endpoints: endpoints)
                } catch let error as ServiceError where error.code == .addressInUse && attempts < 20 {
                    attempts += 1
                }
            }
            let orchestrator = try #require(started)
            do { try await body(orchestrator, client) } catch {
                await orchestrator.stop()
                await client.shutdown()
                await server.shutdown()
                throw error
            }
            await orchestrator.stop()
            await client.shutdown()
            await server.shutdown()
        }
    }
}

@Suite("Intents from sign-in on", .timeLimit(.minutes(1)))
struct IntentFeedTests {
    @Test("an intent published the moment intents() returns is not lost, on either bus", arguments: FeedBus.allCases)
    func noSlowJoinerLoss(bus kind: FeedBus) async throws {
        try await kind.withOrchestrator { orchestrator, bus in
            for round in 0..<10 {
                let uid = "person-\(round)-\(UUID().uuidString.lowercased())"
                let app = OnboardingClient(
                    bus: bus, configuration: orchestrator.clientConfiguration, session: orchestrator.session(for: uid))
                var intents = try await app.intents().makeAsyncIterator()
                let asked = try orchestrator.presentProfileSetup(for: uid)
                let received = await intents.next()
                #expect(received?.intent == asked, "round \(round)")
            }
        }
    }

    @Test("the intent in force comes first, then each new decision once, in order", arguments: FeedBus.allCases)
    func inForceThenLive(bus kind: FeedBus) async throws {
        try await kind.withOrchestrator { orchestrator, bus in
            let uid = "person-\(UUID().uuidString.lowercased())"
            let asked = try orchestrator.presentProfileSetup(for: uid)
            let app = OnboardingClient(
                bus: bus, configuration: orchestrator.clientConfiguration, session: orchestrator.session(for: uid))
            var intents = try await app.intents().makeAsyncIterator()
            #expect(await intents.next()?.intent == asked)

            // A check that confirms the decision republishes it (same id): not delivered again.
            #expect(try await app.checkNow().intent == .presentProfileSetup)
            try orchestrator.republish(for: uid)
            let dismissed = try orchestrator.dismiss(for: uid)
            let next = await intents.next()
            #expect(next?.intent == dismissed)
            #expect(next.map { $0.sequence > 1 } == true)
        }
    }

    @Test("a subscription of its own misses what is published before it joins: the stub shows the trap")
    func rawSubscriptionMissesOnSlowJoiner() async throws {
        let bus = InProcessBus(joinDelay: .milliseconds(200))
        let orchestrator = try await StandInOrchestrator.start(on: bus)
        let uid = "person-\(UUID().uuidString.lowercased())"
        let app = OnboardingClient(bus: bus, configuration: orchestrator.clientConfiguration, session: orchestrator.session(for: uid))
        var raw = try await app.routeIntents(for: uid).makeAsyncIterator()
        let lost = try orchestrator.presentProfileSetup(for: uid)
        // Decide again until one arrives: the first to arrive is not the one published at once.
        let publishing = Task {
            while !Task.isCancelled {
                try orchestrator.dismiss(for: uid)
                try await Task.sleep(for: .milliseconds(20))
            }
        }
        let first = await raw.next()
        publishing.cancel()
        #expect(first != nil)
        #expect(first?.intent != lost)
        await orchestrator.stop()
    }

    @Test("intents() needs someone signed in")
    func needsSession() async throws {
        let bus = InProcessBus()
        let app = SystemEndpoints.inProcess.client(bus)
        await expectCode(.unauthenticated) { _ = try await app.intents() }
    }
}
