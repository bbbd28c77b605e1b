import Foundation
import Messaging
import OnboardingAPI
import OnboardingClient
import OnboardingTesting
import ServiceRuntime
import Synchronization
import Testing
import ZeroMQMessaging

#if canImport(Glibc)
import Glibc
#endif

/// The recipe that once lost `dismiss` (issue 8), over the real executables: a new account is
/// asked to set up; the profile service hangs (SIGSTOP); the person signs in on a second device
/// (its check times out and backs off) and asks "check me now"; the person sets up (the create
/// hangs too); after a few seconds the profile service goes on (SIGCONT).
///
/// Every set-up must be answered with its profile, `dismiss` must be in force for everyone, and
/// nobody may get two `dismiss`, even once both devices have signed out and every late event
/// has arrived. `RECIPE_ROUNDS` (default 1) and `RECIPE_PEOPLE` (default 8) make it longer:
/// `RECIPE_ROUNDS=100 swift test --filter DismissRecipeTests`. `RECIPE_HANG_MS` (default 3500)
/// sets how long the profile service hangs; past 4000 every set-up is refused once and repeated.
@Suite("The recipe of lost and doubled dismiss, over the real executables", .serialized)
struct DismissRecipeTests {
    static let environment = ProcessInfo.processInfo.environment
    static let rounds = max(1, Int(environment["RECIPE_ROUNDS"] ?? "") ?? 1)
    static let people = max(1, Int(environment["RECIPE_PEOPLE"] ?? "") ?? 8)
    static let hang = Duration.milliseconds(max(0, Int(environment["RECIPE_HANG_MS"] ?? "") ?? 3_500))

    @Test("set-ups while the profile service hangs all end with one dismiss in force")
    func setUpWhileProfileHangs() async throws {
        try await RunningSystem.run { bus, system in
            let tap = IntentRecorder(try await system.endpoints.client(bus, name: "tap").routeIntents(for: nil))
            try await tap.warmUp(with: system.endpoints.client(bus, name: "warm-up"))
            let serviceToken = try ServiceTokenFile(directory: system.directory.path).readOrCreate()
            let profile = system.processes[1]
            #expect(profile.name == "profile-service")
            for round in 1...Self.rounds {
                try await Self.round(
                    round, bus: bus, endpoints: system.endpoints, tap: tap, profilePID: profile.processIdentifier,
                    serviceToken: serviceToken, directory: system.directory)
            }
        }
    }

    static func round(
        _ round: Int, bus: ZeroMQBus, endpoints: SystemEndpoints, tap: IntentRecorder, profilePID: pid_t,
        serviceToken: String, directory: URL
    ) async throws {
        // Everyone signs in for the first time and is asked to set up.
        var people: [(uid: String, subject: String, first: OnboardingClient, second: OnboardingClient)] = []
        for index in 0..<Self.people {
            let subject = "recipe-\(round)-\(index)-\(UUID().uuidString.prefix(8))"
            let device = endpoints.client(bus, name: "device-a")
            let uid = try await device.signIn(provider: .google, subject: subject).uid
            people.append((uid, subject, device, endpoints.client(bus, name: "device-b")))
        }
        for person in people {
            await tap.next { $0.uid == person.uid && $0.intent == .presentProfileSetup }
        }

        // The profile service hangs; the second devices sign in, ask, and everyone sets up.
        kill(profilePID, SIGSTOP)
        let resumed = Mutex(false)
        let resume = { @Sendable in
            if resumed.withLock({ let was = $0; $0 = true; return !was }) { kill(profilePID, SIGCONT) }
        }
        defer { resume() }
        let profiles = try await withThrowingTaskGroup(of: (String, Profile?).self) { group in
            for (index, person) in people.enumerated() {
                group.addTask {
                    _ = try await person.second.signIn(provider: .google, subject: person.subject)
                    if index.isMultiple(of: 2) {
                        // "Check me now" when Home appears: answered later, or refused while the store hangs.
                        Task { _ = try? await person.first.checkNow() }
                    }
                    let created = try await Self.setUp(person.first, username: "r\(round)x\(index)")
                    return (person.uid, created)
                }
            }
            // The hang: long enough for checks to time out and back off, short enough for the
            // set-ups' own retries to get through once it ends.
            try await Task.sleep(for: Self.hang)
            resume()
            var profiles: [String: Profile?] = [:]
            for try await (uid, profile) in group { profiles[uid] = profile }
            return profiles
        }
        #expect(profiles.count == people.count, "every set-up is answered with its profile")

        for person in people {
            let dismiss = await tap.next { $0.uid == person.uid && $0.intent == .dismiss }
            let state = try await person.first.currentIntent()
            #expect(state.intent?.intent == .dismiss, "round \(round): \(person.uid) has \(String(describing: state.intent))")
            #expect(state.intent?.intentId == dismiss?.intentId)
            let status = try await person.first.checkNow()
            #expect(status.hasProfile && status.intent == nil)
        }

        // Both devices sign out; once the orchestrator has every profile event, nobody has two.
        for person in people {
            try await person.first.signOut()
            try await person.second.signOut()
        }
        try await waitUntilCaughtUp(bus: bus, endpoints: endpoints, serviceToken: serviceToken, directory: directory)
        for person in people {
            let intents = tap.intents(for: person.uid)
            let dismissals = Set(intents.filter { $0.intent == .dismiss }.map(\.intentId))
            let asks = Set(intents.filter { $0.intent == .presentProfileSetup }.map(\.intentId))
            #expect(dismissals.count == 1, "round \(round): \(person.uid) got \(dismissals.count) dismiss")
            #expect(asks.count == 1, "round \(round): \(person.uid) was asked \(asks.count) times for one missing profile")
        }
    }

    /// A set-up as an app makes it: one idempotency key for the person's one confirmation, sent
    /// again with that key while the answer is `dependencyUnavailable` ("Nothing was lost; try
    /// again"). The orchestrator gives up on the profile service after two call timeouts (4 s),
    /// so a set-up that started at the beginning of the hang may be refused before the service
    /// goes on and catches up, most of all on a busy machine; its repeat must still be answered
    /// with the one profile, and nobody may get a second `dismiss` for it.
    static func setUp(_ device: OnboardingClient, username: String) async throws -> Profile {
        let key = IdempotencyKey.make()
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: .seconds(30))
        while true {
            do {
                return try await device.setUpProfile(username: username, idempotencyKey: key)
            } catch let error as ServiceError where error.code == .dependencyUnavailable && clock.now < deadline {
                try await Task.sleep(for: .milliseconds(200))
            }
        }
    }

    /// Waits until the orchestrator has handled every event the profile service recorded.
    static func waitUntilCaughtUp(
        bus: ZeroMQBus, endpoints: SystemEndpoints, serviceToken: String, directory: URL
    ) async throws {
        // Profile's record is the orchestrator's to replay (the rights table): asked with its key.
        let orchestrator = try testBus(as: "orchestrator", directory: directory, servers: endpoints.servers)
        let recorded = try await orchestrator.call(
            EventsAfter(sequence: 0, limit: 1), to: endpoints.profileRPC, source: "test", serviceToken: serviceToken
        ).lastSequence
        await orchestrator.shutdown()
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: .seconds(30))
        while clock.now < deadline {
            let health = try await bus.call(HealthCheck(), to: endpoints.orchestratorRPC, source: "test")
            let handled = health.feeds?.first { $0.publisher == endpoints.profileRPC.rawValue }?.sequence ?? 0
            if handled >= recorded { return }
            try await Task.sleep(for: .milliseconds(50))
        }
        Issue.record("the orchestrator did not catch up with the profile events within 30 s")
    }
}
