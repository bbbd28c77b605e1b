import HomeScreen
import OnboardingTesting
import Testing

@Suite("Home against a stand-in orchestrator", .timeLimit(.minutes(1)))
struct StubTests {
    @Test("the sheet follows the intents")
    func sheetFollowsIntents() async throws {
        let bus = InProcessBus()
        let orchestrator = try await StandInOrchestrator.start(on: bus)
        let client = OnboardingClient(
            bus: bus, configuration: orchestrator.clientConfiguration, session: orchestrator.session(for: "u1"))
        let screen = HomeScreen(client: client)
        var changes = screen.changes.makeAsyncIterator()
        let following = Task { try await screen.run() }

        try orchestrator.presentProfileSetup(for: "u1")
        #expect(await changes.next() == .profileSetup)
        try orchestrator.dismiss(for: "u1")
        #expect(await changes.next() == HomeScreen.Sheet.none)

        following.cancel()
        await orchestrator.stop()
    }

    @Test("a set-up that fails tells the person why")
    func setUpFails() async throws {
        let bus = InProcessBus()
        let orchestrator = try await StandInOrchestrator.start(on: bus)
        let client = OnboardingClient(
            bus: bus, configuration: orchestrator.clientConfiguration, session: orchestrator.session(for: "u1"))
        let screen = HomeScreen(client: client)

        orchestrator.service.fail(SetUpProfile.self, with: ServiceError(.usernameTaken, "Taken.", reason: "duplicated"))
        #expect(await screen.confirm(username: "minji") == "Someone already has that name.")
        orchestrator.service.fail(SetUpProfile.self, with: ServiceError(.dependencyUnavailable, "Profile store down."))
        #expect(await screen.confirm(username: "minji") == "We could not reach the server. Try again.")

        await orchestrator.stop()
    }
}
