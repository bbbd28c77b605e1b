import Foundation
import OnboardingGateway
import Testing

/// The gateway bounds idle connections (`ONBOARDING_GATEWAY_IDLE_TIMEOUT_SECONDS`): one with no
/// request being read or answered is closed; an open intent stream is being answered and stays.
@Suite("Idle connections", .serialized)
struct IdleConnectionTests {
    @Test("a connection that sends nothing, or nothing after its answer, is closed once the idle limit passes")
    func idleConnectionsAreClosed() async throws {
        try await GatewaySystem().run(configure: { $0.idleTimeout = .seconds(1) }) { _, gateway in
            // Taken before connecting: the gateway's idle clock starts later (when it accepts), so
            // a close is never seen before the limit, however loaded the machine.
            let opened = ContinuousClock.now
            let silent = try await RawConnection.open(port: gateway.port)
            let kept = try await RawConnection.open(port: gateway.port)
            async let quiet = silent.readUntilClosed(since: opened, deadline: .seconds(20))
            async let afterAnswer = kept.readUntilClosed(
                sending: "GET /openapi.json HTTP/1.1\r\nHost: gateway\r\n\r\n", since: opened, deadline: .seconds(20))
            let (silence, answered) = try await (quiet, afterAnswer)
            let silentAfter = try #require(silence.closedAfter, "a silent connection was never closed")
            #expect(silentAfter >= .milliseconds(900) && silentAfter < .seconds(10))
            #expect(answered.text.hasPrefix("HTTP/1.1 200"), "\(answered.text.prefix(200))")
            let keptAfter = try #require(answered.closedAfter, "a kept-alive connection was never closed")
            #expect(keptAfter >= .milliseconds(900) && keptAfter < .seconds(10))
        }
    }

    @Test("an intent stream outlives the idle limit: it is a request being answered, and its heartbeats go on")
    func streamsStayOpen() async throws {
        try await GatewaySystem().run(configure: {
            $0.idleTimeout = .seconds(1)
            $0.heartbeat = .milliseconds(400)
        }) { _, gateway in
            let me = try await GatewayHTTP(gateway).signIn("idle-stream-\(UUID().uuidString)")
            let stream = try await EventStreamReader.open(base: gateway.base, token: me.sessionToken)
            defer { stream.close() }
            await stream.waitForIntents(1)
            let opened = ContinuousClock.now
            let before = stream.events.filter { !$0.isIntent }.count
            // Heartbeats well past the idle limit: at least 6, and one more than 2 s after the
            // stream opened (a loaded machine may deliver a few at once).
            let heartbeats = await stream.wait(for: "6 heartbeats, the last past 2 s", timeout: .seconds(20)) { events in
                events.filter { !$0.isIntent }.count >= before + 6 && ContinuousClock.now - opened > .seconds(2)
            }
            #expect(heartbeats, "the heartbeats went on after the idle limit had passed")
            #expect(!stream.ended)
        }
    }
}
