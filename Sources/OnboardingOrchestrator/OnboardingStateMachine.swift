import Foundation
import Messaging
import OnboardingAPI

/// The orchestrator's decisions, as a value: feed it what happened, get back what to do.
///
/// It never performs I/O; ``OnboardingOrchestrator`` carries out the actions and feeds their
/// outcomes back in. Its rules come from `shared/domain.md`.
///
/// **Decisions follow from state, not from the order news arrives.** Every input is only
/// information: a sign-in or sign-out, a check's answer, a profile event, a set-up's own result.
/// After each one the machine derives the intent that should be in force and emits one only
/// when that differs from the intent in force:
/// - the person is signed in (auth's newest sign-in or sign-out event about them counts a live
///   session) and the newest known profile state is "none" → `presentProfileSetup`;
/// - a profile exists, and the person was asked to set one up since they last had one
///   (``Person/owesDismiss``) → `dismiss`;
/// - otherwise the intent in force stays as it is.
///
/// Profile information is ordered by the profile store's own event sequence, never by arrival:
/// each fact carries the sequence it is as new as (an event's `sequence`, a reply's
/// ``ProfileResult/asOfSequence``), and a fact older than what is known is ignored. So a stale
/// "no profile" can never undo a newer "created", a late "created" is recognised as old, and
/// answers, events and a set-up's result may arrive late, twice or in any order.
///
/// Other rules:
/// - signed in, or "check me now": ask the profile store. A failed check is retried with
///   backoff and never decides on a guess. A *new* account needs no question: its uid was minted
///   by this very sign-in, so "no profile" is known (as of sequence 0, older than any event).
/// - a check that confirms the intent in force publishes it again with the same `intentId`
///   (the app that asked sees it; one that already acted on it can tell it is a repeat).
/// - signed out → the profile cache is cleared. When that was the person's last session, what
///   was known of the profile is forgotten (its sequence is kept, so older news stays old) and
///   nothing is in force until the next decision, which therefore goes out with a new
///   `intentId`. Auth counts the live sessions in each sign-in's and sign-out's own transaction
///   and its events arrive in its order, so the newest count is the truth as of that event.
/// - withdrawn → delete the profile and every image, retrying each until it is done. A
///   withdrawn person is remembered (uids are never reused): a profile that a set-up racing the
///   withdrawal creates afterwards is cleaned up too, and nothing is ever emitted to them again.
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
        /// `isNewAccount`: auth created the account with this sign-in. `sessions`: the person's
        /// live sessions after it, as auth counted them (`nil` from an auth that does not count:
        /// one more than before).
        case signedIn(uid: String, isNewAccount: Bool, sessions: Int? = nil)
        /// "Check me now"; `waiter` is answered with the decision.
        case checkRequested(uid: String, waiter: WaiterID)
        /// The profile store's answer to check `check`, as new as its sequence `asOf` (`nil` from a
        /// store that does not number its answers: taken as it comes).
        case profileChecked(uid: String, check: CheckID, exists: Bool, asOf: UInt64?)
        case profileCheckFailed(uid: String, check: CheckID, error: ServiceError)
        case checkRetryDue(uid: String, check: CheckID)
        /// A profile exists as of sequence `asOf`: a `profile.created` event, or a set-up's own
        /// result (`nil`: not numbered, taken as it comes).
        case profileCreated(uid: String, asOf: UInt64?)
        /// A `profile.updated` event: a profile exists as of sequence `asOf`.
        case profileUpdated(uid: String, asOf: UInt64?)
        /// A `profile.deleted` event with its sequence.
        case profileDeleted(uid: String, reason: DeletionReason, asOf: UInt64)
        /// `sessions`: the person's live sessions after it, as auth counted them (`nil`: one fewer).
        case signedOut(uid: String, sessions: Int? = nil)
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
        /// Publish a route intent (new, or the one in force again with its own `intentId`) and
        /// record it as the one in force.
        case emit(RouteIntent)
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
        /// The profile store's sequence that what is known is as new as; facts older than it
        /// are ignored. Kept when the knowledge itself is forgotten (sign-out).
        var profileAsOf: UInt64 = 0
        /// Live sessions, as auth's newest event about the person counted them.
        var sessions = 0
        /// The intent in force: the last one emitted, unless a sign-out or withdrawal ended it.
        var intent: RouteIntent?
        /// `presentProfileSetup` went out and no `dismiss` since: a profile that appears is
        /// answered with `dismiss`, even after a sign-out (another device may still show the sheet).
        var owesDismiss = false
        var check: PendingCheck?
        var withdrawn = false
        /// Clean-up steps still to finish after a withdrawal, with their attempts so far.
        var cleanup: [CleanupStep: Int] = [:]
    }

    /// What the orchestrator stores of a person: enough to resume their unfinished work, to
    /// answer `onboarding.intent`, and to never repeat a decision with a new `intentId`.
    public struct PersistedPerson: Sendable, Hashable {
        public var profile: ProfileKnowledge
        public var profileAsOf: UInt64
        public var sessions: Int
        public var intent: RouteIntent?
        public var owesDismiss: Bool
        /// Why a profile check is under way, when one is.
        public var pendingCheck: RouteIntent.Reason?
        public var withdrawn: Bool
        /// Clean-up steps not yet done.
        public var cleanup: Set<CleanupStep>

        public init(
            profile: ProfileKnowledge = .unknown, profileAsOf: UInt64 = 0, sessions: Int = 0, intent: RouteIntent? = nil,
            owesDismiss: Bool = false, pendingCheck: RouteIntent.Reason? = nil, withdrawn: Bool = false,
            cleanup: Set<CleanupStep> = []
        ) {
            self.profile = profile
            self.profileAsOf = profileAsOf
            self.sessions = sessions
            self.intent = intent
            self.owesDismiss = owesDismiss
            self.pendingCheck = pendingCheck
            self.withdrawn = withdrawn
            self.cleanup = cleanup
        }

        init(_ person: Person) {
            self.init(
                profile: person.profile, profileAsOf: person.profileAsOf, sessions: person.sessions, intent: person.intent,
                owesDismiss: person.owesDismiss, pendingCheck: person.check?.reason, withdrawn: person.withdrawn,
                cleanup: Set(person.cleanup.keys))
        }
    }

    public var retryPolicy: RetryPolicy
    /// How many people the machine keeps state for. Past it, people with nothing under way are
    /// forgotten (they are restored from the store when needed).
    public var capacity: Int
    /// Mints the `intentId` of each new decision.
    private let newIntentID: @Sendable () -> String
    private(set) var people: [String: Person] = [:]
    private var nextCheckID: CheckID = 0
    /// Inputs since the last sweep: over capacity, a sweep runs once per tenth of the capacity
    /// in inputs, so one that cannot free enough (everyone has work under way) is not redone
    /// on every input.
    private var inputsSinceSweep = 0
    /// The state of every person touched since the last ``takeChanges()``.
    private var changes: [String: PersistedPerson] = [:]

    /// - Parameter newIntentID: mints the `intentId` of each new decision (by default a
    ///   lowercased UUID).
    public init(
        retryPolicy: RetryPolicy = RetryPolicy(), capacity: Int = 100_000,
        newIntentID: @escaping @Sendable () -> String = { Identifier.random() }
    ) {
        self.retryPolicy = retryPolicy
        self.capacity = max(1, capacity)
        self.newIntentID = newIntentID
    }

    /// What is known of `uid`'s profile.
    public func profileKnowledge(of uid: String) -> ProfileKnowledge {
        people[uid]?.profile ?? .unknown
    }

    /// The intent in force for `uid`, if the machine holds them.
    public func intentInForce(of uid: String) -> RouteIntent? {
        people[uid]?.intent
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
        var person = Person(
            profile: stored.profile, profileAsOf: stored.profileAsOf, sessions: stored.sessions, intent: stored.intent,
            owesDismiss: stored.owesDismiss, withdrawn: stored.withdrawn)
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
        case .signedIn(let uid, let isNewAccount, let sessions):
            var person = people[uid] ?? Person()
            guard !person.withdrawn else { return [] }
            person.sessions = sessions ?? person.sessions + 1
            people[uid] = person
            guard isNewAccount else { return startCheck(uid: uid, reason: .signedIn, waiter: nil) }
            // Its uid was minted by this sign-in: no profile can exist, as of before any event.
            learn(uid, exists: false, asOf: 0)
            return decide(uid, reason: .signedIn)

        case .checkRequested(let uid, let waiter):
            return startCheck(uid: uid, reason: .checkRequested, waiter: waiter)

        case .profileChecked(let uid, let check, let exists, let asOf):
            learn(uid, exists: exists, asOf: asOf)
            guard var person = people[uid], let pending = person.check, pending.id == check else {
                // An answer to a check no longer asked is still information.
                return decide(uid, reason: .checkRequested)
            }
            if person.profile == .unknown, var open = person.check {
                // Older than what was known before it was forgotten (a sign-out while the answer
                // was on its way): the question is still open. Ask again after a backoff, as
                // after a failure; callers keep waiting for the answer.
                open.attempt += 1
                open.inFlight = false
                person.check = open
                people[uid] = person
                return [.retryCheck(
                    uid: uid, check: check, delay: retryPolicy.delay(attempt: open.attempt - 1),
                    attempt: open.attempt - 1, error: Self.staleAnswer)]
            }
            person.check = nil
            people[uid] = person
            var actions = decide(uid, reason: pending.reason)
            if actions.isEmpty, person.profile == .absent, let repeated = person.intent,
                repeated.intent == .presentProfileSetup
            {
                // The check confirms the intent in force: the asker gets it again, same id.
                actions.append(.emit(repeated))
            }
            // The newest knowledge, which a stale answer does not change.
            let hasProfile = person.profile == .present
            let status = OnboardingStatus(uid: uid, hasProfile: hasProfile, intent: hasProfile ? nil : .presentProfileSetup)
            return actions + pending.waiters.map { .answer(waiter: $0, status) }

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

        case .profileCreated(let uid, let asOf), .profileUpdated(let uid, let asOf):
            if var person = people[uid], person.withdrawn {
                // A set-up that raced the withdrawal created it after the clean-up: clean up again.
                if let asOf {
                    guard asOf > person.profileAsOf else { return [] }
                    person.profileAsOf = asOf
                }
                let steps = CleanupStep.allCases.filter { person.cleanup[$0] == nil }
                for step in steps { person.cleanup[step] = 0 }
                people[uid] = person
                return steps.map { .cleanUp(uid: uid, step: $0) }
            }
            learn(uid, exists: true, asOf: asOf)
            return decide(uid, reason: .profileCreated)

        case .profileDeleted(let uid, let reason, let asOf):
            if var person = people[uid], person.withdrawn {
                // The clean-up's own deletion: a profile event older than it is old news.
                person.profileAsOf = max(person.profileAsOf, asOf)
                people[uid] = person
                return []
            }
            // A deletion by a withdrawal is the withdrawal's business: nothing to decide.
            guard reason == .request else { return [] }
            learn(uid, exists: false, asOf: asOf)
            return decide(uid, reason: .profileDeleted)

        case .signedOut(let uid, let sessions):
            // After the last session, forget what was known, as the cache does: the next sign-in
            // asks again and its decision is a new one. A check under way goes on: its callers
            // were signed in when they asked.
            var person = people[uid] ?? Person()
            if !person.withdrawn {
                person.sessions = sessions ?? max(0, person.sessions - 1)
                if person.sessions == 0 {
                    person.profile = .unknown
                    person.intent = nil
                }
                people[uid] = person
            }
            return [.evictProfileCache(uid: uid)]

        case .withdrawn(let uid):
            let person = people[uid]
            guard person?.withdrawn != true else { return [] }
            people[uid] = Person(
                profileAsOf: person?.profileAsOf ?? 0, withdrawn: true, cleanup: [.deleteProfile: 0, .deleteImages: 0])
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

    /// The intent that should be in force for `person`, from what is known.
    static func derivedIntent(of person: Person) -> RouteIntent.Kind? {
        if person.withdrawn { return nil }
        switch person.profile {
        case .absent where person.sessions > 0: return .presentProfileSetup
        case .present where person.owesDismiss: return .dismiss
        case .absent, .present, .unknown: return person.intent?.intent
        }
    }

    /// Why a check is asked again when its answer was older than what was known.
    static let staleAnswer = ServiceError(
        .storeUnavailable, "The profile store answered with news older than what was already known.", reason: "profile")

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

    /// Takes in a fact about `uid`'s profile unless something newer is known. A fact without a
    /// sequence is taken as it comes and leaves the sequence known as it is.
    private mutating func learn(_ uid: String, exists: Bool, asOf: UInt64?) {
        var person = people[uid] ?? Person()
        guard !person.withdrawn, asOf.map({ $0 >= person.profileAsOf }) ?? true else { return }
        person.profile = exists ? .present : .absent
        person.profileAsOf = asOf ?? person.profileAsOf
        people[uid] = person
    }

    /// Emits the derived intent when it differs from the one in force, for `reason`.
    private mutating func decide(_ uid: String, reason: RouteIntent.Reason) -> [Action] {
        guard var person = people[uid], let kind = Self.derivedIntent(of: person), kind != person.intent?.intent else {
            return []
        }
        let intent = RouteIntent(
            intentId: newIntentID(), uid: uid, intent: kind, reason: kind == .dismiss ? .profileCreated : reason)
        person.intent = intent
        person.owesDismiss = kind == .presentProfileSetup
        people[uid] = person
        return [.emit(intent)]
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
        case .signedIn(let uid, _, _), .checkRequested(let uid, _), .profileChecked(let uid, _, _, _),
            .profileCheckFailed(let uid, _, _), .checkRetryDue(let uid, _), .profileCreated(let uid, _),
            .profileUpdated(let uid, _), .profileDeleted(let uid, _, _), .signedOut(let uid, _), .withdrawn(let uid),
            .cleanupFinished(let uid, _), .cleanupFailed(let uid, _, _), .cleanupRetryDue(let uid, _):
            return uid
        }
    }
}
