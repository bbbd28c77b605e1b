import Foundation
import OnboardingAPI

/// Everything the checks look at.
public struct Evidence: Sendable {
    public var people: [PersonOutcome]
    public var stores: StoreSnapshot
    public var recording: RouteRecording
    /// The intent in force per uid from `onboarding.routes`; `nil` when it could not be read
    /// (then the final intent is judged from the recording, and withdrawn people's only from the stores).
    public var routeStates: [String: RouteState]?

    public init(people: [PersonOutcome], stores: StoreSnapshot, recording: RouteRecording, routeStates: [String: RouteState]?) {
        self.people = people
        self.stores = stores
        self.recording = recording
        self.routeStates = routeStates
    }
}

/// The rules the checks hold people to, each with a short name for the counts.
public enum Rule: String, Sendable, Hashable, CaseIterable, Codable {
    // Answers during the drive.
    case wrongAnswer = "a wrong answer during the drive"
    // The stores.
    case accountLeft = "account left after withdrawal"
    case profileLeft = "profile left after withdrawal"
    case usernameHeld = "username still held after withdrawal"
    case imagesLeft = "images left after withdrawal"
    case accountMissing = "account missing"
    case profileMissing = "no profile after a set-up"
    case profileDiffers = "stored profile differs from the set-up"
    case imageMissing = "profile image not on disk"
    case strayImages = "stray image files"
    case unexpectedProfile = "profile without a set-up"
    // The route intents recorded.
    case noPresentProfileSetup = "no presentProfileSetup (signedIn) delivered"
    case noDismiss = "no dismiss delivered after a set-up"
    case outOfOrder = "intents out of order"
    case unexpectedDismiss = "dismiss without a set-up"
    case repeatDiffers = "a repeat differs from its first delivery"
    // Doubled: a second decision for one state change.
    case doubledDismiss = "two dismiss for one profile"
    case doubledPresentProfileSetup = "two presentProfileSetup for one missing profile"
    // The intent in force at the end.
    case intentAfterWithdrawal = "intent in force after withdrawal"
    case wrongFinalIntent = "wrong intent in force"
    case undeliveredIntent = "intent in force never delivered"
    case staleDecision = "the decision from before a full sign-out still in force"

    /// Whether the rule is about a decision made twice (reported as "doubled", apart from "lost").
    public var isDoubling: Bool { self == .doubledDismiss || self == .doubledPresentProfileSetup }
}

/// One broken rule, with the details of this person's case.
public struct Finding: Sendable, Hashable, CustomStringConvertible {
    public var rule: Rule
    public var detail: String

    public init(_ rule: Rule, _ detail: String) {
        self.rule = rule
        self.detail = detail
    }

    public var description: String { detail }
}

/// A person who finished but whose traces break a rule.
public struct LostPerson: Sendable, Hashable {
    public var uid: String
    public var plan: PersonPlan
    public var problems: [Finding]
    /// Decisions beyond one per state change, by kind (0 and 0 unless a doubling rule is broken).
    public var doubled = DoubledIntents()

    public init(uid: String, plan: PersonPlan, problems: [Finding], doubled: DoubledIntents = DoubledIntents()) {
        self.uid = uid
        self.plan = plan
        self.problems = problems
        self.doubled = doubled
    }

    /// Whether a rule other than a doubling one is broken: the person is lost.
    public var isLost: Bool { problems.contains { !$0.rule.isDoubling } }
    /// Whether a decision was made twice.
    public var isDoubled: Bool { doubled.total > 0 }
}

/// How many decisions one person got beyond one per state change.
public struct DoubledIntents: Sendable, Hashable, Codable {
    /// Distinct `dismiss` ids that follow another `dismiss` with no `presentProfileSetup` between.
    public var dismiss = 0
    /// Distinct `presentProfileSetup` ids beyond one per missing-profile spell (a spell ends with
    /// a `dismiss`, or a sign-out of every session followed by a sign-in).
    public var presentProfileSetup = 0

    public init(dismiss: Int = 0, presentProfileSetup: Int = 0) {
        self.dismiss = dismiss
        self.presentProfileSetup = presentProfileSetup
    }

    public var total: Int { dismiss + presentProfileSetup }
}

/// The checks, as a pure function of the evidence.
public enum Verdict {
    /// The people who finished their journey and whose traces break a rule (lost, doubled or
    /// both), in plan order.
    ///
    /// People who could not finish are not judged here: their state is whatever the step they
    /// stopped at left, and they are reported on their own.
    public static func lost(in evidence: Evidence) -> [LostPerson] {
        evidence.people.compactMap { person in
            guard person.finished, let uid = person.uid else { return nil }
            let timeline = person.timeline
            let intents = evidence.recording.intentsByUID[uid] ?? []
            let (doubled, doubling) = doubledIntents(intents, timeline: timeline, order: evidence.recording.order)
            let problems = person.problems + storeProblems(person, uid: uid, evidence.stores)
                + recordingProblems(person, uid: uid, evidence.recording)
                + repeatProblems(intents)
                + doubling
                + finalIntentProblems(person, uid: uid, timeline: timeline, evidence)
            return problems.isEmpty ? nil : LostPerson(uid: uid, plan: person.plan, problems: problems, doubled: doubled)
        }
    }

    /// Each intentId once, at its first delivery, in the deliveries' order.
    public static func decisions(_ deliveries: [RecordedIntent]) -> [RecordedIntent] {
        var seen = Set<String>()
        return deliveries.filter { seen.insert($0.intentId).inserted }
    }

    /// A repeat (the same intentId under another route sequence) must say what its first
    /// delivery said: same person, kind and reason.
    static func repeatProblems(_ deliveries: [RecordedIntent]) -> [Finding] {
        var first: [String: RecordedIntent] = [:]
        var problems: [Finding] = []
        for delivery in deliveries {
            guard let original = first[delivery.intentId] else {
                first[delivery.intentId] = delivery
                continue
            }
            if original.kind != delivery.kind || original.reason != delivery.reason || original.uid != delivery.uid {
                problems.append(.init(
                    .repeatDiffers,
                    "intent \(delivery.intentId) was first \(original.kind.rawValue) (\(original.reason.rawValue)) at route sequence \(original.sequence), "
                        + "then \(delivery.kind.rawValue) (\(delivery.reason.rawValue)) at \(delivery.sequence)"))
            }
        }
        return problems
    }

    /// Decisions made twice for one state change, from the person's deliveries (in the
    /// recording's order) and what the driver did.
    ///
    /// Each distinct intentId is a decision. Two `dismiss` decisions need a `presentProfileSetup`
    /// between them. Two `presentProfileSetup` decisions need a change of state between them: a
    /// `dismiss` (the profile appeared, and a deletion made it missing again), or a sign-out of
    /// every session followed by a sign-in (the orchestrator forgets what it knew and decides
    /// anew). The driver never deletes a profile but by withdrawing, after which nothing is
    /// decided; so within each stretch without a `dismiss`, the decisions beyond the first need
    /// one of the driver's full sign-outs each. (A session the driver does not know of, from a
    /// sign-in resent after a timeout, only makes fewer full sign-outs for the orchestrator.)
    public static func doubledIntents(
        _ deliveries: [RecordedIntent], timeline: Timeline, order: RouteRecording.Order
    ) -> (DoubledIntents, [Finding]) {
        var doubled = DoubledIntents()
        var problems: [Finding] = []
        var previous: RecordedIntent?
        var presentsInStretch: [RecordedIntent] = []
        var extraPresents: [RecordedIntent] = []
        for decision in decisions(deliveries) {
            switch decision.kind {
            case .dismiss:
                if let previous, previous.kind == .dismiss {
                    doubled.dismiss += 1
                    problems.append(.init(
                        .doubledDismiss,
                        "two dismiss with no presentProfileSetup between (by \(order.rawValue)): \(previous.intentId) at route sequence "
                            + "\(previous.sequence), then \(decision.intentId) at \(decision.sequence)"))
                }
                presentsInStretch = []
            case .presentProfileSetup:
                if !presentsInStretch.isEmpty { extraPresents.append(decision) }
                presentsInStretch.append(decision)
            }
            previous = decision
        }
        let allowed = timeline.fullSignOutsFollowedBySignIn
        if extraPresents.count > allowed {
            doubled.presentProfileSetup = extraPresents.count - allowed
            let ids = decisions(deliveries).filter { $0.kind == .presentProfileSetup }
                .map { "\($0.intentId) (\($0.reason.rawValue), route sequence \($0.sequence))" }
            problems.append(.init(
                .doubledPresentProfileSetup,
                "\(ids.count) presentProfileSetup decisions, \(extraPresents.count - allowed) more than the "
                    + "\(allowed) full sign-out\(allowed == 1 ? "" : "s") followed by a sign-in allow: \(ids.joined(separator: ", "))"))
        }
        return (doubled, problems)
    }

    static func storeProblems(_ person: PersonOutcome, uid: String, _ stores: StoreSnapshot) -> [Finding] {
        guard stores.problems.isEmpty else { return [] }  // reported once, for the whole run
        var problems: [Finding] = []
        let files = stores.imageFiles[uid] ?? []
        let profile = stores.profiles[uid]
        if person.withdrew {
            if stores.accounts.contains(uid) { problems.append(.init(.accountLeft, "the account is still there after withdrawal")) }
            if let profile { problems.append(.init(.profileLeft, "the profile (\(profile.username)) is still there after withdrawal")) }
            if let username = person.plan.username, person.setUp,
                let holder = stores.usernameHolders[UsernameRules.uniquenessKey(username)]
            {
                problems.append(.init(
                    .usernameHeld, "the username \(username) is still held\(holder == uid ? "" : " (by \(holder))") after withdrawal"))
            }
            if !files.isEmpty { problems.append(.init(.imagesLeft, "image files left after withdrawal: \(files.joined(separator: ", "))")) }
            return problems
        }
        if !stores.accounts.contains(uid) { problems.append(.init(.accountMissing, "the account is missing though the person never withdrew")) }
        if person.setUp, let username = person.plan.username {
            guard let profile else {
                problems.append(.init(.profileMissing, "no profile in the store after a set-up that was answered"))
                if !files.isEmpty { problems.append(.init(.strayImages, "image files without a profile: \(files.joined(separator: ", "))")) }
                return problems
            }
            if profile.username != username {
                problems.append(.init(.profileDiffers, "the stored profile is named \(profile.username), not \(username)"))
            }
            if person.plan.withImage {
                guard let path = profile.imagePath else {
                    problems.append(.init(.profileDiffers, "the stored profile has no image path though the set-up carried an image"))
                    return problems
                }
                let parts = path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
                guard parts.count == 2, parts[0] == uid else {
                    problems.append(.init(.profileDiffers, "the stored image path \(path) is not <uid>/<file>"))
                    return problems
                }
                if !files.contains(parts[1]) { problems.append(.init(.imageMissing, "the profile's image \(path) is not on disk")) }
                // image-upload keeps a thumbnail beside each image.
                let thumbnail = StoredImagePath.thumbnailFileName(ofImage: parts[1])
                if let thumbnail, !files.contains(thumbnail) {
                    problems.append(.init(.imageMissing, "the thumbnail \(thumbnail) of the profile's image is not on disk"))
                }
                let strays = files.filter { $0 != parts[1] && $0 != thumbnail }
                if !strays.isEmpty { problems.append(.init(.strayImages, "stray image files beside the profile's: \(strays.joined(separator: ", "))")) }
            } else {
                if let path = profile.imagePath { problems.append(.init(.profileDiffers, "the stored profile has image path \(path) though the set-up carried none")) }
                if !files.isEmpty { problems.append(.init(.strayImages, "image files though the set-up carried none: \(files.joined(separator: ", "))")) }
            }
        } else {
            if let profile { problems.append(.init(.unexpectedProfile, "a profile (\(profile.username)) exists though the person never set one up")) }
            if !files.isEmpty { problems.append(.init(.strayImages, "image files though the person never set up: \(files.joined(separator: ", "))")) }
        }
        return problems
    }

    static func recordingProblems(_ person: PersonOutcome, uid: String, _ recording: RouteRecording) -> [Finding] {
        var problems: [Finding] = []
        let intents = recording.intentsByUID[uid] ?? []
        let firstPresent = intents.firstIndex { $0.kind == .presentProfileSetup && $0.reason == .signedIn }
        if firstPresent == nil {
            problems.append(.init(.noPresentProfileSetup, "no presentProfileSetup (signedIn) was recorded on route.\(uid)"))
        }
        if person.setUp {
            if let dismiss = intents.firstIndex(where: { $0.kind == .dismiss }) {
                if let firstPresent, dismiss < firstPresent {
                    problems.append(.init(.outOfOrder, "dismiss came before the first presentProfileSetup (by \(recording.order.rawValue))"))
                }
                if let late = intents[dismiss...].first(where: { $0.kind == .presentProfileSetup }) {
                    problems.append(.init(
                        .outOfOrder, "presentProfileSetup (\(late.reason.rawValue)) came after dismiss (by \(recording.order.rawValue))"))
                }
            } else {
                problems.append(.init(.noDismiss, "no dismiss was recorded after the set-up"))
            }
        } else if let dismiss = intents.first(where: { $0.kind == .dismiss }) {
            problems.append(.init(.unexpectedDismiss, "dismiss (\(dismiss.reason.rawValue)) was recorded though the person never set up"))
        }
        return problems
    }

    /// What may be in force at the end, from the stores and what the driver did:
    /// - withdrawn: nothing;
    /// - a profile exists: `dismiss` (the person was asked to set up at their first sign-in),
    ///   or nothing once every session was signed out after the set-up; never `presentProfileSetup`;
    /// - no profile, and auth holds a session of the person: `presentProfileSetup`;
    /// - no profile and no session: nothing.
    ///
    /// Sessions are counted in auth's store, not by the driver: a sign-in resent after a timeout
    /// may have left a session the driver never got.
    public static func expectedFinalIntents(
        _ person: PersonOutcome, uid: String, timeline: Timeline, stores: StoreSnapshot
    ) -> Set<RouteIntent.Kind?> {
        if person.withdrew { return [nil] }
        if stores.profiles[uid] != nil || person.setUp {
            return timeline.fullSignOutAfterSetUp || !person.setUp ? [.dismiss, nil] : [.dismiss]
        }
        return (stores.sessions[uid] ?? 0) > 0 ? [.presentProfileSetup] : [nil]
    }

    static func finalIntentProblems(_ person: PersonOutcome, uid: String, timeline: Timeline, _ evidence: Evidence) -> [Finding] {
        let expected = expectedFinalIntents(person, uid: uid, timeline: timeline, stores: evidence.stores)
        func describe(_ kinds: Set<RouteIntent.Kind?>) -> String {
            kinds.map { $0?.rawValue ?? "none" }.sorted().joined(separator: " or ")
        }
        guard let states = evidence.routeStates else {
            // No route state to read: the last decision recorded must agree when one intent is
            // expected (nothing to say otherwise: ending an intent is only visible in the route state).
            guard expected.count == 1, let only = expected.first, let kind = only,
                let last = decisions(evidence.recording.intentsByUID[uid] ?? []).last
            else { return [] }
            return last.kind == kind
                ? []
                : [.init(.wrongFinalIntent, "the last intent recorded is \(last.kind.rawValue) (\(last.reason.rawValue)), expected \(kind.rawValue)")]
        }
        var problems: [Finding] = []
        let inForce = states[uid]?.intent
        if !expected.contains(inForce?.intent) {
            let sessions = evidence.stores.sessions[uid] ?? 0
            let facts = "profile \(evidence.stores.profiles[uid] == nil ? "none" : "exists"), \(sessions) session\(sessions == 1 ? "" : "s") in auth's store"
            if let intent = inForce {
                if person.withdrew {
                    problems.append(.init(.intentAfterWithdrawal, "\(intent.intent.rawValue) (\(intent.reason.rawValue)) is still in force after withdrawal"))
                } else {
                    problems.append(.init(
                        .wrongFinalIntent,
                        "\(intent.intent.rawValue) (\(intent.reason.rawValue), \(intent.intentId)) is in force, expected \(describe(expected)) (\(facts))"))
                }
            } else {
                problems.append(.init(.wrongFinalIntent, "no intent in force, expected \(describe(expected)) (\(facts))"))
            }
        }
        if let intent = inForce, !evidence.recording.intentIDs.contains(intent.intentId) {
            problems.append(.init(.undeliveredIntent, "the intent in force (\(intent.intent.rawValue), \(intent.intentId)) was never delivered"))
        }
        if let intent = inForce, intent.intent == .presentProfileSetup, !timeline.uncertainSessions,
            timeline.presentSeenBeforeLastFullSignOut.contains(intent.intentId)
        {
            problems.append(.init(
                .staleDecision,
                "presentProfileSetup \(intent.intentId) is in force, the decision seen before every session was signed out; "
                    + "the sign-in after it must decide anew (a new intentId)"))
        }
        return problems
    }
}
