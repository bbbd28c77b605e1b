import Foundation
import Histogram

/// Percentiles of a latency histogram recorded in nanoseconds, in microseconds.
struct LatencySummary: Codable, Sendable, Equatable {
    var count: UInt64
    var p50: Double
    var p90: Double
    var p99: Double
    var p999: Double
    var max: Double
    var mean: Double

    static let empty = LatencySummary(count: 0, p50: 0, p90: 0, p99: 0, p999: 0, max: 0, mean: 0)

    init(count: UInt64, p50: Double, p90: Double, p99: Double, p999: Double, max: Double, mean: Double) {
        self.count = count
        self.p50 = p50
        self.p90 = p90
        self.p99 = p99
        self.p999 = p999
        self.max = max
        self.mean = mean
    }

    /// Values are each percentile's value as HdrHistogram reports it (the highest value
    /// equivalent to it at three significant digits), converted to µs.
    init(_ histogram: Histogram<UInt64>) {
        guard histogram.totalCount > 0 else {
            self = .empty
            return
        }
        func us(_ nanoseconds: UInt64) -> Double { Double(nanoseconds) / 1000 }
        self.init(
            count: histogram.totalCount,
            p50: us(histogram.valueAtPercentile(50)), p90: us(histogram.valueAtPercentile(90)),
            p99: us(histogram.valueAtPercentile(99)), p999: us(histogram.valueAtPercentile(99.9)),
            max: us(histogram.max), mean: histogram.mean / 1000)
    }

    static func histogram() -> Histogram<UInt64> {
        // 1 ns to one hour, three significant digits.
        Histogram<UInt64>(highestTrackableValue: 3_600_000_000_000, numberOfSignificantValueDigits: .three)
    }
}

/// One timed step: a number of requests at one offered rate.
struct StepResult: Codable, Sendable, Equatable {
    var offeredRate: Double
    var count: Int
    var sent: Int
    /// Requests whose expected intent arrived (each once).
    var received: Int
    /// Requests with neither their intent nor an error reply.
    var lost: Int
    /// Error replies by code.
    var errors: [String: Int]
    /// Requests with no reply at all (their intent may still have come).
    var withoutReply: Int
    /// Intents for our people that arrived more than once.
    var duplicates: Int
    /// Intents for our people other than the one expected.
    var unexpected: Int
    /// From each request's scheduled send time to the arrival of its intent.
    var latency: LatencySummary
    /// How late the sender itself was against the schedule (its own lateness is in the latency too).
    var sendLag: LatencySummary
    /// Intents received per second, from the first scheduled send to the last intent.
    var achievedRate: Double
    /// Seconds from the first scheduled send to the last send.
    var sendSeconds: Double
    /// Seconds of the CPU window: from just before the first send until every intent had come
    /// (or the wait for the missing ones gave up).
    var windowSeconds: Double
    var cpu: [CPUUsage]
    /// Cores kept busy over the window by processes other than the services and the load
    /// generator (from `/proc/stat`): a figure well above 0 means the step was disturbed.
    var otherBusy: Double?
    var loadAverage: [Double]
    /// With `--rate max`: whether the step met the limits.
    var passed: Bool?

    var errorCount: Int { errors.values.reduce(0, +) }

    /// Sum over the four services (and PostgreSQL, when it ran) of CPU µs per operation (nil
    /// when one is missing).
    var servicesCPUPerOperation: Double? {
        let services = cpu.filter { CPUProbe.services.contains($0.name) || $0.name == CPUProbe.database }
        guard services.count >= CPUProbe.services.count else { return nil }
        var total = 0.0
        for usage in services {
            guard let value = usage.perOperation else { return nil }
            total += value
        }
        return total
    }
}

/// A whole run, as `--json` writes it and `--baseline` reads it.
struct BenchReport: Codable, Sendable {
    var tool = "onboarding-bench"
    var format = 1
    var scenario: String
    /// `"fixed"` (one rate) or `"max"` (stepping up to the highest rate within the limits).
    var mode: String
    var startedAt: String
    var command: [String]
    var label: String?
    var cores: Int
    var p99LimitMicroseconds: Double?
    var steps: [StepResult]
    /// With `--rate max`: the highest offered rate that met the limits.
    var maxSustainedRate: Double?

    /// The step a comparison uses: the highest passing step of a `max` run, else the last.
    var headline: StepResult? {
        if mode == "max", let best = steps.filter({ $0.passed == true }).max(by: { $0.offeredRate < $1.offeredRate }) {
            return best
        }
        return steps.last
    }
}

/// Ratios of a run against a saved one (current ÷ baseline: below 1 is better for times and
/// CPU, above 1 for rates).
enum Baseline {
    struct Row: Equatable, Sendable {
        var name: String
        var current: Double?
        var baseline: Double?
        var unit: String
        var ratio: Double? {
            guard let current, let baseline, baseline != 0 else { return nil }
            return current / baseline
        }
    }

    static func rows(current: BenchReport, baseline: BenchReport) -> [Row] {
        var rows: [Row] = []
        if current.mode == "max" || baseline.mode == "max" {
            rows.append(Row(name: "max sustained rate", current: current.maxSustainedRate, baseline: baseline.maxSustainedRate, unit: "/s"))
        }
        guard let now = current.headline, let then = baseline.headline else { return rows }
        rows += [
            Row(name: "offered rate", current: now.offeredRate, baseline: then.offeredRate, unit: "/s"),
            Row(name: "p50", current: now.latency.p50, baseline: then.latency.p50, unit: "µs"),
            Row(name: "p90", current: now.latency.p90, baseline: then.latency.p90, unit: "µs"),
            Row(name: "p99", current: now.latency.p99, baseline: then.latency.p99, unit: "µs"),
            Row(name: "p99.9", current: now.latency.p999, baseline: then.latency.p999, unit: "µs"),
            Row(name: "max", current: now.latency.max, baseline: then.latency.max, unit: "µs"),
            Row(name: "achieved rate", current: now.achievedRate, baseline: then.achievedRate, unit: "/s"),
        ]
        for name in CPUProbe.services + [CPUProbe.generator] {
            rows.append(Row(
                name: "CPU/op \(name)",
                current: now.cpu.first { $0.name == name }?.perOperation,
                baseline: then.cpu.first { $0.name == name }?.perOperation, unit: "µs"))
        }
        rows.append(Row(
            name: "CPU/op all services", current: now.servicesCPUPerOperation, baseline: then.servicesCPUPerOperation, unit: "µs"))
        return rows
    }
}
