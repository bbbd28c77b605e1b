import Foundation
import OnboardingAPI

/// The whole result as JSON (`--report-file`): the counts, and every person with what they did
/// and what is wrong, for looking into more than the first few lost people.
struct ReportFile: Encodable {
    struct Kill: Encodable {
        var service: String
        var planned: Int
        var kills: Int
        var recoverySeconds: [Double]
        var problems: [String]
    }

    struct Person: Encodable {
        var index: Int
        var provider: String
        var subject: String
        var uid: String?
        var username: String?
        var withImage: Bool
        var plannedToWithdraw: Bool
        var setUp: Bool
        var withdrew: Bool
        var stoppedAt: String?
        var error: String?
        /// Every rule this person's traces break (empty: consistent).
        var problems: [String]
        var notes: [String]
        var resends: Int
    }

    var seed: UInt64
    var run: String
    var passed: Bool
    var people: Int
    var couldNotFinish: Int
    var lost: Int
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
    var kills: [Kill]
    var elapsedSeconds: Double
    var driveSeconds: Double
    var everyone: [Person]

    init(_ summary: ChaosSummary) {
        let lostByIndex = Dictionary(
            uniqueKeysWithValues: summary.lost.map { ($0.plan.index, $0.problems.map { "\($0.rule.rawValue): \($0.detail)" }) })
        let counts = summary.recording
        seed = summary.plan.seed
        run = summary.plan.nonce
        passed = summary.passed
        people = summary.outcomes.count
        couldNotFinish = summary.unfinished.count
        lost = summary.lost.count
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
        kills = summary.kills.map {
            Kill(
                service: $0.service, planned: $0.planned, kills: $0.kills,
                recoverySeconds: $0.recoveries.map(Self.seconds), problems: $0.problems)
        }
        elapsedSeconds = Self.seconds(summary.elapsed)
        driveSeconds = Self.seconds(summary.driveTime)
        everyone = summary.outcomes.map { outcome in
            let plan = outcome.plan
            let key = StoreSnapshot.subjectKey(provider: plan.provider, subject: plan.subject)
            return Person(
                index: plan.index, provider: plan.provider.rawValue, subject: plan.subject,
                uid: outcome.uid ?? summary.uidsBySubject[key], username: plan.username, withImage: plan.withImage,
                plannedToWithdraw: plan.withdraws, setUp: outcome.setUp, withdrew: outcome.withdrew,
                stoppedAt: outcome.stopped?.step.rawValue, error: outcome.stopped?.error,
                problems: lostByIndex[plan.index] ?? [], notes: outcome.notes, resends: outcome.resends)
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
