import Foundation
import OnboardingTesting
import Testing

@Suite("The whole system in one call", .timeLimit(.minutes(2)))
struct InProcessSystemKitTests {
    @Test("from sign-in on, on a slow-joining bus: presentProfileSetup, then dismiss after the set-up")
    func signInToDismiss() async throws {
        try await InProcessSystem.run(.init(joinDelay: .milliseconds(30))) { system in
            let app = system.client()
            let uid = try await app.signIn(provider: .kakao, subject: "minji-\(UUID().uuidString)").uid
            var intents = try await app.intents().makeAsyncIterator()
            let asked = await intents.next()
            #expect(asked?.intent.intent == .presentProfileSetup)
            #expect(asked?.intent.reason == .signedIn)
            #expect(try await system.intentInForce(for: uid).intent == asked?.intent)
            #expect(try await system.profile(of: uid) == nil)

            let profile = try await app.setUpProfile(username: "mj\(Int.random(in: 1000...9999))")
            let dismissed = await intents.next()
            #expect(dismissed?.intent.intent == .dismiss)
            #expect(try await system.profile(of: uid) == profile)
            #expect(system.storedImages(of: uid).isEmpty)
        }
    }

    @Test("stops cleanly and removes its temporary folder")
    func stops() async throws {
        let system = try await InProcessSystem.start()
        let folder = system.directory
        #expect(FileManager.default.fileExists(atPath: folder.appendingPathComponent("profile.sqlite").path))
        try await system.stop()
        try await system.stop()
        #expect(!FileManager.default.fileExists(atPath: folder.path))
        await expectCode(.noResponder) {
            _ = try await system.bus.call(HealthCheck(), to: system.endpoints.authRPC, source: "test")
        }
    }

    @Test("a service left out can be played by a stand-in: a profile store that does not answer")
    func standInForOneService() async throws {
        let configuration = InProcessSystem.Configuration(
            leftOut: [.profile], orchestratorCallTimeout: .milliseconds(200),
            orchestratorRetry: RetryPolicy(initial: .seconds(30), maximum: .seconds(30)))
        try await InProcessSystem.run(configuration) { system in
            let profile = try await StandInService.start(on: system.bus, at: system.endpoints.profileRPC)
            profile.fail(GetProfile.self, with: ServiceError(.timeout, "The stand-in profile store does not answer."))
            profile.fail(EventsAfter.self, with: ServiceError(.timeout, "The stand-in profile store does not answer."))
            let app = system.client()
            let uid = try await app.signIn(provider: .naver, subject: "patient-\(UUID().uuidString)").uid
            var intents = try await app.intents().makeAsyncIterator()
            let asked = await intents.next()
            #expect(asked?.intent.intent == .presentProfileSetup, "a new account needs no look-up")

            await expectCode(.dependencyUnavailable, reason: "profile") { _ = try await app.checkNow() }
            #expect(await profile.waitForRequests(1, of: GetProfile.self))
            #expect(try await system.intentInForce(for: uid).intent == asked?.intent, "nothing decided on a guess")
            await profile.stop()
        }
    }
}
