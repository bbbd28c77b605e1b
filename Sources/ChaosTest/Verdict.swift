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
    // The intent in force at the end.
    case intentAfterWithdrawal = "intent in force after withdrawal"
    case wrongFinalIntent = "wrong intent in force"
    case undeliveredIntent = "intent in force never delivered"
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
}

/// The checks, as a pure function of the evidence.
public enum Verdict {
    /// The people who finished their journey and whose final state breaks a rule, in plan order.
    ///
    /// People who could not finish are not judged here: their state is whatever the step they
    /// stopped at left, and they are reported on their own.
    public static func lost(in evidence: Evidence) -> [LostPerson] {
        evidence.people.compactMap { person in
            guard person.finished, let uid = person.uid else { return nil }
            let problems = person.problems + storeProblems(person, uid: uid, evidence.stores)
                + recordingProblems(person, uid: uid, evidence.recording)
                + finalIntentProblems(person, uid: uid, evidence)
            return problems.isEmpty ? nil : LostPerson(uid: uid, plan: person.plan, problems: problems)
        }
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
                let strays = files.filter { $0 != parts[1] }
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

    static func finalIntentProblems(_ person: PersonOutcome, uid: String, _ evidence: Evidence) -> [Finding] {
        let expected: RouteIntent.Kind? = person.withdrew ? nil : (person.setUp ? .dismiss : .presentProfileSetup)
        guard let states = evidence.routeStates else {
            // No route state to read: the last intent recorded must agree (nothing to say for
            // withdrawn people, whose intent in force is only visible in the route state).
            guard let expected, let last = evidence.recording.intentsByUID[uid]?.last else { return [] }
            return last.kind == expected
                ? []
                : [.init(.wrongFinalIntent, "the last intent recorded is \(last.kind.rawValue) (\(last.reason.rawValue)), expected \(expected.rawValue)")]
        }
        var problems: [Finding] = []
        let inForce = states[uid]?.intent
        switch (expected, inForce) {
        case (nil, nil):
            break
        case (nil, let intent?):
            problems.append(.init(.intentAfterWithdrawal, "\(intent.intent.rawValue) (\(intent.reason.rawValue)) is still in force after withdrawal"))
        case (let expected?, nil):
            problems.append(.init(.wrongFinalIntent, "no intent in force, expected \(expected.rawValue)"))
        case (let expected?, let intent?) where intent.intent != expected:
            problems.append(.init(.wrongFinalIntent, "\(intent.intent.rawValue) (\(intent.reason.rawValue)) is in force, expected \(expected.rawValue)"))
        default:
            break
        }
        if let intent = inForce, !evidence.recording.intentIDs.contains(intent.intentId) {
            problems.append(.init(.undeliveredIntent, "the intent in force (\(intent.intent.rawValue), \(intent.intentId)) was never delivered"))
        }
        return problems
    }
}
