import Foundation
import OnboardingTesting
import Testing

/// The stand-ins: a test decides what callers get, and the client surfaces it as typed errors.
@Suite("Stand-in services", .timeLimit(.minutes(1)))
struct StandInTests {
    let bus = InProcessBus()
    let endpoints = SystemEndpoints.inProcess

    @Test("a stand-in answers what it was told, refuses the unexpected, and keeps every request")
    func answers() async throws {
        let profile = try await StandInService.start(on: bus, at: endpoints.profileRPC)
        profile.answer(CheckUsername.self) { request, _ in
            UsernameAvailability(
                username: request.username, available: request.username != "taken",
                reason: request.username == "taken" ? .duplicated : nil)
        }
        let app = endpoints.client(bus)
        #expect(try await app.checkUsername("minji").available)
        #expect(try await !app.checkUsername("taken").available)
        #expect(profile.requests(of: CheckUsername.self).map(\.username) == ["minji", "taken"])

        let session = OnboardingClient.Session(uid: "u1", sessionToken: "t1", provider: .kakao)
        let signedIn = endpoints.client(bus, session: session)
        await expectCode(.unknownType) { _ = try await signedIn.profile() }
        #expect(profile.unexpectedRequests.map(\.header.type) == [GetProfile.type])
        await profile.stop()
    }

    @Test("a typed error, the bus's own codes included, reaches the caller at once")
    func failures() async throws {
        let orchestrator = try await StandInService.start(on: bus, at: endpoints.orchestratorRPC)
        let session = OnboardingClient.Session(uid: "u1", sessionToken: "t1", provider: .kakao)
        let app = endpoints.client(bus, session: session, deadline: .milliseconds(300))

        orchestrator.fail(CheckOnboarding.self, with: ServiceError(.dependencyUnavailable, "profile is down", reason: "profile"))
        await expectCode(.dependencyUnavailable, reason: "profile") { _ = try await app.checkNow() }

        // `timeout` is retried by the client until its deadline, then thrown.
        orchestrator.fail(CheckOnboarding.self, with: ServiceError(.timeout, "pretend nobody answered"))
        await expectCode(.timeout) { _ = try await app.checkNow() }
        #expect(orchestrator.requests(of: CheckOnboarding.self).count >= 2)

        // Stopped: nothing answers there any more.
        await orchestrator.stop()
        await expectCode(.noResponder) { _ = try await app.checkNow() }
    }

    @Test("a late answer arrives late; an ignored request ends in the caller's timeout")
    func delaysAndSilence() async throws {
        let profile = try await StandInService.start(on: bus, at: endpoints.profileRPC)
        profile.answer(CheckUsername.self, with: UsernameAvailability(username: "slow", available: true, reason: nil), after: .milliseconds(200))
        let app = endpoints.client(bus, timeout: .seconds(5))
        let clock = ContinuousClock()
        let started = clock.now
        #expect(try await app.checkUsername("slow").available)
        #expect(clock.now - started >= .milliseconds(200))

        profile.ignore(CheckUsername.self)
        let impatient = endpoints.client(bus, timeout: .milliseconds(100), deadline: .milliseconds(250))
        await expectCode(.timeout) { _ = try await impatient.checkUsername("anyone") }
        await profile.stop()
    }

    @Test("waiting for requests wakes on arrival, and gives up after its timeout")
    func waitingForRequests() async throws {
        let profile = try await StandInService.start(on: bus, at: endpoints.profileRPC)
        profile.answer(CheckUsername.self, with: UsernameAvailability(username: "x", available: true, reason: nil))
        let app = endpoints.client(bus)
        let call = Task { try await app.checkUsername("x") }
        #expect(await profile.waitForRequests(1, of: CheckUsername.self))
        _ = try await call.value
        #expect(await !profile.waitForRequests(2, of: CheckUsername.self, timeout: .milliseconds(50)))
        await profile.stop()
    }
}

/// Expects `body` to fail with a ``ServiceError`` of `code` (and `reason`, when given).
func expectCode(
    _ code: ErrorCode, reason: String? = nil, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () async throws -> Void
) async {
    do {
        try await body()
        Issue.record("expected \(code), but it succeeded", sourceLocation: sourceLocation)
    } catch let error as ServiceError {
        #expect(error.code == code, "\(error)", sourceLocation: sourceLocation)
        if let reason { #expect(error.reason == reason, "\(error)", sourceLocation: sourceLocation) }
    } catch {
        Issue.record("expected \(code), got \(error)", sourceLocation: sourceLocation)
    }
}
