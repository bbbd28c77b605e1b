import ArgumentParser
import ClientCommands
import Foundation
import OnboardingAPI
import OnboardingSettings

extension Scenario: ExpressibleByArgument {}

/// `--rate N` (requests per second) or `--rate max`.
enum RateOption: ExpressibleByArgument, Equatable, Sendable {
    case fixed(Double)
    case max

    init?(argument: String) {
        if argument == "max" {
            self = .max
        } else if let value = Double(argument), value > 0, value.isFinite {
            self = .fixed(value)
        } else {
            return nil
        }
    }

    var defaultValueDescription: String {
        switch self {
        case .fixed(let rate): "\(Int(rate))"
        case .max: "max"
        }
    }
}

/// `onboarding-bench`: the open-loop benchmark of the running system.
public struct BenchCommand: ParsableCommand {
    public static let configuration = CommandConfiguration(
        commandName: "onboarding-bench",
        abstract: "Open-loop benchmark: latency from each request's scheduled send time to its route intent, and CPU per request of each service.",
        discussion: """
            Scenarios:
              sign-in  auth.signIn for a new account (dev mode: a subject, no ID token) → presentProfileSetup (signedIn).
              check    onboarding.check from a signed-in person without a profile → presentProfileSetup (checkRequested),
                       after the orchestrator's profile look-up. Timed to the intent on route.<uid>, not to the reply.
              set-up   onboarding.setUpProfile without an image, a new username each → dismiss (profileCreated).
            check and set-up first sign in as many people as the step sends requests (untimed, --prep-window at a
            time) and wait for their presentProfileSetup; each person sends one timed request.

            The load generator: one thread sends on a DEALER to the service (auth for sign-in, the orchestrator
            otherwise) on a fixed schedule (request i at start + i/rate; it never waits for replies, so a slow
            system cannot slow the schedule: no coordinated omission), another thread receives route intents on a
            SUB to route. and timestamps them. Each request's JSON is built before the step; only its number (id,
            subject, username) is written into it at send time. Latency runs from the scheduled send time, so the
            generator's own lateness counts against it (shown as "lag p99").

            Before timing it waits until the route subscription is live: it signs in a warm-up person and waits
            for their intent (again every 250 ms, for up to 10 s), because a SUB socket only sees what is published
            after its subscription has reached the publisher, and nothing else tells when that is.

            --rate max: steps of --seconds each (or --count requests), starting at --start-rate and doubling while a
            step passes; after the first failure it bisects between the highest passing and the lowest failing rate
            until they are within 10 % of each other, or --max-steps steps have run. A step passes when p99 is under
            --p99-limit-ms, nothing is lost, no request gets an error (overloaded included), and the achieved rate is
            at least 95 % of the offered one. The steps run one after another on the same system (its tables grow).

            CPU: utime + stime of each service from /proc/<pid>/stat (pids from compose's <run-dir>/<name>.pid),
            read just before the first send and when the last intent has come, divided by the requests sent; and
            the load generator's own. Clock ticks are 10 ms, so short runs read coarsely.

            Run it with ./compose/onboarding bench (a fresh system on its own ports and data directory), or against a
            running system: ./compose/onboarding bench --target-running (endpoints from ONBOARDING_*; auth in dev mode).
            """)

    @Argument(help: "sign-in, check or set-up.")
    var scenario: Scenario

    @Option(help: "Requests per second, or max (see above).")
    var rate: RateOption = .fixed(1000)
    @Option(help: "Seconds of sending per step (count = rate × seconds).")
    var seconds: Double = 5
    @Option(help: "Requests per step (instead of --seconds).")
    var count: Int?

    @Option(help: "With --rate max: the first step's rate.")
    var startRate: Double = 500
    @Option(help: "With --rate max: the most steps.")
    var maxSteps: Int = 12
    @Option(help: "With --rate max: a step passes only with p99 under this, in milliseconds.")
    var p99LimitMs: Double = 10
    @Option(help: "With --rate max: seconds of rest between steps.")
    var pause: Double = 2

    @Option(help: "Write the whole result as JSON to this file.")
    var json: String?
    @Option(help: "Print ratios against a run saved with --json.")
    var baseline: String?
    @Option(help: "A note stored with the result (such as a commit).")
    var label: String?

    @Option(help: ArgumentHelp("For compose's pid files: " + Setting.dataDir.helpLine))
    var dataDir: String?
    @Option(help: "Where compose keeps the services' pid files. Default: <data-dir>/run")
    var runDir: String?
    @Option(help: "Sign-ins in flight at once while preparing people for check and set-up (untimed).")
    var prepWindow: Int = 64
    @Option(help: "Stop waiting for missing intents after this many seconds without progress.")
    var quietSeconds: Double = 5
    @Option(help: "Stop waiting for missing intents this many seconds after the last send.")
    var drainTimeout: Double = 60
    @Option(help: ArgumentHelp(
        "Send W3C trace context (traceparent) with every request, each a trace of its own, this percentage of them sampled (the rest carry it unsampled, as from a gateway that keeps that share): with services exporting traces (ONBOARDING_OTLP_ENDPOINT), those are traced through every hop.",
        valueName: "percent"))
    var traced: UInt64?

    @OptionGroup var endpoints: EndpointOptions

    public init() {}

    public func validate() throws {
        guard seconds > 0 else { throw ValidationError("--seconds must be above 0.") }
        if let count, count < 1 { throw ValidationError("--count must be at least 1.") }
        guard startRate >= 1, maxSteps >= 1, p99LimitMs > 0, pause >= 0, prepWindow >= 1, quietSeconds > 0, drainTimeout > 0 else {
            throw ValidationError("--start-rate, --max-steps, --prep-window must be at least 1; --p99-limit-ms, --quiet-seconds, --drain-timeout above 0.")
        }
        if let traced, traced > 100 { throw ValidationError("--traced takes a percentage, 0 to 100.") }
        if let baseline, !FileManager.default.fileExists(atPath: baseline) {
            throw ValidationError("--baseline \(baseline): no such file.")
        }
    }

    public func run() throws {
        var baselineReport: BenchReport?
        if let baseline {
            do {
                baselineReport = try JSONDecoder().decode(BenchReport.self, from: Data(contentsOf: URL(fileURLWithPath: baseline)))
            } catch {
                throw ValidationError("--baseline \(baseline) is not a result of onboarding-bench --json: \(error)")
            }
        }
        let dataDirectory = Settings(flags: [Setting.dataDir: dataDir].compactMapValues { $0 }).dataDirectory
        let settings = BenchSettings(
            scenario: scenario, authRPC: endpoints.authRPC.rawValue, orchestratorRPC: endpoints.orchestratorRPC.rawValue,
            routes: endpoints.routesEndpoint.rawValue,
            keys: try endpoints.busConfiguration(for: .bench, more: [.dataDir: dataDir]).keys, runDirectory: runDir ?? "\(dataDirectory)/run", prepWindow: prepWindow,
            quietSeconds: quietSeconds, drainTimeout: drainTimeout, tracedPercent: traced)
        let run = BenchRun(settings: settings, progress: Self.progress)
        if CPUProbe.services.contains(where: { run.probe.pid(of: $0) == nil }) {
            Self.progress("no pid files in \(settings.runDirectory ?? "?") for every service: CPU per service shows – where missing")
        }
        var report = BenchReport(
            scenario: scenario.rawValue, mode: rate == .max ? "max" : "fixed", startedAt: RequestFactory.timestamp(Date()),
            command: CommandLine.arguments, label: label, cores: ProcessInfo.processInfo.activeProcessorCount,
            p99LimitMicroseconds: rate == .max ? p99LimitMs * 1000 : nil, steps: [], maxSustainedRate: nil)

        do {
            try run.start()
            switch rate {
            case .fixed(let perSecond):
                let count = count ?? Swift.max(1, Int((perSecond * seconds).rounded()))
                Self.progress("\(scenario.rawValue): \(count) requests at \(ReportText.rate(perSecond))")
                report.steps.append(try run.runStep(rate: perSecond, count: count))
            case .max:
                var search = RateSearch(startRate: startRate, maxSteps: maxSteps)
                var next: Double? = search.first
                while let perSecond = next {
                    let count = count ?? Swift.max(1, Int((perSecond * seconds).rounded()))
                    Self.progress("step \(report.steps.count + 1): \(count) requests at \(ReportText.rate(perSecond))")
                    var step = try run.runStep(rate: perSecond, count: count)
                    step.passed = Self.passes(step, p99Limit: p99LimitMs * 1000)
                    Self.progress(
                        "  p50 \(ReportText.duration(step.latency.p50)), p99 \(ReportText.duration(step.latency.p99)), "
                            + "lost \(step.lost), errors \(step.errorCount), achieved \(ReportText.rate(step.achievedRate)): "
                            + (step.passed == true ? "pass" : "FAIL"))
                    report.steps.append(step)
                    next = search.next(after: perSecond, passed: step.passed == true)
                    if next != nil, pause > 0 { MonotonicClock.sleep(milliseconds: Int(pause * 1000)) }
                }
                report.maxSustainedRate = search.highestPass
            }
        } catch {
            run.stop()
            Self.progress("onboarding-bench: \(error)")
            throw ExitCode(2)
        }
        run.stop()

        print(ReportText.table(report, scenario: scenario))
        if let json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
            do {
                try encoder.encode(report).write(to: URL(fileURLWithPath: json))
                print("\nJSON: \(json)")
            } catch {
                Self.progress("onboarding-bench: could not write \(json): \(error)")
            }
        }
        if let baselineReport, let baseline {
            print(ReportText.baseline(Baseline.rows(current: report, baseline: baselineReport), file: baseline, baseline: baselineReport))
        }
        if report.mode == "fixed", let step = report.steps.last, step.lost > 0 || step.errorCount > 0 {
            throw ExitCode.failure
        }
    }

    /// Whether a `--rate max` step met the limits.
    static func passes(_ step: StepResult, p99Limit: Double) -> Bool {
        step.lost == 0 && step.errorCount == 0 && step.received == step.sent && step.latency.p99 < p99Limit
            && step.achievedRate >= 0.95 * step.offeredRate
    }

    @Sendable static func progress(_ text: String) {
        FileHandle.standardError.write(Data("[bench] \(text)\n".utf8))
    }
}
