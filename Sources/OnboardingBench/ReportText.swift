import Foundation

/// The human-readable output: a latency table, a CPU table, errors, and baseline ratios.
enum ReportText {
    static func duration(_ microseconds: Double) -> String {
        if microseconds < 1000 { return String(format: "%.0f µs", microseconds) }
        if microseconds < 10_000 { return String(format: "%.2f ms", microseconds / 1000) }
        if microseconds < 1_000_000 { return String(format: "%.1f ms", microseconds / 1000) }
        return String(format: "%.2f s", microseconds / 1_000_000)
    }

    static func rate(_ perSecond: Double) -> String {
        perSecond >= 100 ? String(format: "%.0f/s", perSecond) : String(format: "%.1f/s", perSecond)
    }

    static func cpu(_ microseconds: Double?) -> String {
        guard let microseconds else { return "–" }
        return microseconds >= 100 ? String(format: "%.0f", microseconds) : String(format: "%.1f", microseconds)
    }

    private static func row(_ cells: [String], widths: [Int]) -> String {
        zip(cells, widths).map { cell, width in
            width < 0 ? cell.padding(toLength: -width, withPad: " ", startingAt: 0) : cell.leftPadded(to: width, with: " ")
        }.joined(separator: "  ")
    }

    static func table(_ report: BenchReport, scenario: Scenario) -> String {
        var lines: [String] = []
        lines.append(
            "onboarding-bench \(report.scenario): \(scenario.request) → \(scenario.expected.label); "
                + "latency from each request's scheduled send to its intent on route.<uid>")
        lines.append("started \(report.startedAt), \(report.cores) cores\(report.label.map { ", \($0)" } ?? "")")
        lines.append("")
        let max = report.mode == "max"
        let widths = [8, 7, 8, 5, 6, 9, 8, 8, 8, 8, 8, 8, 14, 6] + (max ? [5] : [])
        lines.append(row(
            ["offered", "sent", "received", "lost", "errors", "achieved", "p50", "p90", "p99", "p99.9", "max", "lag p99",
             "load (1/5 min)", "other"] + (max ? ["p99<\(Int((report.p99LimitMicroseconds ?? 0) / 1000)) ms"] : []),
            widths: widths))
        for step in report.steps {
            let load = step.loadAverage.prefix(2).map { String(format: "%.2f", $0) }.joined(separator: " ")
            lines.append(row(
                [rate(step.offeredRate), "\(step.sent)", "\(step.received)", "\(step.lost)", "\(step.errorCount)",
                 rate(step.achievedRate), duration(step.latency.p50), duration(step.latency.p90), duration(step.latency.p99),
                 duration(step.latency.p999), duration(step.latency.max), duration(step.sendLag.p99), load,
                 step.otherBusy.map { String(format: "%.2f", $0) } ?? "–"]
                    + (max ? [step.passed == true ? "pass" : "FAIL"] : []),
                widths: widths))
        }
        lines.append(
            "(lag: how late the load generator sent, counted in the latency; other: cores busy with anything but the services and the generator)")
        lines.append("")
        lines.append("CPU µs per request (user + system, /proc/<pid>/stat; share of one core over the window in brackets):")
        let database = report.steps.contains { $0.cpu.contains { $0.name == CPUProbe.database } } ? [CPUProbe.database] : []
        let names = CPUProbe.services + database + [CPUProbe.generator]
        let cpuWidths = [8] + names.map { Swift.max($0.count, 12) } + [12]
        lines.append(row(["offered"] + names + ["all services"], widths: cpuWidths))
        for step in report.steps {
            var cells = [rate(step.offeredRate)]
            for name in names {
                let usage = step.cpu.first { $0.name == name }
                let busy = usage?.busy.map { String(format: " (%.0f%%)", $0 * 100) } ?? ""
                cells.append(cpu(usage?.perOperation) + busy)
            }
            cells.append(cpu(step.servicesCPUPerOperation))
            lines.append(row(cells, widths: cpuWidths))
        }
        var notes: [String] = []
        for step in report.steps {
            var parts: [String] = []
            if !step.errors.isEmpty {
                parts.append("errors " + step.errors.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
            }
            if step.withoutReply > 0 { parts.append("\(step.withoutReply) without a reply") }
            if step.duplicates > 0 { parts.append("\(step.duplicates) intents delivered twice") }
            if step.unexpected > 0 { parts.append("\(step.unexpected) other intents for our people") }
            if !parts.isEmpty { notes.append("  at \(rate(step.offeredRate)): " + parts.joined(separator: "; ")) }
        }
        if !notes.isEmpty {
            lines.append("")
            lines += notes
        }
        if max {
            lines.append("")
            if let best = report.maxSustainedRate {
                lines.append("highest rate within the limits (p99 < \(duration(report.p99LimitMicroseconds ?? 0)), nothing lost, no errors, achieved ≥ 95 %): \(rate(best))")
            } else {
                lines.append("no step met the limits (p99 < \(duration(report.p99LimitMicroseconds ?? 0)), nothing lost, no errors, achieved ≥ 95 %)")
            }
        }
        return lines.joined(separator: "\n")
    }

    static func baseline(_ rows: [Baseline.Row], file: String, baseline: BenchReport) -> String {
        var lines = ["", "against \(file) (\(baseline.scenario), \(baseline.mode), \(baseline.startedAt)\(baseline.label.map { ", \($0)" } ?? "")): now ÷ then"]
        let widths = [-30, 12, 12, 8]
        lines.append(row(["", "now", "then", "ratio"], widths: widths))
        for row in rows {
            func show(_ value: Double?) -> String {
                guard let value else { return "–" }
                switch row.unit {
                case "µs": return row.name.hasPrefix("CPU") ? cpu(value) + " µs" : duration(value)
                case "/s": return rate(value)
                default: return String(format: "%.2f", value)
                }
            }
            let ratio = row.ratio.map { String(format: "%.2f×", $0) } ?? "–"
            lines.append(Self.row(["  " + row.name, show(row.current), show(row.baseline), ratio], widths: widths))
        }
        return lines.joined(separator: "\n")
    }
}
