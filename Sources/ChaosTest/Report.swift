import Foundation
import OnboardingAPI

/// The chaos test's text output.
public enum Report {
    /// How many lost and unfinished people are listed one by one.
    public static let listed = 20

    /// `12.3 s`, or right-aligned in `width` characters without the unit's space (`  12.3s`).
    static func seconds(_ duration: Duration, width: Int? = nil) -> String {
        let (whole, attoseconds) = duration.components
        let value = Double(whole) + Double(attoseconds) / 1e18
        let text = String(format: "%.1f", value)
        guard let width else { return text + " s" }
        return String(repeating: " ", count: max(0, width - text.count - 1)) + text + "s"
    }

    /// "3 SIGKILLs and 2 hangs of 2.0–4.0 s per service; 2 double kills; 2 whole-system restarts".
    static func faultPlan(_ faults: FaultCounts) -> String {
        func count(_ n: Int, _ one: String, _ many: String) -> String { "\(n) \(n == 1 ? one : many)" }
        let hangs = String(format: "%.1f–%.1f s", Double(faults.hangMilliseconds.lowerBound) / 1000, Double(faults.hangMilliseconds.upperBound) / 1000)
        return "\(count(faults.killsPerService, "SIGKILL", "SIGKILLs")) and \(count(faults.hangsPerService, "hang", "hangs")) (SIGSTOP \(hangs)) per service; "
            + "\(count(faults.doubleKills, "double kill", "double kills")); \(count(faults.systemRestarts, "whole-system restart", "whole-system restarts"))"
            + (faults.databasePauses + faults.databaseRestarts > 0
                ? "; PostgreSQL \(count(faults.databasePauses, "pause", "pauses")) and \(count(faults.databaseRestarts, "restart", "restarts"))" : "")
    }

    static func header(_ configuration: ChaosConfiguration, plan: RunPlan) -> String {
        let endpoints = configuration.endpoints
        let shares = configuration.shares
        func percent(_ share: Double) -> String { "\(Int((share * 100).rounded())) %" }
        return """
            onboarding-chaos: seed \(plan.seed) (repeat the run with --seed \(plan.seed)), run \(plan.nonce)
              \(configuration.people) people, \(configuration.concurrency) at a time: \(percent(shares.setUp)) set up (\(percent(shares.image)) of them with an image), \(percent(shares.withdraw)) withdraw, \(percent(shares.twoDevices)) on two devices, \(percent(shares.checks)) check often, \(percent(shares.endSignedOut)) of the rest end signed out
              faults: \(faultPlan(configuration.faults))
              auth \(endpoints.authRPC)  profile \(endpoints.profileRPC)  image-upload \(endpoints.imageRPC)
              orchestrator \(endpoints.orchestratorRPC)  routes \(endpoints.routes)
              stores \(stores(configuration.stores))
              pid files \(configuration.runDirectory)/<service>.pid
            """
    }

    /// Where auth's and profile's stores and the images are, as the inspector reads them.
    static func stores(_ stores: StoreLocations) -> String {
        [
            stores.authPostgres.map { "auth in \($0)" } ?? stores.authDatabase,
            stores.profilePostgres.map { "profile in \($0)" } ?? stores.profileDatabase,
            stores.imageDirectory + "/",
        ].joined(separator: ", ")
    }

    /// The summary rows of the faults that happened.
    static func faultRows(_ faults: [FaultReport]) -> [(String, String)] {
        var kills: [String: Int] = [:]
        var hangs: [String: Int] = [:]
        var order: [String] = []
        var hangLengths: [Duration] = []
        var hangsAfterSetUp = 0
        var pairs: [String] = []
        var restarts: [String] = []
        var databasePauses: [Duration] = []
        var databaseRestarts = 0
        var late = 0
        for report in faults where report.happened {
            if report.afterDrive { late += 1 }
            switch report.fault.kind {
            case .kill(let service):
                kills[service, default: 0] += 1
                if !order.contains(service) { order.append(service) }
            case .hang(let service, _, let afterSetUp):
                hangs[service, default: 0] += 1
                if !order.contains(service) { order.append(service) }
                if let took = report.took { hangLengths.append(took) }
                if afterSetUp { hangsAfterSetUp += 1 }
            case .killTwo(let first, let second): pairs.append("\(first) + \(second)")
            case .restartAll(let signal): restarts.append(signal.rawValue)
            case .pauseDatabase: databasePauses.append(report.took ?? .zero)
            case .restartDatabase: databaseRestarts += 1
            }
        }
        func perService(_ counts: [String: Int]) -> String {
            order.compactMap { name in counts[name].map { "\(name) \($0)" } }.joined(separator: ", ")
        }
        var rows: [(String, String)] = []
        rows.append(("kills", kills.isEmpty ? "none" : "\(perService(kills))  (SIGKILL, one service)"))
        if hangLengths.isEmpty {
            rows.append(("hangs", "none"))
        } else {
            let shortest = hangLengths.min()!, longest = hangLengths.max()!
            rows.append((
                "hangs",
                "\(perService(hangs))  (SIGSTOP \(seconds(shortest))–\(seconds(longest)), then SIGCONT; "
                    + "\(hangsAfterSetUp) right after a set-up was sent)"))
        }
        rows.append(("two at once", pairs.isEmpty ? "none" : "\(pairs.count)  (SIGKILL \(pairs.joined(separator: "; ")))"))
        rows.append((
            "whole system", restarts.isEmpty ? "none" : "\(restarts.count)  (every service at once: \(restarts.joined(separator: ", ")))"))
        if !databasePauses.isEmpty || databaseRestarts > 0 {
            let pauses = databasePauses.isEmpty ? "no pause" : "\(databasePauses.count) paused (SIGSTOP \(seconds(databasePauses.min()!))–\(seconds(databasePauses.max()!)))"
            rows.append(("PostgreSQL", "\(pauses), \(databaseRestarts) restarted at once (pg_ctl restart -m immediate)"))
        }
        if late > 0 { rows.append(("faults after the drive", "\(late)  (they waited for another fault of their services)")) }
        return rows
    }

    /// The result: counts first, then what went wrong, person by person.
    public static func summary(_ summary: ChaosSummary) -> String {
        var lines: [String] = []
        func row(_ label: String, _ value: String) {
            lines.append("  " + label.padding(toLength: 22, withPad: " ", startingAt: 0) + value)
        }
        let finished = summary.outcomes.filter(\.finished)
        let setUp = finished.filter(\.setUp)
        let counts = summary.recording
        lines.append("")
        lines.append("onboarding-chaos result (seed \(summary.plan.seed))")
        let endedSignedOut = finished.filter { !$0.withdrew && !$0.timeline.signedInAtEnd }.count
        row(
            "people",
            "\(summary.outcomes.count)  (\(setUp.count) set up, \(setUp.filter(\.plan.withImage).count) with an image; "
                + "\(finished.filter(\.withdrew).count) withdrew, \(endedSignedOut) ended signed out; "
                + "\(summary.outcomes.filter { $0.plan.devices > 1 }.count) on two devices, "
                + "\(summary.outcomes.filter(\.plan.checksOften).count) checked often)")
        row("could not finish", "\(summary.unfinished.count)")
        for line in faultRows(summary.faults) { row(line.0, line.1) }
        row(
            "intents recorded",
            "\(counts.intents) decisions (distinct intentIds) in \(counts.deliveries) deliveries (route sequences): "
                + "\(counts.deliveries - counts.filled) live, \(counts.filled) filled from events.after")
        row("repeats", "\(counts.repeats)  (the intent in force published again: same intentId, new route sequence)")
        row("duplicates delivered", "\(counts.duplicatesDelivered)  (a route sequence delivered live more than once)")
        row(
            "deduplicated",
            "\(counts.deduplicated)  (dropped as already recorded: \(counts.duplicatesDelivered) live, "
                + "\(counts.deduplicated - counts.duplicatesDelivered) from events.after)")
        for feed in summary.feeds {
            row(
                "orchestrator feed",
                "\(feed.publisher): \(feed.handled) handled, \(feed.replayed) from events.after, \(feed.duplicatesDropped) duplicates dropped, \(feed.lost) lost (since its last start)")
        }
        let byRule = Dictionary(grouping: summary.inconsistent.flatMap { Set($0.problems.map(\.rule)) }, by: { $0 })
            .mapValues(\.count)
        row("lost", "\(summary.lost.count)")
        for rule in Rule.allCases where !rule.isDoubling {
            if let count = byRule[rule] { row("", "- \(count): \(rule.rawValue)") }
        }
        let doubled = summary.doubledIntents
        row(
            "doubled",
            "\(summary.doubled.count)  (people with a decision made twice: \(doubled.dismiss) extra dismiss, "
                + "\(doubled.presentProfileSetup) extra presentProfileSetup)")
        row("resends", "\(summary.outcomes.reduce(0) { $0 + $1.resends })  (requests sent again after a transient failure)")
        row(
            "elapsed",
            "\(seconds(summary.elapsed))  (drive \(seconds(summary.driveTime)), settling \(seconds(summary.settleTime)) "
                + "over \(summary.settleRounds) check\(summary.settleRounds == 1 ? "" : "s"))")
        switch summary.replay {
        case .filled(_, let through): row("replay", "events.after read through route sequence \(through)")
        case .unavailable(let reason): row("replay", "unavailable (\(reason)): nothing missed live could be filled")
        }
        switch summary.routeState {
        case .success(let count): row("route state", "onboarding.routes: \(count) people with an intent in force")
        case .failure(let why):
            row("route state", "unavailable (\(why.reason)): final intents judged from the recording, withdrawals from the stores only")
        }
        row("intent order", summary.order == .sequence ? "by route sequence" : "by arrival (route sequence not durable or not replayable)")
        if counts.sequenceReused > 0 {
            row("sequence reused", "\(counts.sequenceReused)  (different intents with one route sequence number: it restarted)")
        }
        if counts.pruned > 0 { row("pruned", "\(counts.pruned)  (events.after no longer had them)") }
        if counts.unreadable > 0 { row("unreadable", "\(counts.unreadable)  (messages on route. that were not intents)") }
        if summary.droppedByBus > 0 { row("dropped by the bus", "\(summary.droppedByBus)  (the recorder's queue overflowed)") }
        let notes = summary.outcomes.reduce(0) { $0 + $1.notes.count }
        if notes > 0 { row("explained by resends", "\(notes)  (answers a resend explains, e.g. a resent sign-up no longer new)") }

        if !summary.runProblems.isEmpty {
            lines.append("")
            lines.append("run problems:")
            for problem in summary.runProblems { lines.append("  \(problem)") }
        }
        let failed = summary.faultsFailed
        if !failed.isEmpty {
            lines.append("")
            lines.append("faults that did not happen, or after which a service did not come back:")
            for fault in failed {
                lines.append("  \(fault.fault.label): \(fault.happened ? "" : "did not happen; ")\(fault.problems.joined(separator: "; "))")
            }
        }
        if !summary.inconsistent.isEmpty {
            lines.append("")
            lines.append(
                "lost or doubled (first \(min(listed, summary.inconsistent.count)) of \(summary.inconsistent.count)):")
            for person in summary.inconsistent.prefix(listed) {
                lines.append("  \(person.uid)  person #\(person.plan.index), \(person.plan.summary):")
                for problem in person.problems { lines.append("    - \(problem)") }
            }
        }
        let unfinished = summary.unfinished
        if !unfinished.isEmpty {
            lines.append("")
            lines.append("could not finish (first \(min(listed, unfinished.count)) of \(unfinished.count)):")
            for person in unfinished.prefix(listed) {
                let key = StoreSnapshot.subjectKey(provider: person.plan.provider, subject: person.plan.subject)
                let uid = person.uid ?? summary.uidsBySubject[key] ?? "(no account: \(key))"
                let stop = person.stopped.map { "stopped at \($0.step.rawValue): \($0.error)" } ?? ""
                lines.append("  \(uid)  person #\(person.plan.index), \(person.plan.summary): \(stop)")
            }
        }
        lines.append("")
        lines.append(summary.passed ? "PASS" : "FAIL")
        return lines.joined(separator: "\n")
    }
}
