import Messaging
import OnboardingAPI

/// The orchestrator's decisions, as a value: feed it what happened, get back what to do.
///
/// It never performs I/O; ``OnboardingOrchestrator`` carries out the actions and feeds their
/// outcomes back in. Its rules come from `shared/domain.md`:
/// - signed in, or "check me now": ask the profile store; no profile → `presentProfileSetup`;
///   a profile → nothing. A failed check is retried with backoff and never decides on a guess.
///   A *new* account needs no question: its uid was minted by this very sign-in, so no profile
///   can exist for it yet, and `presentProfileSetup` goes out at once (the hot path of sign-up).
/// - profile created → `dismiss` (once, however many times it is reported); profile deleted
///   while the account stays → `presentProfileSetup`.
/// - signed out → forget what is known of the profile and clear the cached copy; withdrawn →
///   delete the profile and every image, retrying each until it is done. A withdrawn person is
///   remembered (uids are never reused): a profile that a set-up racing the withdrawal creates
///   afterwards is cleaned up too, and nothing is ever emitted to them again.
///
/// A check's answer that arrives after a profile event has overtaken it is ignored, so a stale
/// "no profile" can never follow a `dismiss`.
///
/// **Durability.** What must outlive a crash is ``PersistedPerson``: the machine records the
/// state of every person an input touched, and the orchestrator takes those records with
/// ``takeChanges()`` and stores them in the same transaction as the input's other effects. After
/// a restart ``restore(uid:_:)`` puts a stored person back and resumes their unfinished work.
public struct OnboardingStateMachine: Sendable {
    public typealias CheckID = UInt64
    public typealias WaiterID = UInt64

    /// What the orchestrator has learnt.
    public enum Input: Sendable, Hashable {
        /// `isNewAccount`: auth created the account with this sign-in.
        case signedIn(uid: String, isNewAccount: Bool)
        /// "Check me now"; `waiter` is answered with the decision.
        case checkRequested(uid: String, waiter: WaiterID)
        case profileChecked(uid: String, check: CheckID, exists: Bool)
        case profileCheckFailed(uid: String, check: CheckID, error: ServiceError)
        case checkRetryDue(uid: String, check: CheckID)
        case profileCreated(uid: String)
        case profileDeleted(uid: String, reason: DeletionReason)
        case signedOut(uid: String)
        case withdrawn(uid: String)
        case cleanupFinished(uid: String, step: CleanupStep)
        case cleanupFailed(uid: String, step: CleanupStep, error: ServiceError)
        case cleanupRetryDue(uid: String, step: CleanupStep)
    }

    /// What the orchestrator must do.
    public enum Action: Sendable, Hashable {
        /// Ask the profile store whether `uid` has a profile; report with `profileChecked` or
        /// `profileCheckFailed`.
        case checkProfile(uid: String, check: CheckID)
        /// Feed `checkRetryDue` back after `delay`.
        case retryCheck(uid: String, check: CheckID, delay: Duration, attempt: Int, error: ServiceError)
        /// Publish a route intent to `uid`.
        case emit(RouteIntent.Kind, uid: String, reason: RouteIntent.Reason)
        case answer(waiter: WaiterID, OnboardingStatus)
        case answerFailure(waiter: WaiterID, ServiceError)
        /// Tell the profile store to forget its cached copy of `uid`'s profile.
        case evictProfileCache(uid: String)
        /// Carry out one step of a withdrawal's clean-up; report with `cleanupFinished` or
        /// `cleanupFailed`.
        case cleanUp(uid: String, step: CleanupStep)
        /// Feed `cleanupRetryDue` back after `delay`.
        case retryCleanup(uid: String, step: CleanupStep, delay: Duration, attempt: Int, error: ServiceError)
    }

    /// The parts of a withdrawal's clean-up.
    public enum CleanupStep: String, Sendable, Hashable, CaseIterable {
        case deleteProfile
        case deleteImages
    }

    /// What is known of a person's profile.
    public enum ProfileKnowledge: Sendable, Hashable {
        case unknown, present, absent
    }

    struct PendingCheck: Sendable, Hashable {
        var id: CheckID
        var attempt: Int
        var reason: RouteIntent.Reason
        var waiters: [WaiterID]
        /// `false` while waiting out the backoff before the next attempt.
        var inFlight = true
    }

    struct Person: Sendable, Hashable {
        var profile: ProfileKnowledge = .unknown
        var check: PendingCheck?
        var withdrawn = false
        /// Clean-up steps still to finish after a withdrawal, with their attempts so far.
        var cleanup: [CleanupStep: Int] = [:]
    }

    /// What the orchestrator stores of a person: enough to resume their unfinished work and to
    /// never emit a second `dismiss` for one profile.
    public struct PersistedPerson: Sendable, Hashable {
        public var profile: ProfileKnowledge
        /// Why a profile check is under way, when one is.
        public var pendingCheck: RouteIntent.Reason?
        public var withdrawn: Bool
        /// Clean-up steps not yet done.
        public var cleanup: Set<CleanupStep>

        public init(
            profile: ProfileKnowledge = .unknown, pendingCheck: RouteIntent.Reason? = nil, withdrawn: Bool = false,
            cleanup: Set<CleanupStep> = []
        ) {
            self.profile = profile
            self.pendingCheck = pendingCheck
            self.withdrawn = withdrawn
            self.cleanup = cleanup
        }

        init(_ person: Person) {
            self.init(
                profile: person.profile, pendingCheck: person.check?.reason, withdrawn: person.withdrawn,
                cleanup: Set(person.cleanup.keys))
        }
    }

    public var retryPolicy: RetryPolicy
    /// How many people the machine keeps state for. Past it, people with nothing under way are
    /// forgotten (what is known of their profile is asked again when needed).
    public var capacity: Int
    private(set) var people: [String: Person] = [:]
    private var nextCheckID: CheckID = 0
    /// Inputs since the last sweep: over capacity, a sweep runs once per tenth of the capacity
    /// in inputs, so one that cannot free enough (everyone has work under way) is not redone
    /// on every input.
    private var inputsSinceSweep = 0
    /// The state of every person touched since the last ``takeChanges()``.
    private var changes: [String: PersistedPerson] = [:]

    public init(retryPolicy: RetryPolicy = RetryPolicy(), capacity: Int = 100_000) {
        self.retryPolicy = retryPolicy
        self.capacity = max(1, capacity)
    }

    /// What is known of `uid`'s profile.
    public func profileKnowledge(of uid: String) -> ProfileKnowledge {
        people[uid]?.profile ?? .unknown
    }

    /// How many people the machine holds state for.
    public var trackedPeople: Int { people.count }

    /// Whether the machine holds state for `uid` (if not, the orchestrator restores what it
    /// stored before handing it an input about them).
    public func isTracking(_ uid: String) -> Bool { people[uid] != nil }

    /// The people touched since the last call, as they now are, to be stored.
    public mutating func takeChanges() -> [String: PersistedPerson] {
        defer { changes = [:] }
        return changes
    }

    /// Puts a stored person back, and resumes the work they had under way: a profile check
    /// (asked again) and the clean-up steps of a withdrawal. A person the machine already holds
    /// is left as they are (memory is newer than the store).
    public mutating func restore(uid: String, _ stored: PersistedPerson) -> [Action] {
        guard people[uid] == nil else { return [] }
        var person = Person(profile: stored.profile, withdrawn: stored.withdrawn)
        var actions: [Action] = []
        if stored.withdrawn {
            person.cleanup = Dictionary(uniqueKeysWithValues: stored.cleanup.map { ($0, 0) })
            actions = CleanupStep.allCases.filter(stored.cleanup.contains).map { .cleanUp(uid: uid, step: $0) }
        } else if let reason = stored.pendingCheck {
            nextCheckID += 1
            person.check = PendingCheck(id: nextCheckID, attempt: 1, reason: reason, waiters: [])
            actions = [.checkProfile(uid: uid, check: nextCheckID)]
        }
        people[uid] = person
        return actions
    }

    public mutating func handle(_ input: Input) -> [Action] {
        defer {
            if let person = people[input.uid] { changes[input.uid] = PersistedPerson(person) }
            inputsSinceSweep += 1
            if people.count > capacity, inputsSinceSweep >= max(1, capacity / 10) { forgetIdlePeople() }
        }
        switch input {
        case .signedIn(let uid, let isNewAccount):
            if isNewAccount, people[uid] == nil {
                people[uid] = Person(profile: .absent)
                return [.emit(.presentProfileSetup, uid: uid, reason: .signedIn)]
            }
            return startCheck(uid: uid, reason: .signedIn, waiter: nil)

        case .checkRequested(let uid, let waiter):
            return startCheck(uid: uid, reason: .checkRequested, waiter: waiter)

        case .profileChecked(let uid, let check, let exists):
            guard var person = people[uid], let pending = person.check, pending.id == check else { return [] }
            person.check = nil
            person.profile = exists ? .present : .absent
            people[uid] = person
            let status = OnboardingStatus(uid: uid, hasProfile: exists, intent: exists ? nil : .presentProfileSetup)
            var actions: [Action] = exists ? [] : [.emit(.presentProfileSetup, uid: uid, reason: pending.reason)]
            actions += pending.waiters.map { .answer(waiter: $0, status) }
            return actions

        case .profileCheckFailed(let uid, let check, let error):
            guard var person = people[uid], var pending = person.check, pending.id == check else { return [] }
            let waiters = pending.waiters
            pending.waiters = []
            pending.attempt += 1
            pending.inFlight = false
            person.check = pending
            people[uid] = person
            return waiters.map { .answerFailure(waiter: $0, Self.checkFailing) }
                + [.retryCheck(uid: uid, check: check, delay: retryPolicy.delay(attempt: pending.attempt - 1), attempt: pending.attempt - 1, error: error)]

        case .checkRetryDue(let uid, let check):
            guard var person = people[uid], var pending = person.check, pending.id == check else { return [] }
            pending.inFlight = true
            person.check = pending
            people[uid] = person
            return [.checkProfile(uid: uid, check: check)]

        case .profileCreated(let uid):
            var person = people[uid] ?? Person()
            if person.withdrawn {
                // A set-up that raced the withdrawal created it after the clean-up: clean up again.
                let steps = CleanupStep.allCases.filter { person.cleanup[$0] == nil }
                for step in steps { person.cleanup[step] = 0 }
                people[uid] = person
                return steps.map { .cleanUp(uid: uid, step: $0) }
            }
            let wasPresent = person.profile == .present
            let waiters = person.check?.waiters ?? []
            person.profile = .present
            person.check = nil
            people[uid] = person
            let status = OnboardingStatus(uid: uid, hasProfile: true, intent: nil)
            return (wasPresent ? [] : [.emit(.dismiss, uid: uid, reason: .profileCreated)])
                + waiters.map { .answer(waiter: $0, status) }

        case .profileDeleted(let uid, let reason):
            guard reason == .request, var person = people[uid] ?? Person?.some(Person()), !person.withdrawn else {
                return []
            }
            let waiters = person.check?.waiters ?? []
            person.profile = .absent
            person.check = nil
            people[uid] = person
            let status = OnboardingStatus(uid: uid, hasProfile: false, intent: .presentProfileSetup)
            return [.emit(.presentProfileSetup, uid: uid, reason: .profileDeleted)]
                + waiters.map { .answer(waiter: $0, status) }

        case .signedOut(let uid):
            // Forget what was known, as the cache does; the next sign-in asks again. A check
            // under way goes on: its callers were signed in when they asked (perhaps with another
            // session of the same person, signed in again before this event arrived).
            if var person = people[uid], !person.withdrawn, person.check == nil {
                person.profile = .unknown
                people[uid] = person
            }
            return [.evictProfileCache(uid: uid)]

        case .withdrawn(let uid):
            let person = people[uid]
            guard person?.withdrawn != true else { return [] }
            people[uid] = Person(profile: .unknown, check: nil, withdrawn: true, cleanup: [.deleteProfile: 0, .deleteImages: 0])
            let failure = ServiceError(.unauthenticated, "This account has been withdrawn.")
            return (person?.check?.waiters ?? []).map { .answerFailure(waiter: $0, failure) }
                + CleanupStep.allCases.map { .cleanUp(uid: uid, step: $0) }

        case .cleanupFinished(let uid, let step):
            guard var person = people[uid], person.cleanup[step] != nil else { return [] }
            person.cleanup[step] = nil
            people[uid] = person
            return []

        case .cleanupFailed(let uid, let step, let error):
            guard var person = people[uid], let attempts = person.cleanup[step] else { return [] }
            person.cleanup[step] = attempts + 1
            people[uid] = person
            return [.retryCleanup(uid: uid, step: step, delay: retryPolicy.delay(attempt: attempts), attempt: attempts + 1, error: error)]

        case .cleanupRetryDue(let uid, let step):
            guard people[uid]?.cleanup[step] != nil else { return [] }
            return [.cleanUp(uid: uid, step: step)]
        }
    }

    /// What a caller is told while the profile store cannot be asked.
    static let checkFailing = ServiceError(
        .dependencyUnavailable,
        "The profile store did not answer; the check is being retried and its answer will arrive on your route topic.",
        reason: "profile")

    /// Forgets everyone, as after a failure to store what was decided: the orchestrator then
    /// restores people from the store. Check numbers keep growing, so an answer to a check asked
    /// before is never taken for one asked after.
    public mutating func reset() {
        people = [:]
        changes = [:]
        inputsSinceSweep = 0
    }

    /// Forgets people with nothing under way until a tenth of the capacity is free. People
    /// changed since the last ``takeChanges()`` are kept: their state is not stored yet.
    private mutating func forgetIdlePeople() {
        let target = capacity - capacity / 10
        for (uid, person) in people where person.check == nil && person.cleanup.isEmpty && changes[uid] == nil {
            people[uid] = nil
            if people.count <= target { break }
        }
        inputsSinceSweep = 0
    }

    private mutating func startCheck(uid: String, reason: RouteIntent.Reason, waiter: WaiterID?) -> [Action] {
        var person = people[uid] ?? Person()
        if person.withdrawn {
            return waiter.map { [.answerFailure(waiter: $0, ServiceError(.unauthenticated, "This account has been withdrawn."))] } ?? []
        }
        if var pending = person.check {
            if !pending.inFlight, let waiter {
                // The store is failing and the next attempt waits out its backoff: say so now
                // rather than keep the caller waiting; the answer will go out on the route topic.
                return [.answerFailure(waiter: waiter, Self.checkFailing)]
            }
            // A check is under way: its answer serves this request too.
            if let waiter { pending.waiters.append(waiter) }
            pending.reason = reason
            person.check = pending
            people[uid] = person
            return []
        }
        nextCheckID += 1
        person.check = PendingCheck(id: nextCheckID, attempt: 1, reason: reason, waiters: waiter.map { [$0] } ?? [])
        people[uid] = person
        return [.checkProfile(uid: uid, check: nextCheckID)]
    }
}


extension OnboardingStateMachine.Input {
    /// The person the input is about.
    public var uid: String {
        switch self {
        case .signedIn(let uid, _), .checkRequested(let uid, _), .profileChecked(let uid, _, _),
            .profileCheckFailed(let uid, _, _), .checkRetryDue(let uid, _), .profileCreated(let uid),
            .profileDeleted(let uid, _), .signedOut(let uid), .withdrawn(let uid), .cleanupFinished(let uid, _),
            .cleanupFailed(let uid, _, _), .cleanupRetryDue(let uid, _):
            return uid
        }
    }
}

