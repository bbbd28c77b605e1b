import HomeScreen
import OnboardingTesting
import Testing

@Suite("Home against the whole system in one process", .timeLimit(.minutes(1)))
struct SystemTests {
    @Test("a new person is asked for a profile, sets it up, and the sheet goes away")
    func newPerson() async throws {
        try await InProcessSystem.run { system in
            let client = system.client()
            let uid = try await client.signIn(provider: .kakao, subject: "minji").uid
            let screen = HomeScreen(client: client)
            var changes = screen.changes.makeAsyncIterator()
            let following = Task { try await screen.run() }

            #expect(await changes.next() == .profileSetup)
            #expect(await screen.confirm(username: "minji") == nil)
            #expect(await changes.next() == HomeScreen.Sheet.none)
            #expect(try await system.profile(of: uid)?.username == "minji")

            following.cancel()
        }
    }
}
