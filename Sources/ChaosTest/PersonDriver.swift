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
    case setUp = "set-up"
    case signOut = "sign-out"
    case signInAgain = "sign-in again"
    case check = "check"
    case withdraw = "withdraw"
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

    public init(plan: PersonPlan) { self.plan = plan }

    public var finished: Bool { stopped == nil }
}

/// Drives one person through sign-in, set-up, sign-out, sign-in again, check and withdrawal.
struct PersonDriver: Sendable {
    let caller: RetryingCaller
    let endpoints: ChaosEndpoints
    /// How long one person may take over the whole journey, resends included.
    let personTimeout: Duration
    /// The image a set-up with an image sends, by person index.
    let image: @Sendable (Int) -> Data

    func run(_ plan: PersonPlan) async -> PersonOutcome {
        var outcome = PersonOutcome(plan: plan)
        let deadline = ContinuousClock.now.advanced(by: personTimeout)
        var step = JourneyStep.signIn
        do {
            var log = CallLog()
            let first = try await caller.call(
                SignIn(provider: plan.provider, subject: plan.subject), to: endpoints.authRPC, until: deadline, log: &log)
            outcome.resends += log.failures.count
            outcome.uid = first.uid
            if !first.isNewAccount {
                if log.mayHaveActedBefore {
                    outcome.notes.append("the first sign-in was resent after a timeout and found the account made")
                } else {
                    outcome.problems.append(Finding(.wrongAnswer, "the first sign-in of a new subject said isNewAccount: false"))
                }
            }

            // As an app does: the set-up sheet opens when the system says so. Asking for the intent
            // in force covers an intent sent before this person could have subscribed.
            step = .awaitSetUpIntent
            try await awaitSetUpIntent(token: first.sessionToken, deadline: deadline)

            if let username = plan.username {
                step = .setUp
                try await setUp(
                    username: username, image: plan.withImage ? image(plan.index) : nil, token: first.sessionToken,
                    deadline: deadline, outcome: &outcome)
            }

            step = .signOut
            try await end(SignOut(), token: first.sessionToken, deadline: deadline, outcome: &outcome)

            step = .signInAgain
            log = CallLog()
            let again = try await caller.call(
                SignIn(provider: plan.provider, subject: plan.subject), to: endpoints.authRPC, until: deadline, log: &log)
            outcome.resends += log.failures.count
            if again.uid != first.uid {
                outcome.problems.append(Finding(.wrongAnswer, "signing in again gave uid \(again.uid), not \(first.uid)"))
            }
            if again.isNewAccount {
                outcome.problems.append(Finding(.wrongAnswer, "signing in again said isNewAccount: true"))
            }

            step = .check
            log = CallLog()
            let status = try await caller.call(
                CheckOnboarding(), to: endpoints.orchestratorRPC, sessionToken: again.sessionToken, until: deadline,
                log: &log)
            outcome.resends += log.failures.count
            if status.hasProfile != outcome.setUp {
                outcome.problems.append(Finding(
                    .wrongAnswer,
                    "onboarding.check said hasProfile: \(status.hasProfile) \(outcome.setUp ? "after" : "without") a set-up"))
            }
            if !status.hasProfile, status.intent != .presentProfileSetup {
                outcome.problems.append(Finding(
                    .wrongAnswer, "onboarding.check found no profile but answered intent \(status.intent?.rawValue ?? "none")"))
            }

            if plan.withdraws {
                step = .withdraw
                try await end(Withdraw(), token: again.sessionToken, deadline: deadline, outcome: &outcome)
                outcome.withdrew = true
            }
        } catch {
            outcome.stopped = PersonOutcome.Stop(step: step, error: Self.describe(error))
        }
        return outcome
    }

    /// Asks `onboarding.intent` until `presentProfileSetup` is in force for the person.
    private func awaitSetUpIntent(token: String, deadline: ContinuousClock.Instant) async throws {
        var pause = Duration.milliseconds(20)
        while true {
            let state = try await caller.call(CurrentIntent(), to: endpoints.orchestratorRPC, sessionToken: token, until: deadline)
            if state.intent?.intent == .presentProfileSetup { return }
            guard ContinuousClock.now.advanced(by: pause) < deadline else {
                throw ServiceError(.timeout, "presentProfileSetup never came into force for this new account")
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
