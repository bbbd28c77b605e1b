import Foundation
import Messaging
import OnboardingAPI
import OnboardingClient
import OnboardingTesting
import Synchronization
import Testing

/// The client's retries, against stand-in services that fail on purpose.
@Suite("Client retries", .timeLimit(.minutes(1)))
struct ClientRetryTests {
    let bus = InProcessBus()
    let endpoints = SystemEndpoints.inProcess
    let session = OnboardingClient.Session(uid: "u1", sessionToken: "token-1", provider: .kakao)

    var client: OnboardingClient {
        OnboardingClient(
            bus: bus,
            configuration: .init(
                authRPC: endpoints.authRPC, profileRPC: endpoints.profileRPC, orchestratorRPC: endpoints.orchestratorRPC,
                routes: endpoints.routes, timeout: .milliseconds(400),
                retry: RetryPolicy(initial: .milliseconds(10), maximum: .milliseconds(50)), deadline: .seconds(30),
                name: "retry-test"),
            session: session)
    }

    /// What a stand-in service does with one request.
    enum Response: Sendable {
        case reply(any Codable & Sendable)
        case fail(ErrorCode)
        case silence
    }

    /// Serves `endpoint` for the length of `body`, answering request number `n` (1 is the first)
    /// as `respond(n)` says; returns `body`'s result and every request received.
    func withStandIn<T: Sendable>(
        at endpoint: Endpoint, _ respond: @escaping @Sendable (Int) -> Response, _ body: () async throws -> T
    ) async throws -> (T, [Message]) {
        let received = Mutex<[Message]>([])
        let requests = try await bus.serve(at: endpoint, limits: MessageLimits(maxAttachmentBytes: 1024))
        let server = Task {
            for await incoming in requests {
                let count = received.withLock { $0.append(incoming.message); return $0.count }
                switch respond(count) {
                case .reply(let payload):
                    incoming.reply(type: incoming.message.header.type + ".reply", source: "stand-in", payload: payload)
                case .fail(let code):
                    incoming.fail(ServiceError(code, "request \(count)"), source: "stand-in")
                case .silence:
                    break
                }
            }
        }
        defer { server.cancel() }
        let result = try await body()
        return (result, received.withLock { $0 })
    }

    let profile = Profile(uid: "u1", username: "mina", imagePath: nil, createdAt: "t", updatedAt: "t")

    @Test("a set-up whose replies are lost is resent with one idempotency key, and the next set-up gets a new one")
    func setUpReusesItsKey() async throws {
        let client = self.client
        let answer = ProfileResult(profile: profile)
        let (created, received) = try await withStandIn(at: endpoints.orchestratorRPC, { count in
            switch count {
            case 1: .silence
            case 2: .fail(.shuttingDown)
            case 3: .reply(answer)
            default: .fail(.profileExists)
            }
        }) {
            let created = try await client.setUpProfile(username: "mina", image: Data([1, 2, 3]))
            await expectCode(.profileExists) { _ = try await client.setUpProfile(username: "mina") }
            return created
        }
        #expect(created == profile)
        let sent = try received.map { try $0.payload(as: SetUpProfile.self) }
        #expect(sent.count == 4)
        let firstKey = try #require(sent.first?.idempotencyKey)
        #expect(IdempotencyKey.isValid(firstKey))
        #expect(sent.prefix(3).allSatisfy { $0.idempotencyKey == firstKey && $0.username == "mina" })
        #expect(received.prefix(3).allSatisfy { $0.attachment == Data([1, 2, 3]) && $0.header.sessionToken == "token-1" })
        #expect(sent[3].idempotencyKey != firstKey, "a new set-up, a new key")
    }

    @Test("a caller's own key is sent as given; a malformed one is refused before anything is sent")
    func callersKey() async throws {
        let client = self.client
        let (_, received) = try await withStandIn(at: endpoints.orchestratorRPC, { _ in .reply(ProfileResult(profile: profile)) }) {
            _ = try await client.setUpProfile(username: "mina", idempotencyKey: "app-key-1")
            await expectCode(.invalidRequest) { _ = try await client.setUpProfile(username: "mina", idempotencyKey: "no spaces") }
        }
        #expect(try received.map { try $0.payload(as: SetUpProfile.self).idempotencyKey } == ["app-key-1"])
    }

    @Test("sign-out is resent until auth answers, then the session is forgotten")
    func signOutIsRetried() async throws {
        let client = self.client
        let (_, received) = try await withStandIn(at: endpoints.authRPC, { $0 < 3 ? .silence : .reply(AccountResult(uid: "u1")) }) {
            try await client.signOut()
        }
        #expect(received.count == 3)
        #expect(received.allSatisfy { $0.header.type == SignOut.type && $0.header.sessionToken == "token-1" })
        #expect(client.session == nil)
    }

    @Test("withdrawal is resent after overloaded, and a refusal is not resent")
    func withdrawIsRetried() async throws {
        let client = self.client
        let (_, received) = try await withStandIn(at: endpoints.authRPC, { count in
            count == 1 ? .fail(.overloaded) : .reply(AccountResult(uid: "u1"))
        }) {
            try await client.withdraw()
        }
        #expect(received.count == 2)
        #expect(client.session == nil)

        let refused = OnboardingClient(bus: bus, configuration: client.configuration, session: session)
        let (_, again) = try await withStandIn(at: endpoints.authRPC, { _ in .fail(.unauthenticated) }) {
            await expectCode(.unauthenticated) { try await refused.withdraw() }
        }
        #expect(again.count == 1)
        #expect(refused.session == session, "a refused withdrawal keeps the session")
    }

    @Test("sign-in is resent when it was not handled, but not after a timeout: it may have opened a session")
    func signInRetriesOnlyWhatWasNotHandled() async throws {
        let client = self.client
        let result = SignInResult(uid: "u2", sessionToken: "token-2", provider: .google, isNewAccount: true)
        let (signedIn, turnedAway) = try await withStandIn(at: endpoints.authRPC, { count in
            count < 3 ? .fail(count == 1 ? .overloaded : .shuttingDown) : .reply(result)
        }) {
            try await client.signIn(provider: .google, subject: "someone")
        }
        #expect(signedIn == result)
        #expect(turnedAway.count == 3)
        #expect(client.session?.sessionToken == "token-2")

        let (_, timedOut) = try await withStandIn(at: endpoints.authRPC, { _ in .silence }) {
            await expectCode(.timeout) { _ = try await client.signIn(provider: .google, subject: "someone") }
        }
        #expect(timedOut.count == 1)
    }

    @Test("queries are resent: profile, check, username availability, the current intent")
    func queriesAreRetried() async throws {
        let client = self.client
        let state = RouteState(
            uid: "u1", intent: RouteIntent(intentId: "i1", uid: "u1", intent: .presentProfileSetup, reason: .signedIn),
            sequence: 7, time: "t")
        let (current, toOrchestrator) = try await withStandIn(at: endpoints.orchestratorRPC, { count in
            switch count {
            case 1: .fail(.overloaded)
            case 2: .reply(state)
            case 3: .silence
            default: .reply(OnboardingStatus(uid: "u1", hasProfile: false, intent: .presentProfileSetup))
            }
        }) {
            let current = try await client.currentIntent()
            #expect(try await client.checkNow().intent == .presentProfileSetup)
            return current
        }
        #expect(current == state)
        #expect(toOrchestrator.map(\.header.type) == [CurrentIntent.type, CurrentIntent.type, CheckOnboarding.type, CheckOnboarding.type])

        let (answers, toProfile) = try await withStandIn(at: endpoints.profileRPC, { count in
            switch count {
            case 1: .silence
            case 2: .reply(ProfileResult(profile: profile))
            case 3: .fail(.shuttingDown)
            default: .reply(UsernameAvailability(username: "sora", available: true, reason: nil))
            }
        }) {
            (try await client.profile(), try await client.checkUsername("sora").available)
        }
        #expect(answers.0 == profile)
        #expect(answers.1)
        #expect(toProfile.map(\.header.type) == [GetProfile.type, GetProfile.type, CheckUsername.type, CheckUsername.type])
    }

    @Test("a service that stays down fails the call with its last error once the deadline has passed")
    func deadline() async throws {
        var configuration = client.configuration
        configuration.deadline = .milliseconds(300)
        let impatient = OnboardingClient(bus: bus, configuration: configuration, session: session)
        let clock = ContinuousClock()
        let started = clock.now
        await expectCode(.noResponder) { _ = try await impatient.profile() }
        // That it ends at all is the point; the bound is loose, as a loaded machine runs late.
        #expect(started.duration(to: clock.now) < .seconds(15))
    }
}
