import Foundation
import OnboardingAPI
import Synchronization
import Testing

@testable import ChaosTest

@Suite struct RunPlanTests {
    let services = ["auth", "profile", "image-upload", "onboarding-orchestrator"]

    @Test func theSameSeedMakesTheSameChoices() {
        let first = RunPlan.make(seed: 42, nonce: "0000abcd", people: 500, faults: FaultCounts(), services: services)
        let second = RunPlan.make(seed: 42, nonce: "0000abcd", people: 500, faults: FaultCounts(), services: services)
        #expect(first.people == second.people)
        #expect(first.faults == second.faults)
        let other = RunPlan.make(seed: 43, nonce: "0000abcd", people: 500, faults: FaultCounts(), services: services)
        #expect(other.people.map(\.setsUp) != first.people.map(\.setsUp))
        #expect(other.faults != first.faults)
    }

    @Test func usernamesAreValidAndUnique() {
        let plan = RunPlan.make(seed: 7, nonce: "12345678", people: 5_000, faults: .killsOnly(0), services: services)
        let names = plan.people.compactMap(\.username)
        #expect(Set(names.map(UsernameRules.uniquenessKey)).count == names.count)
        for name in names {
            #expect(UsernameRules.formatProblem(name) == nil, "\(name)")
            #expect(name.count <= 9)
            #expect(name.allSatisfy { $0.isLowercase || $0.isNumber || $0 == "_" })
        }
        // Another run's nonce gives other names.
        let other = RunPlan.make(seed: 7, nonce: "87654321", people: 5_000, faults: .killsOnly(0), services: services)
        #expect(Set(other.people.compactMap(\.username)).isDisjoint(with: names))
    }

    @Test func sharesAreRoughlyKept() {
        let plan = RunPlan.make(
            seed: 1, nonce: "00000001", people: 10_000,
            shares: .init(setUp: 0.8, image: 0.5, withdraw: 0.4, twoDevices: 0.3, checks: 0.5, endSignedOut: 0.25),
            faults: .killsOnly(0), services: services)
        let setUp = plan.people.filter(\.setsUp).count
        let withImage = plan.people.filter(\.withImage).count
        let withdraws = plan.people.filter(\.withdraws).count
        #expect((7_700...8_300).contains(setUp))
        #expect((3_700...4_300).contains(withImage))
        #expect((3_700...4_300).contains(withdraws))
        #expect(plan.people.allSatisfy { !$0.withImage || $0.setsUp })
        #expect((2_700...3_300).contains(plan.people.filter { $0.devices == 2 }.count))
        #expect(plan.people.allSatisfy { (1...2).contains($0.devices) })
        #expect((4_700...5_300).contains(plan.people.filter(\.checksOften).count))
        // A quarter of those who stay (about 6,000) end signed out; nobody both withdraws and signs out.
        #expect((1_300...1_700).contains(plan.people.filter(\.endsSignedOut).count))
        #expect(plan.people.allSatisfy { !($0.withdraws && $0.endsSignedOut) })
        #expect(Set(plan.people.map(\.seed)).count == plan.people.count)
    }

    @Test func killsAreSpreadOverTheDrive() {
        let plan = RunPlan.make(seed: 9, nonce: "00000009", people: 10, faults: .killsOnly(3), services: services)
        #expect(plan.faults.count == 12)
        for service in services {
            let points = plan.killPoints[service] ?? []
            #expect(points.count == 3)
            #expect(points == points.sorted())
            #expect(points.allSatisfy { (0.02...0.95).contains($0) })
            // Each kill stays in its own third-of-a-gap window around k/4.
            for (k, point) in points.enumerated() {
                #expect(abs(point - Double(k + 1) / 4) <= 0.25 / 3 + 1e-9)
            }
        }
    }
}

extension RunPlanTests {
    @Test func databaseFaultsComeWhenAskedForAndLeaveTheRestOfThePlanAsItWas() {
        let without = FaultCounts(killsPerService: 1, hangsPerService: 1, doubleKills: 1, systemRestarts: 1)
        var with = without
        with.databasePauses = 2
        with.databaseRestarts = 2
        let plain = RunPlan.make(seed: 7, nonce: "00000007", people: 200, faults: without, services: services)
        let plan = RunPlan.make(seed: 7, nonce: "00000007", people: 200, faults: with, services: services)
        let database = plan.faults.filter { $0.services(all: services) == [PlannedFault.database] }
        #expect(database.count == 4)
        #expect(database.filter { if case .pauseDatabase(let ms) = $0.kind { (2_000...4_000).contains(ms) } else { false } }.count == 2)
        #expect(plan.faults.filter { !database.contains($0) } == plain.faults, "the same seed plans the same service faults")
    }

    @Test func theLongFormPlansEveryKindOfFault() {
        let counts = FaultCounts(
            killsPerService: 3, hangsPerService: 2, hangMilliseconds: 2_000...4_000, doubleKills: 2, systemRestarts: 2)
        let plan = RunPlan.make(seed: 11, nonce: "0000000b", people: 5_000, faults: counts, services: services)
        #expect(plan.faults.count == 12 + 8 + 2 + 2)
        #expect(plan.faults.map(\.point) == plan.faults.map(\.point).sorted())
        #expect(plan.faults.allSatisfy { (0.02...0.95).contains($0.point) })
        var hangs: [String: [Bool]] = [:]
        var pairs: [[String]] = []
        var signals: [PlannedFault.StopSignal] = []
        for fault in plan.faults {
            switch fault.kind {
            case .kill: break
            case .hang(let service, let milliseconds, let afterSetUp):
                #expect((2_000...4_000).contains(milliseconds))
                hangs[service, default: []].append(afterSetUp)
            case .killTwo(let first, let second):
                #expect(first != second)
                #expect(services.firstIndex(of: first)! < services.firstIndex(of: second)!)
                pairs.append([first, second])
            case .restartAll(let signal): signals.append(signal)
            case .pauseDatabase, .restartDatabase: Issue.record("no database fault unless asked for")
            }
        }
        #expect(plan.killPoints.mapValues(\.count) == Dictionary(uniqueKeysWithValues: services.map { ($0, 3) }))
        // Two hangs of each service, the first of them right after a set-up begins.
        #expect(Set(hangs.keys) == Set(services))
        #expect(hangs.values.allSatisfy { $0.count == 2 && $0.filter { $0 }.count == 1 })
        #expect(pairs.count == 2)
        #expect(signals == [.term, .kill])
        #expect(PlannedFault(.restartAll(signal: .term), at: 0.5).services(all: services) == services)
        #expect(PlannedFault(.killTwo("auth", "profile"), at: 0.5).services(all: services) == ["auth", "profile"])
    }

    @Test func noFaultsWhenEveryCountIsZero() {
        let counts = FaultCounts(killsPerService: 0, hangsPerService: 0, doubleKills: 0, systemRestarts: 0)
        #expect(RunPlan.make(seed: 3, nonce: "00000003", people: 100, faults: counts, services: services).faults.isEmpty)
    }
}

@Suite struct PNGTests {
    @Test func aPixelIsAWellFormedPNG() {
        let png = [UInt8](PNG.pixel(index: 12))
        #expect(Array(png.prefix(8)) == [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A])
        // Walk the chunks and check each CRC.
        var offset = 8
        var types: [String] = []
        while offset < png.count {
            let length = Int(png[offset]) << 24 | Int(png[offset + 1]) << 16 | Int(png[offset + 2]) << 8 | Int(png[offset + 3])
            let body = Array(png[(offset + 4)..<(offset + 8 + length)])
            let crc = png[(offset + 8 + length)..<(offset + 12 + length)].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
            #expect(PNG.crc32(body) == crc)
            types.append(String(decoding: body.prefix(4), as: UTF8.self))
            offset += 12 + length
        }
        #expect(types == ["IHDR", "IDAT", "IEND"])
        #expect(offset == png.count)
        #expect(PNG.pixel(index: 1) != PNG.pixel(index: 2))
    }

    @Test func checksumsMatchKnownValues() {
        #expect(PNG.crc32(Array("IEND".utf8)) == 0xAE42_6082)
        #expect(PNG.adler32(Array("Wikipedia".utf8)) == 0x11E6_0398)
    }
}

@Suite struct RouteRecorderTests {
    func intent(_ id: String, _ uid: String, _ kind: RouteIntent.Kind, _ reason: RouteIntent.Reason) -> RouteIntent {
        RouteIntent(intentId: id, uid: uid, intent: kind, reason: reason)
    }

    @Test func duplicatesAreCountedAndDropped() {
        let recorder = RouteRecorder()
        #expect(recorder.record(intent("a", "u1", .presentProfileSetup, .signedIn), sequence: 1, live: true))
        #expect(!recorder.record(intent("a", "u1", .presentProfileSetup, .signedIn), sequence: 1, live: true))
        #expect(recorder.record(intent("b", "u1", .dismiss, .profileCreated), sequence: 3, live: true))
        // Replayed: one already seen, one the live stream missed.
        #expect(!recorder.record(intent("b", "u1", .dismiss, .profileCreated), sequence: 3, live: false))
        #expect(recorder.record(intent("c", "u2", .presentProfileSetup, .signedIn), sequence: 2, live: false))
        let counts = recorder.snapshot().counts
        #expect(counts.intents == 3)
        #expect(counts.deliveries == 3)
        #expect(counts.repeats == 0)
        #expect(counts.liveDeliveries == 3)
        #expect(counts.duplicatesDelivered == 1)
        #expect(counts.deduplicated == 2)
        #expect(counts.filled == 1)
        #expect(counts.sequenceReused == 0)
    }

    @Test func aRepeatIsADeliveryOfItsOwnNotADuplicate() {
        let recorder = RouteRecorder()
        recorder.record(intent("a", "u1", .presentProfileSetup, .signedIn), sequence: 1, live: true)
        // A check confirmed it: the same intentId under a new route sequence, live and then replayed.
        #expect(recorder.record(intent("a", "u1", .presentProfileSetup, .signedIn), sequence: 4, live: true))
        #expect(!recorder.record(intent("a", "u1", .presentProfileSetup, .signedIn), sequence: 4, live: false))
        // A repeat the live stream missed.
        #expect(recorder.record(intent("a", "u1", .presentProfileSetup, .signedIn), sequence: 6, live: false))
        let recording = recorder.snapshot()
        #expect(recording.counts.intents == 1)
        #expect(recording.counts.deliveries == 3)
        #expect(recording.counts.repeats == 2)
        #expect(recording.counts.duplicatesDelivered == 0)
        #expect(recording.counts.deduplicated == 1)
        #expect(recording.counts.filled == 1)
        #expect(recording.intentsByUID["u1"]?.map(\.sequence) == [1, 4, 6])
        #expect(Verdict.decisions(recording.intentsByUID["u1"] ?? []).map(\.sequence) == [1])
    }

    @Test func aReusedSequenceIsCountedAndOrderFallsBackToArrival() {
        let recorder = RouteRecorder()
        recorder.record(intent("a", "u1", .presentProfileSetup, .signedIn), sequence: 5, live: true)
        recorder.record(intent("b", "u1", .dismiss, .profileCreated), sequence: 1, live: true)  // a restarted publisher
        let recording = recorder.snapshot()
        #expect(recording.counts.sequenceReused == 0)
        #expect(recording.order == .arrival)
        #expect(recording.intentsByUID["u1"]?.map(\.intentId) == ["a", "b"])
        recorder.record(intent("c", "u2", .presentProfileSetup, .signedIn), sequence: 1, live: true)
        #expect(recorder.snapshot().counts.sequenceReused == 1)
    }

    @Test func waitingForAnIntentEndsWhenItArrives() async {
        let recorder = RouteRecorder()
        async let seen = recorder.waitForIntent(of: "u9", timeout: .seconds(30))
        // Recorded from another task: the waiter is resumed by the recording itself.
        Task { recorder.record(intent("z", "u9", .presentProfileSetup, .signedIn), sequence: 1, live: true) }
        #expect(await seen)
        #expect(await recorder.waitForIntent(of: "nobody", timeout: .milliseconds(1)) == false)
    }
}

@Suite struct ProgressGateTests {
    @Test func waitersAreReleasedAtTheirThresholdOrWhenTheDriveEnds() async {
        let gate = ProgressGate()
        async let reached = gate.wait(untilCompleted: 2)
        async let never = gate.wait(untilCompleted: 10)
        gate.complete()
        gate.complete()
        #expect(await reached)
        gate.finish()
        #expect(await never == false)
        #expect(await gate.wait(untilCompleted: 1))
        #expect(await gate.wait(untilCompleted: 100) == false)
    }
}

@Suite struct VerdictTests {
    let uid = "00000000-0000-0000-0000-000000000001"

    func person(setUp: Bool, image: Bool = false, withdrew: Bool) -> PersonOutcome {
        var outcome = PersonOutcome(
            plan: PersonPlan(
                index: 0, provider: .kakao, subject: "s", username: setUp ? "minji" : nil, withImage: image,
                withdraws: withdrew))
        outcome.uid = uid
        outcome.setUp = setUp
        outcome.withdrew = withdrew
        return outcome
    }

    func recording(_ intents: [(String, RouteIntent.Kind, RouteIntent.Reason)]) -> RouteRecording {
        let recorder = RouteRecorder()
        for (offset, (id, kind, reason)) in intents.enumerated() {
            recorder.record(RouteIntent(intentId: id, uid: uid, intent: kind, reason: reason), sequence: UInt64(offset + 1), live: true)
        }
        return recorder.snapshot()
    }

    func state(_ id: String, _ kind: RouteIntent.Kind, _ reason: RouteIntent.Reason) -> [String: RouteState] {
        [uid: RouteState(uid: uid, intent: RouteIntent(intentId: id, uid: uid, intent: kind, reason: reason), sequence: 2, time: nil)]
    }

    @Test func aCleanSetUpWithImagePasses() {
        var stores = StoreSnapshot()
        stores.accounts = [uid]
        stores.profiles[uid] = StoredProfile(username: "minji", imagePath: "\(uid)/a.png")
        stores.usernameHolders["minji"] = uid
        stores.imageFiles[uid] = ["a.png", "a.thumb.png"]
        let evidence = Evidence(
            people: [person(setUp: true, image: true, withdrew: false)], stores: stores,
            recording: recording([("p", .presentProfileSetup, .signedIn), ("d", .dismiss, .profileCreated)]),
            routeStates: state("d", .dismiss, .profileCreated))
        #expect(Verdict.lost(in: evidence).isEmpty)

        // Without its thumbnail the image is incomplete; another image's thumbnail is a stray.
        var withoutThumbnail = stores
        withoutThumbnail.imageFiles[uid] = ["a.png", "b.thumb.png"]
        let lost = Verdict.lost(in: Evidence(
            people: evidence.people, stores: withoutThumbnail, recording: evidence.recording, routeStates: evidence.routeStates))
        #expect(Set(lost.first?.problems.map(\.rule) ?? []) == [.imageMissing, .strayImages])
    }

    @Test func leftoversOfAWithdrawalAreFound() {
        var stores = StoreSnapshot()
        stores.accounts = [uid]
        stores.profiles[uid] = StoredProfile(username: "Minji", imagePath: nil)
        stores.usernameHolders["minji"] = uid
        stores.imageFiles[uid] = ["b.png"]
        let evidence = Evidence(
            people: [person(setUp: true, image: false, withdrew: true)], stores: stores,
            recording: recording([("p", .presentProfileSetup, .signedIn), ("d", .dismiss, .profileCreated)]),
            routeStates: state("d", .dismiss, .profileCreated))
        let lost = Verdict.lost(in: evidence)
        #expect(lost.count == 1)
        let problems = lost.first?.problems.map(\.detail) ?? []
        #expect(problems.contains { $0.contains("account is still there") })
        #expect(problems.contains { $0.contains("profile (Minji) is still there") })
        #expect(problems.contains { $0.contains("username minji is still held") })
        #expect(problems.contains { $0.contains("image files left") })
        #expect(problems.contains { $0.contains("still in force after withdrawal") })
        #expect(
            Set(lost.first?.problems.map(\.rule) ?? [])
                == [.accountLeft, .profileLeft, .usernameHeld, .imagesLeft, .intentAfterWithdrawal])
    }

    @Test func missingAndContradictingIntentsAreFound() {
        var stores = StoreSnapshot()
        stores.accounts = [uid]
        stores.profiles[uid] = StoredProfile(username: "minji", imagePath: nil)
        // Set up, but the recording lacks the dismiss and the route state says presentProfileSetup.
        let evidence = Evidence(
            people: [person(setUp: true, withdrew: false)], stores: stores,
            recording: recording([("p", .presentProfileSetup, .signedIn)]),
            routeStates: state("x", .presentProfileSetup, .checkRequested))
        let problems = Verdict.lost(in: evidence).first?.problems.map(\.detail) ?? []
        #expect(problems.contains { $0.contains("no dismiss") })
        #expect(problems.contains { $0.contains("is in force, expected dismiss") })
        #expect(problems.contains { $0.contains("never delivered") })
    }

    @Test func withoutRouteStateTheLastRecordedIntentDecides() {
        var stores = StoreSnapshot()
        stores.accounts = [uid]
        stores.sessions[uid] = 1
        // Signed out and in again: a second decision for the missing profile is allowed.
        var signedInAgain = person(setUp: false, withdrew: false)
        signedInAgain.deeds = [.signIn(device: 0, uncertain: false), .signOut(device: 0), .signIn(device: 0, uncertain: false)]
        let evidence = Evidence(
            people: [signedInAgain], stores: stores,
            recording: recording([("p", .presentProfileSetup, .signedIn), ("q", .presentProfileSetup, .checkRequested)]),
            routeStates: nil)
        #expect(Verdict.lost(in: evidence).isEmpty)
        var strayImage = stores
        strayImage.imageFiles[uid] = ["c.png"]
        let lost = Verdict.lost(in: Evidence(
            people: evidence.people, stores: strayImage, recording: evidence.recording, routeStates: nil))
        #expect(lost.first?.problems == [Finding(.strayImages, "image files though the person never set up: c.png")])
    }

    @Test func unfinishedPeopleAreNotJudged() {
        var outcome = person(setUp: true, withdrew: false)
        outcome.stopped = .init(step: .setUp, error: "timeout")
        let evidence = Evidence(
            people: [outcome], stores: StoreSnapshot(), recording: recording([]), routeStates: [:])
        #expect(Verdict.lost(in: evidence).isEmpty)
    }
}

@Suite struct TimelineTests {
    let signIn = Deed.signIn(device: 0, uncertain: false)

    @Test func aFullSignOutCountsOnceASignInFollows() {
        #expect(Timeline([signIn, .signOut(device: 0)]).fullSignOutsFollowedBySignIn == 0)
        let again = Timeline([signIn, .signOut(device: 0), signIn, .signOut(device: 0), signIn])
        #expect(again.fullSignOutsFollowedBySignIn == 2)
        #expect(again.signedInAtEnd)
        #expect(!again.uncertainSessions)
    }

    @Test func aSecondDeviceKeepsThePersonSignedIn() {
        let second = Deed.signIn(device: 1, uncertain: false)
        // One device signs out while the other stays: nothing ends.
        let partial = Timeline([signIn, second, .setUp, .signOut(device: 0), .check(device: 1, hasProfile: true)])
        #expect(partial.fullSignOutsFollowedBySignIn == 0)
        #expect(!partial.fullSignOutAfterSetUp)
        #expect(partial.signedInAtEnd)
        // Then the other one too, and in again.
        let full = Timeline([signIn, second, .setUp, .signOut(device: 0), .signOut(device: 1), second])
        #expect(full.fullSignOutsFollowedBySignIn == 1)
        #expect(full.fullSignOutAfterSetUp)
    }

    @Test func whatWasSeenBeforeTheLastFullSignOutIsKept() {
        let timeline = Timeline([
            signIn, .sawIntent(id: "p1", kind: .presentProfileSetup), .signOut(device: 0),
            .signIn(device: 0, uncertain: true), .sawIntent(id: "p2", kind: .presentProfileSetup),
        ])
        #expect(timeline.presentSeenBeforeLastFullSignOut == ["p1"])
        #expect(timeline.uncertainSessions)
        #expect(Timeline([signIn, .withdraw]).signedInAtEnd == false)
    }
}

/// The doubled-decision rules over recorded deliveries: pure, from the deliveries and the deeds.
@Suite struct DoubledIntentTests {
    let uid = "00000000-0000-0000-0000-000000000002"

    /// Deliveries from (intentId, kind, reason), numbered 1, 2, 3… in route-sequence order.
    func deliveries(_ intents: [(String, RouteIntent.Kind, RouteIntent.Reason)]) -> [RecordedIntent] {
        intents.enumerated().map { offset, intent in
            RecordedIntent(
                uid: uid, intentId: intent.0, kind: intent.1, reason: intent.2, sequence: UInt64(offset + 1),
                position: offset, live: true)
        }
    }

    func doubled(_ intents: [(String, RouteIntent.Kind, RouteIntent.Reason)], _ deeds: [Deed] = []) -> (DoubledIntents, [Rule]) {
        let (count, findings) = Verdict.doubledIntents(deliveries(intents), timeline: Timeline(deeds), order: .sequence)
        return (count, findings.map(\.rule))
    }

    let signIn = Deed.signIn(device: 0, uncertain: false)

    @Test func oneDecisionPerStateChangeIsNotDoubled() {
        #expect(doubled([("p", .presentProfileSetup, .signedIn), ("d", .dismiss, .profileCreated)]).0 == DoubledIntents())
        // Repeats of the intent in force (same id, new route sequence) are not new decisions.
        let repeats = doubled([
            ("p", .presentProfileSetup, .signedIn), ("p", .presentProfileSetup, .signedIn),
            ("p", .presentProfileSetup, .signedIn), ("d", .dismiss, .profileCreated),
        ])
        #expect(repeats.0.total == 0)
        #expect(repeats.1.isEmpty)
    }

    @Test func twoDismissWithNoPresentProfileSetupBetweenAreDoubled() {
        let (count, rules) = doubled(
            [("p", .presentProfileSetup, .signedIn), ("d1", .dismiss, .profileCreated), ("d2", .dismiss, .profileCreated)],
            [signIn, .setUp, .signOut(device: 0), signIn])
        #expect(count == DoubledIntents(dismiss: 1, presentProfileSetup: 0))
        #expect(rules == [.doubledDismiss])
        // Each dismiss after a presentProfileSetup is a decision of its own.
        let separate = doubled([
            ("p1", .presentProfileSetup, .signedIn), ("d1", .dismiss, .profileCreated),
            ("p2", .presentProfileSetup, .profileDeleted), ("d2", .dismiss, .profileCreated),
        ])
        #expect(separate.0.total == 0)
    }

    @Test func twoPresentProfileSetupNeedAFullSignOutBetween() {
        let twice: [(String, RouteIntent.Kind, RouteIntent.Reason)] = [
            ("p1", .presentProfileSetup, .signedIn), ("p2", .presentProfileSetup, .checkRequested),
        ]
        // Signed in all along (a second device, a check): one missing profile, two decisions.
        let (count, rules) = doubled(twice, [signIn, .signIn(device: 1, uncertain: false), .check(device: 1, hasProfile: false)])
        #expect(count == DoubledIntents(dismiss: 0, presentProfileSetup: 1))
        #expect(rules == [.doubledPresentProfileSetup])
        // One device of two signed out: still one spell.
        #expect(doubled(twice, [signIn, .signIn(device: 1, uncertain: false), .signOut(device: 0)]).0.presentProfileSetup == 1)
        // Every session signed out, then a sign-in: a new decision is due.
        #expect(doubled(twice, [signIn, .signOut(device: 0), signIn]).0.total == 0)
        // A full sign-out with no sign-in after it allows nothing.
        #expect(doubled(twice, [signIn, .signOut(device: 0)]).0.presentProfileSetup == 1)
        // Three decisions, one full sign-out: one too many.
        let thrice = twice + [("p3", .presentProfileSetup, .checkRequested)]
        #expect(doubled(thrice, [signIn, .signOut(device: 0), signIn]).0.presentProfileSetup == 1)
    }

    @Test func aDismissEndsTheSpellOfAMissingProfile() {
        // presentProfileSetup after dismiss is not doubled (it is out of order, judged elsewhere).
        let result = doubled([
            ("p1", .presentProfileSetup, .signedIn), ("d", .dismiss, .profileCreated),
            ("p2", .presentProfileSetup, .checkRequested),
        ])
        #expect(result.0.total == 0)
    }

    @Test func aRepeatMustSayWhatItsFirstDeliverySaid() {
        let same = deliveries([("p", .presentProfileSetup, .signedIn), ("p", .presentProfileSetup, .signedIn)])
        #expect(Verdict.repeatProblems(same).isEmpty)
        let changed = deliveries([("p", .presentProfileSetup, .signedIn), ("p", .presentProfileSetup, .checkRequested)])
        #expect(Verdict.repeatProblems(changed).map(\.rule) == [.repeatDiffers])
    }
}

/// The intent in force at the end, against the stores and the deeds.
@Suite struct FinalIntentTests {
    let uid = "00000000-0000-0000-0000-000000000003"
    let signIn = Deed.signIn(device: 0, uncertain: false)

    func person(setUp: Bool, withdrew: Bool = false, _ deeds: [Deed]) -> PersonOutcome {
        var outcome = PersonOutcome(
            plan: PersonPlan(
                index: 0, provider: .naver, subject: "s", username: setUp ? "minji" : nil, withImage: false,
                withdraws: withdrew))
        outcome.uid = uid
        outcome.setUp = setUp
        outcome.withdrew = withdrew
        outcome.deeds = deeds
        return outcome
    }

    func stores(profile: Bool, sessions: Int) -> StoreSnapshot {
        var stores = StoreSnapshot()
        stores.accounts = [uid]
        if profile {
            stores.profiles[uid] = StoredProfile(username: "minji", imagePath: nil)
            stores.usernameHolders["minji"] = uid
        }
        if sessions > 0 { stores.sessions[uid] = sessions }
        return stores
    }

    func expected(_ person: PersonOutcome, _ stores: StoreSnapshot) -> Set<RouteIntent.Kind?> {
        Verdict.expectedFinalIntents(person, uid: uid, timeline: person.timeline, stores: stores)
    }

    /// The final-intent findings with `inForce` as the route state (recorded, so it counts as delivered).
    func findings(_ person: PersonOutcome, _ stores: StoreSnapshot, inForce: RouteIntent?) -> [Rule] {
        let recorder = RouteRecorder()
        if let inForce { recorder.record(inForce, sequence: 1, live: true) }
        let states = inForce.map { [uid: RouteState(uid: uid, intent: $0, sequence: 1, time: nil)] } ?? [:]
        let evidence = Evidence(people: [person], stores: stores, recording: recorder.snapshot(), routeStates: states)
        return Verdict.finalIntentProblems(person, uid: uid, timeline: person.timeline, evidence).map(\.rule)
    }

    func intent(_ id: String, _ kind: RouteIntent.Kind) -> RouteIntent {
        RouteIntent(intentId: id, uid: uid, intent: kind, reason: kind == .dismiss ? .profileCreated : .signedIn)
    }

    @Test func signedInWithoutAProfileIsAskedToSetUp() {
        let someone = person(setUp: false, [signIn])
        #expect(expected(someone, stores(profile: false, sessions: 1)) == [.presentProfileSetup])
        #expect(findings(someone, stores(profile: false, sessions: 1), inForce: intent("p", .presentProfileSetup)).isEmpty)
        #expect(findings(someone, stores(profile: false, sessions: 1), inForce: nil) == [.wrongFinalIntent])
    }

    @Test func signedOutEverywhereWithoutAProfileHasNothingInForce() {
        let someone = person(setUp: false, [signIn, .signOut(device: 0)])
        #expect(expected(someone, stores(profile: false, sessions: 0)) == [nil])
        #expect(findings(someone, stores(profile: false, sessions: 0), inForce: nil).isEmpty)
        #expect(findings(someone, stores(profile: false, sessions: 0), inForce: intent("p", .presentProfileSetup)) == [.wrongFinalIntent])
        // A sign-in resent after a timeout left a session the driver never had: auth's store decides.
        let resent = person(setUp: false, [.signIn(device: 0, uncertain: true), .signOut(device: 0)])
        #expect(expected(resent, stores(profile: false, sessions: 1)) == [.presentProfileSetup])
    }

    @Test func aProfileIsNeverAskedForAgain() {
        let stayed = person(setUp: true, [signIn, .setUp])
        #expect(expected(stayed, stores(profile: true, sessions: 1)) == [.dismiss])
        #expect(findings(stayed, stores(profile: true, sessions: 1), inForce: intent("d", .dismiss)).isEmpty)
        #expect(findings(stayed, stores(profile: true, sessions: 1), inForce: nil) == [.wrongFinalIntent])
        // The device that set up signed out, another stays: dismiss stays in force.
        let twoDevices = person(setUp: true, [signIn, .signIn(device: 1, uncertain: false), .setUp, .signOut(device: 0)])
        #expect(expected(twoDevices, stores(profile: true, sessions: 1)) == [.dismiss])
        // Every session signed out after the set-up: the intent in force may have been ended.
        let returned = person(setUp: true, [signIn, .setUp, .signOut(device: 0), signIn])
        #expect(expected(returned, stores(profile: true, sessions: 1)) == [.dismiss, nil])
        #expect(findings(returned, stores(profile: true, sessions: 1), inForce: nil).isEmpty)
        #expect(findings(returned, stores(profile: true, sessions: 1), inForce: intent("p", .presentProfileSetup)) == [.wrongFinalIntent])
    }

    @Test func aWithdrawnPersonHasNothingInForce() {
        let gone = person(setUp: true, withdrew: true, [signIn, .setUp, .withdraw])
        #expect(expected(gone, stores(profile: false, sessions: 0)) == [nil])
        #expect(findings(gone, StoreSnapshot(), inForce: intent("d", .dismiss)) == [.intentAfterWithdrawal])
    }

    @Test func theDecisionBeforeAFullSignOutMustNotBeInForceAfterIt() {
        let deeds: [Deed] = [
            signIn, .sawIntent(id: "p1", kind: .presentProfileSetup), .signOut(device: 0), signIn,
            .sawIntent(id: "p1", kind: .presentProfileSetup),
        ]
        let someone = person(setUp: false, deeds)
        #expect(findings(someone, stores(profile: false, sessions: 1), inForce: intent("p1", .presentProfileSetup)) == [.staleDecision])
        #expect(findings(someone, stores(profile: false, sessions: 1), inForce: intent("p2", .presentProfileSetup)).isEmpty)
        // With a session the driver may not know of, the orchestrator may never have seen a full sign-out.
        var uncertain = deeds
        uncertain[0] = .signIn(device: 0, uncertain: true)
        #expect(findings(person(setUp: false, uncertain), stores(profile: false, sessions: 2), inForce: intent("p1", .presentProfileSetup)).isEmpty)
    }

    @Test func lostAndDoubledAreToldApart() {
        let doubled = LostPerson(
            uid: uid, plan: person(setUp: false, []).plan, problems: [Finding(.doubledDismiss, "two")],
            doubled: DoubledIntents(dismiss: 1))
        #expect(doubled.isDoubled && !doubled.isLost)
        let lost = LostPerson(uid: uid, plan: doubled.plan, problems: [Finding(.noDismiss, "none")])
        #expect(lost.isLost && !lost.isDoubled)
    }
}

@Suite struct FaultCoordinationTests {
    @Test func aFaultWaitsForEveryServiceItTouches() async {
        let locks = FaultLocks()
        let log = Mutex<[String]>([])
        await locks.acquire(["profile"])
        async let both: Void = {
            await locks.acquire(["auth", "profile"])
            log.withLock { $0.append("auth + profile") }
            locks.release(["auth", "profile"])
        }()
        // A disjoint fault goes ahead at once.
        await locks.acquire(["image-upload"])
        log.withLock { $0.append("image-upload") }
        locks.release(["image-upload"])
        log.withLock { $0.append("profile released") }
        locks.release(["profile"])
        await both
        #expect(log.withLock { $0 } == ["image-upload", "profile released", "auth + profile"])
    }

    @Test func theDriveWaitsForFaultsDueBeforeIt() async {
        let progress = FaultProgress(thresholds: [10, 20])
        await progress.waitUntilFired(upTo: 9)  // nothing is due yet
        let log = Mutex<[String]>([])
        async let held: Void = {
            await progress.waitUntilFired(upTo: 15)
            log.withLock { $0.append("person started") }
        }()
        log.withLock { $0.append("fault 0 fires") }
        progress.fired(0)
        await held
        #expect(log.withLock { $0 } == ["fault 0 fires", "person started"])
        // The end of the drive lets everyone go.
        progress.release()
        await progress.waitUntilFired(upTo: 100)
    }

    @Test func thresholdsFollowTheShareOfPeopleDone() {
        #expect(FaultScheduler.threshold(0.5, total: 200) == 100)
        #expect(FaultScheduler.threshold(0.001, total: 200) == 1)
        #expect(FaultScheduler.threshold(0.95, total: 10) == 10)
    }
}
