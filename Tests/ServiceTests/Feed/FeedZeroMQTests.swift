import AuthService
import Foundation
import Messaging
import OnboardingAPI
import ServiceRuntime
import Testing
import ZeroMQMessaging

@Suite("Event feed over ZeroMQ", .timeLimit(.minutes(1)))
struct FeedZeroMQTests {
    @Test("a feed started amid sign-ins gets every auth event once, in order, despite the slow joiner", arguments: FeedMode.allCases)
    func followsAuthOverZeroMQ(mode: FeedMode) async throws {
        // Below the ephemeral range; the messaging tests take 20000-24999, the system tests 26000 up.
        // Each mode has half of 25000-25899, and an even port: the two cases run at once, and
        // one's events port must never be the other's request port.
        let half = FeedMode.allCases.firstIndex(of: mode)! * 450
        let port = 25_000 + half + 2 * Int.random(in: 0..<225)
        let configuration = AuthService.Configuration(
            rpc: Endpoint("tcp://127.0.0.1:\(port)"), events: Endpoint("tcp://127.0.0.1:\(port + 1)"), devMode: true,
            serviceToken: "secret")
        let serverBus = ZeroMQBus(source: "auth", logger: quietLogger)
        // A loaded machine (the tests beside this one) can take longer than the default grace to
        // connect; that is not what this test is about.
        var patient = ZeroMQBus.Configuration()
        patient.connectGrace = .seconds(10)
        let clientBus = ZeroMQBus(source: "feed", logger: quietLogger, configuration: patient)
        let auth = try AuthService(configuration: configuration, bus: serverBus, logger: quietLogger)
        let feed = EventFeed(
            bus: clientBus, events: configuration.events, replay: configuration.rpc, topics: ["auth.signedIn"],
            source: "test", serviceToken: "secret", idleCheck: .milliseconds(200), logger: quietLogger)
        let recorder = FeedRecorder()
        func signIn(_ subject: String) async throws {
            _ = try await clientBus.call(SignIn(provider: .naver, subject: subject), to: configuration.rpc, source: "test")
        }
        var failure: (any Error)?
        do {
            try await withRunningService(auth, on: clientBus, answeringAt: configuration.rpc) {
                for index in 1...3 { try await signIn("before-\(index)") }
                try await withFeed(feed, recorder: recorder, mode: mode) {
                    for index in 1...20 { try await signIn("after-\(index)") }
                    try await recorder.waitUntilHandled(through: 23)
                }
            }
        } catch {
            failure = error
        }
        await clientBus.shutdown()
        await serverBus.shutdown()
        if let failure { throw failure }
        #expect(recorder.delivered == Array(1...23))
        #expect(feed.statistics.handled == 23)
        #expect(feed.statistics.replayed >= 3, "the sign-ins before the feed started come from the record")
    }
}
