import AuthService
import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingClient
import OnboardingOrchestrator
import OnboardingTesting
import ProfileService
import ServiceLifecycle
import ServiceRuntime
import Synchronization
import Testing

/// "Check me now" that names its uid: the orchestrator asks profile while auth verifies the
/// session (one round trip, not two), and the session still decides whose check it is.
///
/// Auth and profile run for real behind forwarding stand-ins, which record what the
/// orchestrator asks and can hold or fail a request.
@Suite("Check me now, with the profile asked ahead", .timeLimit(.minutes(1)))
struct CheckAheadTests {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("onboarding-check-ahead-\(UUID().uuidString)")
    let e = SystemEndpoints.inProcess
    static let token = "check-ahead-service-token"
    static let authBehind: Endpoint = "inproc://auth-behind"
    static let profileBehind: Endpoint = "inproc://profile-behind"

    var logger: Logger {
        var logger = Logger(label: "check-ahead-test")
        logger.logLevel = .critical
        return logger
    }

    /// What the stand-ins in front of auth and profile saw and do.
    final class Script: Sendable {
        struct State {
            /// Hold the next `auth.verifySession` until profile has been asked for a profile.
            var holdVerification = false
            /// Fail this many `profile.get` requests with `storeUnavailable` before forwarding.
            var failProfileGets = 0
            var profileGets: [String] = []
            var verifications = 0
            /// For each held verification: whether a `profile.get` let it go (not the time limit).
            var released: [Bool] = []
            var waiter: CheckedContinuation<Bool, Never>?
        }

        let state = Mutex(State())

        func profileAsked(uid: String) -> Bool {
            let (fail, waiter) = state.withLock { state -> (Bool, CheckedContinuation<Bool, Never>?) in
                state.profileGets.append(uid)
                defer { state.waiter = nil }
                let fail = state.failProfileGets > 0
                if fail { state.failProfileGets -= 1 }
                return (fail, state.waiter)
            }
            waiter?.resume(returning: true)
            return fail
        }

        /// Waits, when told to hold, until profile is asked or 3 s pass.
        func verificationArrived() async {
            let hold = state.withLock { state in
                state.verifications += 1
                defer { state.holdVerification = false }
                return state.holdVerification
            }
            guard hold else { return }
            let byProfile = await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let asked = state.withLock { state in
                    if !state.profileGets.isEmpty { return true }
                    state.waiter = continuation
                    return false
                }
                if asked {
                    continuation.resume(returning: true)
                    return
                }
                Task { [self] in
                    try? await Task.sleep(for: .seconds(3))
                    let waiter = state.withLock { state in
                        defer { state.waiter = nil }
                        return state.waiter
                    }
                    waiter?.resume(returning: false)
                }
            }
            state.withLock { $0.released.append(byProfile) }
        }
    }

    /// Forwards every request at `endpoint` to `behind`, after `before` (which may hold it, or
    /// answer it with an error instead).
    func forward(
        _ bus: InProcessBus, at endpoint: Endpoint, to behind: Endpoint,
        before: @escaping @Sendable (Message) async -> ServiceError?
    ) async throws -> Task<Void, Never> {
        let requests = try await bus.serve(at: endpoint, limits: MessageLimits())
        return Task {
            await withTaskGroup(of: Void.self) { group in
                for await incoming in requests {
                    group.addTask {
                        if let refusal = await before(incoming.message) {
                            incoming.fail(refusal, source: "stand-in")
                            return
                        }
                        do {
                            let reply = try await bus.request(
                                OutgoingMessage(body: incoming.message.body, attachment: incoming.message.attachment),
                                to: behind, timeout: .seconds(5))
                            incoming.reply(OutgoingMessage(body: reply.body, attachment: reply.attachment))
                        } catch {
                            incoming.fail((error as? ServiceError) ?? ServiceError(.internalError, "\(error)"), source: "stand-in")
                        }
                    }
                }
            }
        }
    }

    /// Runs auth and profile (behind the stand-ins) and the orchestrator while `body` runs.
    func withSystem(_ body: @Sendable (InProcessBus, Script, SystemEndpoints) async throws -> Void) async throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let bus = InProcessBus()
        let script = Script()
        let e = self.e
        let services = ServiceGroup(
            services: [
                try AuthService(
                    configuration: .init(
                        rpc: Self.authBehind, events: e.authEvents,
                        databasePath: directory.appendingPathComponent("auth.sqlite").path, devMode: true,
                        serviceToken: Self.token),
                    bus: bus, logger: logger),
                try ProfileService(
                    configuration: .init(
                        rpc: Self.profileBehind, events: e.profileEvents, authRPC: Self.authBehind,
                        databasePath: directory.appendingPathComponent("profile.sqlite").path, serviceToken: Self.token),
                    bus: bus, logger: logger),
                try OnboardingOrchestrator(
                    configuration: .init(
                        rpc: e.orchestratorRPC, routes: e.routes, authRPC: e.authRPC, authEvents: e.authEvents,
                        profileRPC: e.profileRPC, profileEvents: e.profileEvents, imageRPC: e.imageRPC,
                        databasePath: directory.appendingPathComponent("orchestrator.sqlite").path, serviceToken: Self.token),
                    bus: bus, logger: logger),
            ],
            logger: logger)
        let authStandIn = try await forward(bus, at: e.authRPC, to: Self.authBehind) { message in
            if message.header.type == VerifySession.type { await script.verificationArrived() }
            return nil
        }
        let profileStandIn = try await forward(bus, at: e.profileRPC, to: Self.profileBehind) { message in
            guard message.header.type == GetProfile.type else { return nil }
            return script.profileAsked(uid: message.header.uid ?? "") ? ServiceError(.storeUnavailable, "on purpose") : nil
        }
        defer {
            authStandIn.cancel()
            profileStandIn.cancel()
        }
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await services.run() }
            for endpoint in [Self.authBehind, Self.profileBehind, e.orchestratorRPC] {
                try await bus.waitUntilAnswering(endpoint, source: "test")
            }
            var direct = e
            direct.authRPC = Self.authBehind
            direct.profileRPC = Self.profileBehind
            do {
                try await body(bus, script, direct)
            } catch {
                await services.triggerGracefulShutdown()
                try? await tasks.waitForAll()
                throw error
            }
            await services.triggerGracefulShutdown()
            try await tasks.waitForAll()
        }
    }

    /// Signs a new person in and waits for their `presentProfileSetup`; returns their session.
    func signIn(_ bus: InProcessBus, _ endpoints: SystemEndpoints, _ subject: String) async throws -> OnboardingClient.Session {
        let client = endpoints.client(bus, name: "sign-in")
        let tap = IntentRecorder(try await client.routeIntents(for: nil))
        let signedIn = try await client.signIn(provider: .kakao, subject: "\(subject)-\(UUID().uuidString)")
        _ = try #require(await tap.next { $0.uid == signedIn.uid && $0.intent == .presentProfileSetup })
        return OnboardingClient.Session(uid: signedIn.uid, sessionToken: signedIn.sessionToken, provider: .kakao)
    }

    @Test("auth and profile are asked at once, and the answer asked ahead decides the check")
    func askedAtOnce() async throws {
        try await withSystem { bus, script, endpoints in
            let session = try await signIn(bus, endpoints, "ahead")
            script.state.withLock { $0.holdVerification = true }
            let status = try await endpoints.client(bus, session: session).checkNow()
            #expect(status == OnboardingStatus(uid: session.uid, hasProfile: false, intent: .presentProfileSetup))
            let seen = script.state.withLock { ($0.released, $0.profileGets) }
            // Auth's answer was held until profile had been asked: the two were in flight together.
            #expect(seen.0 == [true])
            // Profile was asked once: the answer asked ahead was the check's.
            #expect(seen.1 == [session.uid])
        }
    }

    @Test("a uid that is not the session's is only a wrong guess: the check is the session's person's")
    func wrongHint() async throws {
        try await withSystem { bus, script, endpoints in
            let mine = try await signIn(bus, endpoints, "mine")
            let other = try await signIn(bus, endpoints, "other")
            let guessing = OnboardingClient.Session(uid: other.uid, sessionToken: mine.sessionToken, provider: .kakao)
            let status = try await endpoints.client(bus, session: guessing).checkNow()
            #expect(status == OnboardingStatus(uid: mine.uid, hasProfile: false, intent: .presentProfileSetup))
            // The guess was asked ahead and set aside; the session's person was then asked.
            #expect(script.state.withLock { $0.profileGets } == [other.uid, mine.uid])
        }
    }

    @Test("a session that is not live is refused, whatever uid the request names")
    func refusedSession() async throws {
        try await withSystem { bus, _, endpoints in
            let someone = try await signIn(bus, endpoints, "someone")
            let forged = OnboardingClient.Session(uid: someone.uid, sessionToken: "1.not-the-secret", provider: .kakao)
            await expectCode(.unauthenticated) { _ = try await endpoints.client(bus, session: forged).checkNow() }
        }
    }

    @Test("when the answer asked ahead is a failure, the check asks profile again and answers")
    func failedAhead() async throws {
        try await withSystem { bus, script, endpoints in
            let session = try await signIn(bus, endpoints, "retry")
            script.state.withLock { $0.failProfileGets = 1 }
            let status = try await endpoints.client(bus, session: session).checkNow()
            #expect(status == OnboardingStatus(uid: session.uid, hasProfile: false, intent: .presentProfileSetup))
            #expect(script.state.withLock { $0.profileGets } == [session.uid, session.uid])
        }
    }

    @Test("without a uid, the check asks profile once the session is verified")
    func withoutHint() async throws {
        try await withSystem { bus, script, endpoints in
            let session = try await signIn(bus, endpoints, "plain")
            let tokenOnly = OnboardingClient.Session(uid: "", sessionToken: session.sessionToken, provider: .kakao)
            let status = try await endpoints.client(bus, session: tokenOnly).checkNow()
            #expect(status == OnboardingStatus(uid: session.uid, hasProfile: false, intent: .presentProfileSetup))
            #expect(script.state.withLock { ($0.verifications, $0.profileGets) } == (1, [session.uid]))
        }
    }
}
