import AuthService
import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingOrchestrator
import OnboardingTesting
import ProfileService
import ServiceLifecycle
import ServiceRuntime
import Testing

/// The orchestrator loses nothing to a restart: what happened while it was away is replayed
/// from the publishers' outboxes, what it handled before is not handled again, and its route
/// state and sequence numbers carry on.
@Suite("Crash recovery")
struct RecoveryTests {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("onboarding-recovery-\(UUID().uuidString)")
    let e = SystemEndpoints.inProcess
    static let token = "recovery-service-token"

    var logger: Logger {
        var logger = Logger(label: "recovery-test")
        logger.logLevel = .critical
        return logger
    }

    func orchestrator(_ bus: InProcessBus) throws -> OnboardingOrchestrator {
        try OnboardingOrchestrator(
            configuration: .init(
                rpc: e.orchestratorRPC, routes: e.routes, authRPC: e.authRPC, authEvents: e.authEvents,
                profileRPC: e.profileRPC, profileEvents: e.profileEvents, imageRPC: e.imageRPC,
                databasePath: directory.appendingPathComponent("orchestrator.sqlite").path, serviceToken: Self.token),
            bus: bus, logger: logger)
    }

    @Test("events published while the orchestrator is down are handled once it is back, and only once")
    func replayAfterRestart() async throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let bus = InProcessBus()
        let publishers = ServiceGroup(
            services: [
                try AuthService(
                    configuration: .init(
                        rpc: e.authRPC, events: e.authEvents, databasePath: directory.appendingPathComponent("auth.sqlite").path,
                        devMode: true, serviceToken: Self.token),
                    bus: bus, logger: logger),
                try ProfileService(
                    configuration: .init(
                        rpc: e.profileRPC, events: e.profileEvents, authRPC: e.authRPC,
                        databasePath: directory.appendingPathComponent("profile.sqlite").path, serviceToken: Self.token),
                    bus: bus, logger: logger),
            ],
            logger: logger)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await publishers.run() }
            try await bus.waitUntilAnswering(e.authRPC, source: "test")
            try await bus.waitUntilAnswering(e.profileRPC, source: "test")
            let first = e.client(bus, name: "first")
            let tap = IntentRecorder(try await first.routeIntents(for: nil))

            // Before the orchestrator has ever run: its first start replays this sign-in.
            let early = try await first.signIn(provider: .kakao, subject: "early-\(UUID().uuidString)").uid

            let before = ServiceGroup(services: [try orchestrator(bus)], logger: logger)
            let running = Task { try await before.run() }
            let earlyIntent = try #require(await tap.next { $0.uid == early && $0.intent == .presentProfileSetup })

            await before.triggerGracefulShutdown()
            try await running.value
            // While it is down: a new person signs in; the early person's state is asked for later.
            let second = e.client(bus, name: "second")
            let late = try await second.signIn(provider: .naver, subject: "late-\(UUID().uuidString)").uid

            let after = ServiceGroup(services: [try orchestrator(bus)], logger: logger)
            tasks.addTask { try await after.run() }
            try await bus.waitUntilAnswering(e.orchestratorRPC, source: "test")
            let lateIntent = try #require(await tap.next { $0.uid == late && $0.intent == .presentProfileSetup })
            #expect(lateIntent.reason == .signedIn)

            // What a late app asks for: the intent in force, with its sequence number.
            let lateState = try await second.currentIntent()
            #expect(lateState.intent == lateIntent)
            let earlyState = try await first.currentIntent()
            #expect(earlyState.intent == earlyIntent, "the early person's intent survived the restart")
            #expect((lateState.sequence ?? 0) > (earlyState.sequence ?? .max), "route sequence numbers carry on")

            // Handled once: the early sign-in was not decided again after the restart.
            _ = try await second.setUpProfile(username: "late\(Int.random(in: 100...999))")
            await tap.next { $0.uid == late && $0.intent == .dismiss }
            #expect(tap.intents(for: early).count == 1)
            #expect(tap.intents(for: late).filter { $0.intent == .dismiss }.count == 1)

            // Every state at once, for operators and the tap.
            let page = try await bus.call(
                ListRouteStates(), to: e.orchestratorRPC, source: "test", serviceToken: Self.token)
            #expect(Set(page.states.map(\.uid)).isSuperset(of: [early, late]))
            #expect(page.states.first { $0.uid == late }?.intent?.intent == .dismiss)

            await after.triggerGracefulShutdown()
            await publishers.triggerGracefulShutdown()
            try await tasks.waitForAll()
        }
    }
}
