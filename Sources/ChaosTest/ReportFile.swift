import Foundation
import OnboardingAPI

/// The whole result as JSON (`--report-file`): the counts, and every person with what they did
/// and what is wrong, for looking into more than the first few lost people.
struct ReportFile: Encodable {
    struct Fault: Encodable {
        /// "SIGKILL auth", "SIGSTOP profile for 2.8 s right after a set-up began", …
        var fault: String
        var plannedAt: Double
        var happened: Bool
        var peopleDone: Int
        var afterDrive: Bool
        /// A hang: how long the service was stopped; a kill or restart: until every service answered again.
        var seconds: Double?
        var problems: [String]
    }

    struct Intent: Encodable {
        var sequence: UInt64
        var intentId: String
        var intent: String
        var reason: String
        var live: Bool
        /// The same intentId was recorded before under another route sequence.
        var repeatOfEarlier: Bool
    }

    struct Person: Encodable {
        var index: Int
        var provider: String
        var subject: String
        var uid: String?
        var username: String?
        var withImage: Bool
        var plannedToWithdraw: Bool
        var devices: Int
        var checksOften: Bool
        var plannedToEndSignedOut: Bool
        var setUp: Bool
        var withdrew: Bool
        var stoppedAt: String?
        var error: String?
        /// Every rule this person's traces break (empty: consistent).
        var problems: [String]
        var doubledDismiss: Int
        var doubledPresentProfileSetup: Int
        var notes: [String]
        var resends: Int
        /// What the driver did, in order.
        var deeds: [String]
        /// The person's deliveries as recorded, in route-sequence order.
        var intents: [Intent]
    }

    var seed: UInt64
    var run: String
    var passed: Bool
    var people: Int
    var couldNotFinish: Int
    var lost: Int
    /// People who got a decision twice for one state change, and the extra decisions by kind.
    var doubled: Int
    var doubledDismiss: Int
    var doubledPresentProfileSetup: Int
    /// Distinct intentIds recorded.
    var intentsRecorded: Int
    /// Distinct route sequences recorded (decisions and repeats).
    var deliveries: Int
    /// The intent in force published again: same intentId, new route sequence.
    var repeats: Int
    var liveDeliveries: Int
    var filledFromEventsAfter: Int
    var duplicatesDelivered: Int
    var deduplicated: Int
    var sequenceReused: Int
    var intentOrder: String
    var replay: String
    var routeState: String
    var runProblems: [String]
    var faults: [Fault]
    var elapsedSeconds: Double
    var driveSeconds: Double
    var everyone: [Person]

    init(_ summary: ChaosSummary) {
        let flagged = Dictionary(uniqueKeysWithValues: summary.inconsistent.map { ($0.plan.index, $0) })
        let counts = summary.recording
        seed = summary.plan.seed
        run = summary.plan.nonce
        passed = summary.passed
        people = summary.outcomes.count
        couldNotFinish = summary.unfinished.count
        lost = summary.lost.count
        doubled = summary.doubled.count
        doubledDismiss = summary.doubledIntents.dismiss
        doubledPresentProfileSetup = summary.doubledIntents.presentProfileSetup
        intentsRecorded = counts.intents
        deliveries = counts.deliveries
        repeats = counts.repeats
        liveDeliveries = counts.liveDeliveries
        filledFromEventsAfter = counts.filled
        duplicatesDelivered = counts.duplicatesDelivered
        deduplicated = counts.deduplicated
        sequenceReused = counts.sequenceReused
        intentOrder = summary.order.rawValue
        switch summary.replay {
        case .filled(_, let through): replay = "read through route sequence \(through)"
        case .unavailable(let reason): replay = "unavailable: \(reason)"
        }
        switch summary.routeState {
        case .success(let count): routeState = "\(count) people with an intent in force"
        case .failure(let why): routeState = "unavailable: \(why.reason)"
        }
        runProblems = summary.runProblems
        faults = summary.faults.map {
            Fault(
                fault: $0.fault.label, plannedAt: $0.fault.point, happened: $0.happened, peopleDone: $0.peopleDone,
                afterDrive: $0.afterDrive, seconds: $0.took.map(Self.seconds), problems: $0.problems)
        }
        elapsedSeconds = Self.seconds(summary.elapsed)
        driveSeconds = Self.seconds(summary.driveTime)
        everyone = summary.outcomes.map { outcome in
            let plan = outcome.plan
            let key = StoreSnapshot.subjectKey(provider: plan.provider, subject: plan.subject)
            let uid = outcome.uid ?? summary.uidsBySubject[key]
            var seen = Set<String>()
            let intents = (uid.flatMap { summary.intentsByUID[$0] } ?? []).map {
                Intent(
                    sequence: $0.sequence, intentId: $0.intentId, intent: $0.kind.rawValue, reason: $0.reason.rawValue,
                    live: $0.live, repeatOfEarlier: !seen.insert($0.intentId).inserted)
            }
            let person = flagged[plan.index]
            return Person(
                index: plan.index, provider: plan.provider.rawValue, subject: plan.subject,
                uid: uid, username: plan.username, withImage: plan.withImage,
                plannedToWithdraw: plan.withdraws, devices: plan.devices, checksOften: plan.checksOften,
                plannedToEndSignedOut: plan.endsSignedOut, setUp: outcome.setUp, withdrew: outcome.withdrew,
                stoppedAt: outcome.stopped?.step.rawValue, error: outcome.stopped?.error,
                problems: person?.problems.map { "\($0.rule.rawValue): \($0.detail)" } ?? [],
                doubledDismiss: person?.doubled.dismiss ?? 0,
                doubledPresentProfileSetup: person?.doubled.presentProfileSetup ?? 0,
                notes: outcome.notes, resends: outcome.resends, deeds: outcome.deeds.map(\.description), intents: intents)
        }
    }

    static func seconds(_ duration: Duration) -> Double {
        let (whole, attoseconds) = duration.components
        return Double(whole) + Double(attoseconds) / 1e18
    }

    /// Writes the report to `path` (on the blocking queue).
    static func write(_ summary: ChaosSummary, to path: String) async throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        let data = try encoder.encode(ReportFile(summary))
        try await Blocking.run { try data.write(to: URL(fileURLWithPath: path), options: .atomic) }
    }
}
