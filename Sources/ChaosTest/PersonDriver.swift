import Foundation
import Messaging
import OnboardingAPI

/// Where the services answer requests and publish route intents.
public struct ChaosEndpoints: Sendable, Hashable {
    public var authRPC: Endpoint
    public var profileRPC: Endpoint
    public var imageRPC: Endpoint
    public var orchestratorRPC: Endpoint
    public var routes: Endpoint

    public init(
        authRPC: Endpoint = Defaults.authRPC, profileRPC: Endpoint = Defaults.profileRPC,
        imageRPC: Endpoint = Defaults.imageRPC, orchestratorRPC: Endpoint = Defaults.orchestratorRPC,
        routes: Endpoint = Defaults.routes
    ) {
        self.authRPC = authRPC
        self.profileRPC = profileRPC
        self.imageRPC = imageRPC
        self.orchestratorRPC = orchestratorRPC
        self.routes = routes
    }
}

/// The steps of one person's journey.
public enum JourneyStep: String, Sendable, Hashable {
    case signIn = "sign-in"
    case awaitSetUpIntent = "wait for presentProfileSetup"
    case check = "check"
    case signInSecondDevice = "sign-in on the second device"
    case setUp = "set-up"
    case signOut = "sign-out"
    case signInAgain = "sign-in again"
    case withdraw = "withdraw"
    case signOutAtEnd = "sign-out at the end"
}

/// What one person did, and what looked wrong while they did it.
public struct PersonOutcome: Sendable {
    /// Where a person stopped: the step and the error it could not get past.
    public struct Stop: Sendable, Hashable {
        public var step: JourneyStep
        public var error: String
    }

    public var plan: PersonPlan
    public var uid: String?
    /// The profile was created (the set-up was answered with it, or a resend found it).
    public var setUp = false
    /// The profile as the set-up answered it.
    public var profile: Profile?
    /// The withdrawal was answered.
    public var withdrew = false
    /// Set when the person could not finish the journey before their deadline.
    public var stopped: Stop?
    /// Answers that contradict the rules (a new uid on signing in again, a check that does not
    /// see the profile…): each makes the person lost.
    public var problems: [Finding] = []
    /// Oddities that resends explain (a retried sign-in that is no longer new…).
    public var notes: [String] = []
    /// Attempts that failed with a transient error and were sent again.
    public var resends = 0
    /// What the driver did for this person, in order.
    public var deeds: [Deed] = []

    public init(plan: PersonPlan) { self.plan = plan }

    public var finished: Bool { stopped == nil }
    public var timeline: Timeline { Timeline(deeds) }
}

/// Drives one person: sign-in (on one or two devices), set-up, sign-outs, sign-in again,
/// "check me now" (once, or whenever Home would appear), then withdrawal, sign-out or staying
/// signed in.
struct PersonDriver: Sendable {
    let caller: RetryingCaller
    let endpoints: ChaosEndpoints
    /// How long one person may take over the whole journey, resends included.
    let personTimeout: Duration
    /// The image a set-up with an image sends, by person index.
    let image: @Sendable (Int) -> Data
    /// Told just before each set-up is sent (some hangs start right after one).
    var setUpStarted: @Sendable () -> Void = {}

    /// The journey's state between steps.
    private struct Journey {
        var outcome: PersonOutcome
        var random: SeededGenerator
        let deadline: ContinuousClock.Instant
        /// Live sessions by device.
        var sessions: [Int: String] = [:]

        /// Any signed-in device's session (the lowest device first).
        var anySession: (device: Int, token: String)? {
            sessions.keys.sorted().first.map { ($0, sessions[$0]!) }
        }

        mutating func chance(_ share: Double) -> Bool { Double.random(in: 0..<1, using: &random) < share }
    }

    func run(_ plan: PersonPlan) async -> PersonOutcome {
        var journey = Journey(
            outcome: PersonOutcome(plan: plan), random: SeededGenerator(seed: plan.seed),
            deadline: ContinuousClock.now.advanced(by: personTimeout))
        var step = JourneyStep.signIn
        do {
            try await signIn(device: 0, first: true, &journey)
            let firstUID = journey.outcome.uid

            // As an app does: the set-up sheet opens when the system says so. Asking for the intent
            // in force covers an intent sent before this person could have subscribed.
            step = .awaitSetUpIntent
            try await awaitSetUpIntent(device: 0, &journey)
            if plan.checksOften {
                step = .check
                try await check(device: 0, &journey)
            }

            if plan.devices > 1 {
                // A second device signs in while the first is signed in: the same person, no new account.
                step = .signInSecondDevice
                try await signIn(device: 1, first: false, &journey)
                if journey.outcome.uid != firstUID {
                    journey.outcome.problems.append(Finding(
                        .wrongAnswer, "the second device's sign-in gave uid \(journey.outcome.uid ?? "?"), not \(firstUID ?? "?")"))
                }
                if plan.checksOften {
                    step = .check
                    try await check(device: 1, &journey)
                }
            }

            if let username = plan.username {
                step = .setUp
                let device = plan.devices > 1 ? Int(journey.random.next() % 2) : 0
                // An app that checks often asks while the set-up is in flight (Home reappears
                // behind the sheet), from the other device when there is one.
                let racing: Task<Deed?, Never>? =
                    plan.checksOften
                    ? racingCheck(
                        device: plan.devices > 1 ? 1 - device : device, token: journey.sessions[plan.devices > 1 ? 1 - device : device]!,
                        after: .milliseconds(Int(journey.random.next() % 300)), deadline: journey.deadline)
                    : nil
                try await setUp(
                    username: username, image: plan.withImage ? image(plan.index) : nil, token: journey.sessions[device]!,
                    deadline: journey.deadline, outcome: &journey.outcome)
                journey.outcome.deeds.append(.setUp)
                if let deed = await racing?.value { journey.outcome.deeds.append(deed) }
                if plan.checksOften {
                    step = .check
                    try await check(device: device, &journey)
                }
            }

            step = .signOut
            var signedInAgain = false
            if plan.devices > 1 {
                // One device signs out while the other stays: nothing changes for the person.
                let leaving = Int(journey.random.next() % 2)
                try await signOut(device: leaving, &journey)
                if plan.checksOften {
                    step = .check
                    try await check(device: 1 - leaving, &journey)
                }
                if journey.chance(0.5) {
                    // Then the other one too, and the person signs in again on one of them.
                    step = .signOut
                    try await signOut(device: 1 - leaving, racingCheck: plan.checksOften && journey.chance(0.3), &journey)
                    step = .signInAgain
                    try await signIn(device: Int(journey.random.next() % 2), first: false, &journey)
                    signedInAgain = true
                }
            } else {
                try await signOut(device: 0, racingCheck: plan.checksOften && journey.chance(0.3), &journey)
                step = .signInAgain
                try await signIn(device: 0, first: false, &journey)
                signedInAgain = true
            }
            if signedInAgain {
                if journey.outcome.uid != firstUID {
                    journey.outcome.problems.append(Finding(
                        .wrongAnswer, "signing in again gave uid \(journey.outcome.uid ?? "?"), not \(firstUID ?? "?")"))
                }
                if !journey.outcome.setUp {
                    // A returning person without a profile is asked again (a new decision).
                    step = .awaitSetUpIntent
                    try await awaitSetUpIntent(device: journey.anySession!.device, &journey)
                }
            }

            // "Check me now", as every app does when Home appears.
            step = .check
            try await check(device: journey.anySession!.device, &journey)

            if plan.withdraws {
                step = .withdraw
                let (device, token) = journey.anySession!
                try await end(Withdraw(), token: token, deadline: journey.deadline, outcome: &journey.outcome)
                journey.sessions[device] = nil
                journey.outcome.withdrew = true
                journey.outcome.deeds.append(.withdraw)
            } else if plan.endsSignedOut {
                step = .signOutAtEnd
                while let (device, _) = journey.anySession {
                    try await signOut(device: device, &journey)
                }
            }
        } catch {
            journey.outcome.stopped = PersonOutcome.Stop(step: step, error: Self.describe(error))
        }
        return journey.outcome
    }

    /// Signs in on `device` and records its session. The first sign-in must make a new
    /// account; every later one must find it.
    private func signIn(device: Int, first: Bool, _ journey: inout Journey) async throws {
        let plan = journey.outcome.plan
        var log = CallLog()
        let result = try await caller.call(
            SignIn(provider: plan.provider, subject: plan.subject), to: endpoints.authRPC, until: journey.deadline, log: &log)
        journey.outcome.resends += log.failures.count
        journey.outcome.deeds.append(.signIn(device: device, uncertain: log.mayHaveActedBefore))
        journey.sessions[device] = result.sessionToken
        if first {
            journey.outcome.uid = result.uid
            if !result.isNewAccount {
                if log.mayHaveActedBefore {
                    journey.outcome.notes.append("the first sign-in was resent after a timeout and found the account made")
                } else {
                    journey.outcome.problems.append(Finding(.wrongAnswer, "the first sign-in of a new subject said isNewAccount: false"))
                }
            }
        } else {
            if result.isNewAccount {
                journey.outcome.problems.append(Finding(.wrongAnswer, "signing in again (device \(device + 1)) said isNewAccount: true"))
            }
            if let uid = journey.outcome.uid, result.uid != uid {
                journey.outcome.problems.append(Finding(
                    .wrongAnswer, "signing in on device \(device + 1) gave uid \(result.uid), not \(uid)"))
            }
        }
    }

    /// Signs `device` out; with `racingCheck`, a "check me now" from the same device races it
    /// (answered, or refused as unauthenticated once the session has ended).
    private func signOut(device: Int, racingCheck racing: Bool = false, _ journey: inout Journey) async throws {
        let token = journey.sessions[device]!
        let check = racing ? racingCheck(device: device, token: token, after: .zero, deadline: journey.deadline) : nil
        try await end(SignOut(), token: token, deadline: journey.deadline, outcome: &journey.outcome)
        journey.sessions[device] = nil
        if let deed = await check?.value { journey.outcome.deeds.append(deed) }
        journey.outcome.deeds.append(.signOut(device: device))
    }

    /// "Check me now" from `device` while no step is in flight: the answer must agree with what
    /// the driver knows (the profile exists exactly when a set-up was answered).
    private func check(device: Int, _ journey: inout Journey) async throws {
        var log = CallLog()
        let status = try await caller.call(
            CheckOnboarding(), to: endpoints.orchestratorRPC, sessionToken: journey.sessions[device]!,
            until: journey.deadline, log: &log)
        journey.outcome.resends += log.failures.count
        journey.outcome.deeds.append(.check(device: device, hasProfile: status.hasProfile))
        let setUp = journey.outcome.setUp
        if status.hasProfile != setUp {
            journey.outcome.problems.append(Finding(
                .wrongAnswer, "onboarding.check said hasProfile: \(status.hasProfile) \(setUp ? "after" : "without") a set-up"))
        }
        if !status.hasProfile, status.intent != .presentProfileSetup {
            journey.outcome.problems.append(Finding(
                .wrongAnswer, "onboarding.check found no profile but answered intent \(status.intent?.rawValue ?? "none")"))
        }
        if status.hasProfile, let intent = status.intent {
            journey.outcome.problems.append(Finding(.wrongAnswer, "onboarding.check found the profile but answered intent \(intent.rawValue)"))
        }
    }

    /// "Check me now" sent `after` a pause while another step is in flight. Its answer is not
    /// judged (either answer is right while a set-up races it); refusals are recorded too.
    private func racingCheck(
        device: Int, token: String, after pause: Duration, deadline: ContinuousClock.Instant
    ) -> Task<Deed?, Never> {
        Task { [caller, endpoints] in
            do {
                if pause > .zero { try await Task.sleep(for: pause) }
                let status = try await caller.call(
                    CheckOnboarding(), to: endpoints.orchestratorRPC, sessionToken: token, until: deadline)
                return .racingCheck(device: device, answer: "hasProfile \(status.hasProfile)")
            } catch is CancellationError {
                return nil
            } catch {
                return .racingCheck(device: device, answer: Self.describe(error))
            }
        }
    }

    /// Asks `onboarding.intent` until `presentProfileSetup` is in force for the person.
    private func awaitSetUpIntent(device: Int, _ journey: inout Journey) async throws {
        var pause = Duration.milliseconds(20)
        let token = journey.sessions[device]!
        while true {
            let state = try await caller.call(
                CurrentIntent(), to: endpoints.orchestratorRPC, sessionToken: token, until: journey.deadline)
            if let intent = state.intent, intent.intent == .presentProfileSetup {
                journey.outcome.deeds.append(.sawIntent(id: intent.intentId, kind: intent.intent))
                return
            }
            guard ContinuousClock.now.advanced(by: pause) < journey.deadline else {
                throw ServiceError(.timeout, "presentProfileSetup never came into force for this person without a profile")
            }
            try await Task.sleep(for: pause)
            pause = min(pause * 2, .milliseconds(500))
        }
    }

    /// Sets up the profile with one idempotency key for every resend.
    ///
    /// A resend can meet its own earlier attempt: the profile already made (`profileExists`, or
    /// `usernameTaken` from a profile store that checks the name first). Then `profile.get` says
    /// whether that profile is this set-up's.
    private func setUp(
        username: String, image: Data?, token: String, deadline: ContinuousClock.Instant, outcome: inout PersonOutcome
    ) async throws {
        let request = SetUpProfile(
            username: username, contentType: image == nil ? nil : "image/png", idempotencyKey: IdempotencyKey.make())
        var log = CallLog()
        var confirmations = 0
        setUpStarted()
        while true {
            do {
                let result = try await caller.call(
                    request, to: endpoints.orchestratorRPC, sessionToken: token, attachment: image, until: deadline,
                    log: &log)
                outcome.resends += log.failures.count
                guard let profile = result.profile else {
                    throw ServiceError(.invalidMessage, "onboarding.setUpProfile was answered without a profile")
                }
                accept(profile, username: username, withImage: image != nil, outcome: &outcome)
                return
            } catch let error as ServiceError
                where log.resent && (error.code == .profileExists || error.code == .usernameTaken)
            {
                let found = try await caller.call(
                    GetProfile(), to: endpoints.profileRPC, sessionToken: token, until: deadline).profile
                if let found {
                    outcome.resends += log.failures.count
                    outcome.notes.append("a resent set-up was answered \(error.code); profile.get shows it was made")
                    accept(found, username: username, withImage: image != nil, outcome: &outcome)
                    return
                }
                // Not made yet: the earlier attempt may still be running. Ask again shortly.
                confirmations += 1
                let pause = Duration.milliseconds(100 * min(confirmations, 20))
                guard ContinuousClock.now.advanced(by: pause) < deadline else { throw error }
                try await Task.sleep(for: pause)
            }
        }
    }

    private func accept(_ profile: Profile, username: String, withImage: Bool, outcome: inout PersonOutcome) {
        outcome.profile = profile
        outcome.setUp = true
        if profile.username != username {
            outcome.problems.append(Finding(.wrongAnswer, "the set-up made a profile named \(profile.username), not \(username)"))
        }
        if withImage, profile.imagePath == nil {
            outcome.problems.append(Finding(.wrongAnswer, "the set-up carried an image but the profile has no image path"))
        }
        if !withImage, let path = profile.imagePath {
            outcome.problems.append(Finding(.wrongAnswer, "the set-up carried no image but the profile has image path \(path)"))
        }
    }

    /// Signs out or withdraws. auth answers a resend as it answered the first attempt (it keeps
    /// ended sessions for 24 hours), so `unauthenticated` after a resend is a wrong answer.
    private func end<Request: APIRequest>(
        _ request: Request, token: String, deadline: ContinuousClock.Instant, outcome: inout PersonOutcome
    ) async throws {
        var log = CallLog()
        do {
            _ = try await caller.call(request, to: endpoints.authRPC, sessionToken: token, until: deadline, log: &log)
        } catch let error as ServiceError where error.code == .unauthenticated && log.mayHaveActedBefore {
            outcome.problems.append(Finding(
                .wrongAnswer, "a resent \(Request.type) was answered unauthenticated, not as the first attempt"))
        }
        outcome.resends += log.failures.count
    }

    static func describe(_ error: any Error) -> String {
        if let error = error as? ServiceError { return error.description }
        if error is CancellationError { return "cancelled" }
        return "\(error)"
    }
}
