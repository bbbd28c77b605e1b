import Foundation
import OnboardingAPI
import Testing

@testable import ChaosTest

@Suite struct RunPlanTests {
    let services = ["auth", "profile", "image-upload", "onboarding-orchestrator"]

    @Test func theSameSeedMakesTheSameChoices() {
        let first = RunPlan.make(seed: 42, nonce: "0000abcd", people: 500, kills: 3, services: services)
        let second = RunPlan.make(seed: 42, nonce: "0000abcd", people: 500, kills: 3, services: services)
        #expect(first.people == second.people)
        #expect(first.killPoints == second.killPoints)
        let other = RunPlan.make(seed: 43, nonce: "0000abcd", people: 500, kills: 3, services: services)
        #expect(other.people.map(\.setsUp) != first.people.map(\.setsUp))
    }

    @Test func usernamesAreValidAndUnique() {
        let plan = RunPlan.make(seed: 7, nonce: "12345678", people: 5_000, kills: 0, services: services)
        let names = plan.people.compactMap(\.username)
        #expect(Set(names.map(UsernameRules.uniquenessKey)).count == names.count)
        for name in names {
            #expect(UsernameRules.formatProblem(name) == nil, "\(name)")
            #expect(name.count <= 9)
            #expect(name.allSatisfy { $0.isLowercase || $0.isNumber || $0 == "_" })
        }
        // Another run's nonce gives other names.
        let other = RunPlan.make(seed: 7, nonce: "87654321", people: 5_000, kills: 0, services: services)
        #expect(Set(other.people.compactMap(\.username)).isDisjoint(with: names))
    }

    @Test func sharesAreRoughlyKept() {
        let plan = RunPlan.make(
            seed: 1, nonce: "00000001", people: 10_000, shares: .init(setUp: 0.8, image: 0.5, withdraw: 0.4), kills: 0,
            services: services)
        let setUp = plan.people.filter(\.setsUp).count
        let withImage = plan.people.filter(\.withImage).count
        let withdraws = plan.people.filter(\.withdraws).count
        #expect((7_700...8_300).contains(setUp))
        #expect((3_700...4_300).contains(withImage))
        #expect((3_700...4_300).contains(withdraws))
        #expect(plan.people.allSatisfy { !$0.withImage || $0.setsUp })
    }

    @Test func killsAreSpreadOverTheDrive() {
        let plan = RunPlan.make(seed: 9, nonce: "00000009", people: 10, kills: 3, services: services)
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
        stores.imageFiles[uid] = ["a.png"]
        let evidence = Evidence(
            people: [person(setUp: true, image: true, withdrew: false)], stores: stores,
            recording: recording([("p", .presentProfileSetup, .signedIn), ("d", .dismiss, .profileCreated)]),
            routeStates: state("d", .dismiss, .profileCreated))
        #expect(Verdict.lost(in: evidence).isEmpty)
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
        let evidence = Evidence(
            people: [person(setUp: false, withdrew: false)], stores: stores,
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
