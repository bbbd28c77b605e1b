import Messaging
import OnboardingAPI
import PropertyBased
import Testing

@testable import OnboardingOrchestrator

/// One person, the truth about them (auth's sessions, the profile store and its sequence), the
/// ways news about them travels to the orchestrator, and the orchestrator's state machine with
/// what the orchestrator stores of it.
///
/// Steps are chosen by the property test: the person signs in and out, sets up, deletes and
/// withdraws; other people's changes move the store's sequence; and every channel delivers
/// whenever the test says: auth's and profile's events in their publisher's order (as the event
/// feed does), check answers and set-up results in any order and more than once, failures,
/// timers, clean-ups, and restarts of the orchestrator from what it stored.
struct InterleavingWorld {
    typealias Machine = OnboardingStateMachine
    typealias Input = Machine.Input

    let uid = "p"
    private(set) var machine = Machine()
    /// What the orchestrator stored of the person after its last batch.
    private(set) var stored: Machine.PersistedPerson?

    // The truth.
    private(set) var hasAccount = false
    private(set) var sessions = 0
    private(set) var withdrawn = false
    private(set) var profileExists = false
    /// The store's newest sequence, and the one of the event that last changed this profile.
    private(set) var head: UInt64 = 0
    private var profileSequence: UInt64 = 0

    // The channels.
    private var authEvents: [Input] = []
    private var profileEvents: [Input] = []
    private var calls: [Machine.CheckID] = []
    private var retries: [Machine.CheckID] = []
    private var cleanups: [Machine.CleanupStep] = []
    /// Check answers and set-up results on their way, delivered in any order.
    private var inFlight: [Input] = []
    /// Answers and results already delivered once, to deliver again.
    private var delivered: [Input] = []
    private var nextWaiter: Machine.WaiterID = 0

    /// Every intent emitted, in order.
    private(set) var emitted: [RouteIntent] = []
    private var seenIDs: [String: RouteIntent.Kind] = [:]
    private(set) var violations: [String] = []

    static let stepKinds = 16

    /// Carries out step `code` (its kind is `code % stepKinds`, the rest picks among choices).
    mutating func step(_ code: Int) {
        let pick = code / Self.stepKinds
        switch code % Self.stepKinds {
        case 0:  // sign in
            guard !withdrawn else { return }
            sessions += 1
            // Auth counts the live sessions in the sign-in's transaction; an older auth does not.
            authEvents.append(.signedIn(uid: uid, isNewAccount: !hasAccount, sessions: pick % 4 == 3 ? nil : sessions))
            hasAccount = true
        case 1:  // sign out
            guard sessions > 0 else { return }
            sessions -= 1
            authEvents.append(.signedOut(uid: uid, sessions: pick % 4 == 3 ? nil : sessions))
        case 2:  // withdraw
            guard hasAccount, !withdrawn else { return }
            withdrawn = true
            sessions = 0
            authEvents.append(.withdrawn(uid: uid))
        case 3:  // auth's feed delivers its next event
            guard !authEvents.isEmpty else { return }
            feed(authEvents.removeFirst())
        case 4:  // profile's feed delivers its next event
            guard !profileEvents.isEmpty else { return }
            feed(profileEvents.removeFirst())
        case 5:  // a set-up creates the profile (also racing a withdrawal)
            guard hasAccount, !profileExists else { return }
            let sequence = change(exists: true)
            profileEvents.append(.profileCreated(uid: uid, asOf: sequence))
            inFlight.append(.profileCreated(uid: uid, asOf: sequence))
        case 6:  // the person deletes the profile
            guard profileExists, !withdrawn, sessions > 0 else { return }
            profileEvents.append(.profileDeleted(uid: uid, reason: .request, asOf: change(exists: false)))
        case 7:  // "check me now"
            guard sessions > 0 else { return }
            nextWaiter += 1
            feed(.checkRequested(uid: uid, waiter: nextWaiter))
        case 8:  // the store answers a check (the answer is now on its way)
            guard !calls.isEmpty else { return }
            let check = calls.remove(at: pick % calls.count)
            inFlight.append(
                .profileChecked(uid: uid, check: check, exists: profileExists, asOf: profileExists ? profileSequence : head))
        case 9:  // a check call fails
            guard !calls.isEmpty else { return }
            let check = calls.remove(at: pick % calls.count)
            feed(.profileCheckFailed(uid: uid, check: check, error: ServiceError(.timeout, "hung")))
        case 10:  // a retry's backoff ends
            guard !retries.isEmpty else { return }
            feed(.checkRetryDue(uid: uid, check: retries.remove(at: pick % retries.count)))
        case 11:  // an answer or a set-up result arrives, in any order
            guard !inFlight.isEmpty else { return }
            let input = inFlight.remove(at: pick % inFlight.count)
            delivered.append(input)
            feed(input)
        case 12:  // one arrives a second time
            guard !delivered.isEmpty else { return }
            feed(delivered[pick % delivered.count])
        case 13:  // someone else's change moves the store's sequence
            head += 1
        case 14:  // a withdrawal's clean-up step is carried out
            guard !cleanups.isEmpty else { return }
            let step = cleanups.removeFirst()
            if step == .deleteProfile, profileExists {
                profileEvents.append(.profileDeleted(uid: uid, reason: .withdrawal, asOf: change(exists: false)))
            }
            feed(.cleanupFinished(uid: uid, step: step))
        default:  // the orchestrator restarts from what it stored
            restart(keepingCheckNumbers: pick % 2 == 0)
        }
    }

    /// Delivers everything still on its way, answering every check, until nothing is left.
    mutating func settle() {
        for _ in 0..<10_000 {
            if !authEvents.isEmpty { feed(authEvents.removeFirst()) }
            else if !profileEvents.isEmpty { feed(profileEvents.removeFirst()) }
            else if !inFlight.isEmpty { step(11) }
            else if !calls.isEmpty { step(8) }
            else if !retries.isEmpty { step(10) }
            else if !cleanups.isEmpty { step(14) }
            else { return }
        }
        violations.append("news kept coming after 10,000 deliveries")
    }

    /// What must hold once everything has been delivered.
    func checkSettled() -> [String] {
        var problems = violations
        let inForce = machine.isTracking(uid) ? machine.intentInForce(of: uid) : stored?.intent
        if withdrawn {
            if inForce != nil { problems.append("withdrawn, yet \(inForce!.intent) is in force") }
            return problems
        }
        if sessions > 0 {
            let expected: RouteIntent.Kind? = profileExists ? nil : .presentProfileSetup
            if profileExists ? inForce?.intent == .presentProfileSetup : inForce?.intent != expected {
                problems.append(
                    "signed in, profile \(profileExists ? "exists" : "missing"), but in force: \(inForce?.intent.rawValue ?? "nothing")")
            }
        } else if inForce?.intent == .presentProfileSetup {
            problems.append("signed out, yet presentProfileSetup is in force")
        }
        return problems
    }

    private mutating func change(exists: Bool) -> UInt64 {
        head += 1
        profileExists = exists
        profileSequence = head
        return head
    }

    private mutating func restart(keepingCheckNumbers: Bool) {
        if keepingCheckNumbers {
            // A rolled-back batch: the machine starts again from the store in the same process;
            // answers to checks asked before are still on their way.
            machine.reset()
        } else {
            // A new process: calls in flight and their answers die with the old one, and an
            // unfinished set-up is settled by reading the profile again.
            machine = Machine()
            calls = []
            retries = []
            let setUps = inFlight.filter { if case .profileCreated = $0 { true } else { false } }
            inFlight = setUps.isEmpty || !profileExists ? [] : [.profileCreated(uid: uid, asOf: profileSequence)]
            delivered = []
        }
        cleanups = []
        if let stored { perform(machine.restore(uid: uid, stored), before: stored.intent) }
    }

    /// Hands `input` to the machine as the orchestrator does: a person it does not hold is
    /// restored from the store first; what it decided is stored after the input.
    private mutating func feed(_ input: Input) {
        if !machine.isTracking(uid), let stored {
            perform(machine.restore(uid: uid, stored), before: stored.intent)
        }
        let before = machine.intentInForce(of: uid)
        perform(machine.handle(input), before: before)
        if let changed = machine.takeChanges()[uid] { stored = changed }
    }

    private mutating func perform(_ actions: [Machine.Action], before: RouteIntent?) {
        var inForce = before
        for action in actions {
            switch action {
            case .emit(let intent):
                if let kind = seenIDs[intent.intentId] {
                    if intent.intentId != inForce?.intentId || kind != intent.intent {
                        violations.append("intent \(intent.intentId) emitted again, but it is not the one in force")
                    }
                } else if inForce?.intent == intent.intent {
                    violations.append("a second \(intent.intent) with a new id while \(inForce!.intentId) is in force")
                }
                seenIDs[intent.intentId] = intent.intent
                emitted.append(intent)
                inForce = intent
            case .checkProfile(_, let check): calls.append(check)
            case .retryCheck(_, let check, _, _, _): retries.append(check)
            case .cleanUp(_, let step): cleanups.append(step)
            case .answer, .answerFailure, .evictProfileCache, .retryCleanup: break
            }
        }
    }
}

@Suite("The onboarding decisions over random interleavings")
struct OnboardingInterleavingTests {
    /// Up to 120 steps, each a kind and a choice among what is on its way.
    static let steps = Gen.int(in: 0...(InterleavingWorld.stepKinds * 8 - 1)).array(of: 1...120)

    /// The world after `steps`, once everything on its way has arrived.
    static func settled(after steps: [Int]) -> InterleavingWorld {
        var world = InterleavingWorld()
        for code in steps { world.step(code) }
        world.settle()
        return world
    }

    @Test("once everything has arrived, the intent in force agrees with the stores, however it arrived")
    func intentInForceAgreesWithTheStores() async {
        await propertyCheck(count: 3_000, input: Self.steps) { steps in
            let world = Self.settled(after: steps)
            let problems = world.checkSettled()
            #expect(problems.isEmpty, "\(problems) after \(world.emitted.map { "\($0.intent.rawValue) \($0.intentId.prefix(8))" })")
        }
    }

    @Test("a new intentId only when the intent in force changes; dismiss only after presentProfileSetup")
    func noDecisionTwice() async {
        await propertyCheck(count: 3_000, input: Self.steps) { steps in
            let world = Self.settled(after: steps)
            #expect(world.violations.isEmpty, "\(world.violations)")
            // New decisions alternate between asking and dismissing, with sign-outs in between.
            var lastNew: RouteIntent.Kind?
            var seen: Set<String> = []
            for intent in world.emitted where seen.insert(intent.intentId).inserted {
                if intent.intent == .dismiss {
                    #expect(lastNew == .presentProfileSetup, "a dismiss that answers no presentProfileSetup")
                }
                lastNew = intent.intent
            }
        }
    }
}
