import Foundation
import OnboardingAPI
import Testing

@testable import OnboardingBench
import TestSupport

@Suite struct LatencySummaryTests {
    @Test func percentilesOfAKnownDistribution() {
        var histogram = LatencySummary.histogram()
        // 1 µs … 1,000 µs, one each (in nanoseconds).
        for microseconds in 1...1000 { histogram.record(UInt64(microseconds) * 1000) }
        let summary = LatencySummary(histogram)
        #expect(summary.count == 1000)
        // Three significant digits: each value within 0.1 % of the exact one.
        #expect(abs(summary.p50 - 500) <= 0.5)
        #expect(abs(summary.p90 - 900) <= 0.9)
        #expect(abs(summary.p99 - 990) <= 1)
        #expect(abs(summary.p999 - 999) <= 1)
        #expect(abs(summary.max - 1000) <= 1)
        #expect(abs(summary.mean - 500.5) <= 0.5)
    }

    @Test func anEmptyHistogramIsAllZero() {
        #expect(LatencySummary(LatencySummary.histogram()) == .empty)
    }

    @Test func aSlowTailShowsInTheHighPercentilesOnly() {
        var histogram = LatencySummary.histogram()
        for _ in 0..<990 { histogram.record(500_000) }  // 500 µs
        for _ in 0..<10 { histogram.record(40_000_000) }  // 40 ms
        let summary = LatencySummary(histogram)
        #expect(abs(summary.p50 - 500) <= 0.5)
        #expect(abs(summary.p99 - 500) <= 0.5)
        #expect(abs(summary.p999 - 40_000) <= 40)
        #expect(abs(summary.max - 40_000) <= 40)
    }
}

@Suite struct ProcStatTests {
    @Test func readsUserAndSystemTicks() {
        let text = "1234 (auth-service) S 1 1234 1234 0 -1 4194560 2071 0 0 0 157 42 0 0 20 0 9 0 1061 1234567 890 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0"
        #expect(ProcStat.parse(text) == ProcStat.Times(userTicks: 157, systemTicks: 42))
    }

    @Test func aCommandNameWithSpacesAndParenthesesDoesNotShiftTheFields() {
        let text = "77 (a (b) c) R 1 77 77 0 -1 0 0 0 0 0 1000 2000 0 0 20 0 1 0 5 0 0 0\n"
        #expect(ProcStat.parse(text) == ProcStat.Times(userTicks: 1000, systemTicks: 2000))
    }

    @Test func truncatedOrForeignTextIsRefused() {
        #expect(ProcStat.parse("") == nil)
        #expect(ProcStat.parse("12 (x) S 1 2 3") == nil)
        #expect(ProcStat.parse("12 (x) S 1 2 3 4 5 6 7 8 9 10 eleven 12") == nil)
    }

    @Test func ourOwnProcessCanBeRead() {
        #expect(ProcStat.read(pid: getpid()) != nil)
    }

    @Test func theParentIsField4() {
        #expect(ProcStat.parent("77 (a (b) c) R 1 77 77 0 -1 0 0 0 0 0 1000 2000 0 0 20 0 1 0 5 0 0 0\n") == 1)
        #expect(ProcStat.parent("5 (postgres: onboarding onboarding 127.0.0.1(50112) idle) S 4321 5 5 0") == 4321)
        #expect(ProcStat.parent("garbage") == nil)
    }

    @Test func aFamilyCountsTheChildrenToo() throws {
        // A child that burns some CPU, then waits: its time is in our family's, not in ours alone.
        let child = try ChildProcess(
            URL(fileURLWithPath: "/bin/sh"), arguments: ["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 5"])
        defer {
            child.terminate()
            child.waitUntilExit()
        }
        let pid = getpid()
        var family = ProcStat.Times(userTicks: 0, systemTicks: 0)
        for _ in 0..<100 {
            family = try #require(ProcStat.readFamily(pid: pid))
            let own = try #require(ProcStat.read(pid: pid))
            if family.totalTicks > own.totalTicks { break }
            usleep(50_000)
        }
        #expect(try family.totalTicks > #require(ProcStat.read(pid: pid)).totalTicks)
    }

    @Test func machineBusyTicksLeaveOutIdleAndIOWait() {
        let text = "cpu  100 5 50 9000 40 3 2 1 0 0\ncpu0 50 2 25 4500 20 1 1 0 0 0\n"
        #expect(ProcStat.parseMachine(text) == 100 + 5 + 50 + 3 + 2 + 1)
        #expect(ProcStat.parseMachine("intr 1 2 3") == nil)
    }

    @Test func otherBusyIsTheMachineLessOurProcesses() throws {
        var before = CPUProbe.Sample()
        before.machine = 1000
        before.taken = 0
        var after = before
        after.machine = 1000 + ProcStat.ticksPerSecond * 3 / 2  // 1.5 core-seconds over 1 s
        after.taken = 1_000_000_000
        let usage = [CPUUsage(name: "auth", pid: 1, microseconds: 1_000_000, perOperation: nil, busy: nil)]
        let other = try #require(CPUProbe.otherBusy(from: before, to: after, usage: usage))
        #expect(abs(other - 0.5) < 1e-9)
    }

    @Test func usagePerOperationAndShareOfACore() {
        var before = CPUProbe.Sample()
        before.pids = ["auth": 10, "profile": 11, "onboarding-bench": 12]
        before.times = ["auth": .init(userTicks: 100, systemTicks: 50), "profile": .init(userTicks: 5, systemTicks: 5),
                        "onboarding-bench": .init(userTicks: 0, systemTicks: 0)]
        before.taken = 0
        var after = before
        after.times["auth"] = .init(userTicks: 150, systemTicks: 100)  // +100 ticks = 1 s at 100 Hz
        after.pids["profile"] = 99  // restarted: no figure
        after.taken = 2_000_000_000
        let usage = CPUProbe.usage(from: before, to: after, operations: 1000)
        let auth = usage.first { $0.name == "auth" }
        let seconds = Double(100) / Double(ProcStat.ticksPerSecond)
        #expect(auth?.microseconds == seconds * 1e6)
        #expect(auth?.perOperation == seconds * 1e6 / 1000)
        #expect(auth?.busy == seconds / 2)
        #expect(usage.first { $0.name == "profile" }?.perOperation == nil)
        #expect(usage.first { $0.name == "image-upload" }?.perOperation == nil)
        #expect(usage.first { $0.name == "onboarding-bench" }?.perOperation == 0)
    }
}

@Suite struct RateSearchTests {
    /// Runs the search against a system that sustains up to `capacity` per second.
    func steps(start: Double, capacity: Double, maxSteps: Int = 12) -> (rates: [Double], best: Double?) {
        var search = RateSearch(startRate: start, maxSteps: maxSteps)
        var rates: [Double] = []
        var next: Double? = search.first
        while let rate = next {
            rates.append(rate)
            next = search.next(after: rate, passed: rate <= capacity)
        }
        return (rates, search.highestPass)
    }

    @Test func doublesThenBisects() {
        let (rates, best) = steps(start: 500, capacity: 2600)
        // Doubling until 4,000 fails; then halfway between 2,000 and 4,000, and so on, until
        // the highest pass (2,500) and the lowest failure (2,750) are within 10 %.
        #expect(rates == [500, 1000, 2000, 4000, 3000, 2500, 2750])
        #expect(best == 2500)
    }

    @Test func aFailingFirstStepGoesDown() {
        let (rates, best) = steps(start: 500, capacity: 150)
        #expect(Array(rates.prefix(3)) == [500, 250, 125])
        #expect(best != nil && best! <= 150 && best! >= 125)
    }

    @Test func nothingPassesAboveTheMinimum() {
        let (rates, best) = steps(start: 40, capacity: 1)
        #expect(rates == [40, 20, 10])
        #expect(best == nil)
    }

    @Test func stopsAfterMaxSteps() {
        let (rates, best) = steps(start: 100, capacity: .infinity, maxSteps: 5)
        #expect(rates == [100, 200, 400, 800, 1600])
        #expect(best == 1600)
    }

    @Test func roundsToThreeSignificantDigits() {
        #expect(RateSearch.round(2874.5) == 2870)
        #expect(RateSearch.round(12_345) == 12_300)
        #expect(RateSearch.round(57.4) == 57)
        #expect(RateSearch.round(1000) == 1000)
    }
}

@Suite struct BaselineTests {
    func step(rate: Double, p50: Double, p99: Double, auth: Double, passed: Bool? = nil) -> StepResult {
        let cpu = CPUProbe.services.map { name in
            CPUUsage(name: name, pid: 1, microseconds: nil, perOperation: name == "auth" ? auth : 10, busy: nil)
        } + [CPUUsage(name: CPUProbe.generator, pid: 2, microseconds: nil, perOperation: 5, busy: nil)]
        return StepResult(
            offeredRate: rate, count: 100, sent: 100, received: 100, lost: 0, errors: [:], withoutReply: 0, duplicates: 0,
            unexpected: 0, latency: LatencySummary(count: 100, p50: p50, p90: p50, p99: p99, p999: p99, max: p99, mean: p50),
            sendLag: .empty, achievedRate: rate, sendSeconds: 1, windowSeconds: 1, cpu: cpu, otherBusy: 0, loadAverage: [], passed: passed)
    }

    func report(_ mode: String, _ steps: [StepResult], max: Double? = nil) -> BenchReport {
        BenchReport(
            scenario: "sign-in", mode: mode, startedAt: "2026-11-23T10:00:00.000Z", command: [], label: nil, cores: 2,
            p99LimitMicroseconds: nil, steps: steps, maxSustainedRate: max)
    }

    @Test func ratiosAreNowOverThen() throws {
        let now = report("fixed", [step(rate: 1000, p50: 600, p99: 1500, auth: 100)])
        let then = report("fixed", [step(rate: 1000, p50: 1800, p99: 34_000, auth: 500)])
        let rows = Baseline.rows(current: now, baseline: then)
        let p50 = try #require(rows.first { $0.name == "p50" })
        #expect(p50.ratio.map { abs($0 - 1.0 / 3.0) < 1e-9 } == true)
        #expect(rows.first { $0.name == "CPU/op auth" }?.ratio == 0.2)
        // All services: 100 + 3 × 10 = 130 against 500 + 30 = 530.
        let all = try #require(rows.first { $0.name == "CPU/op all services" })
        #expect(all.current == 130 && all.baseline == 530)
        #expect(!rows.contains { $0.name == "max sustained rate" })
    }

    @Test func aMaxRunComparesItsBestPassingStep() {
        let now = report(
            "max",
            [step(rate: 500, p50: 500, p99: 900, auth: 100, passed: true), step(rate: 1000, p50: 550, p99: 950, auth: 90, passed: true),
             step(rate: 2000, p50: 9000, p99: 90_000, auth: 80, passed: false)],
            max: 1000)
        let then = report("max", [step(rate: 500, p50: 1000, p99: 5000, auth: 200, passed: true)], max: 500)
        #expect(now.headline?.offeredRate == 1000)
        let rows = Baseline.rows(current: now, baseline: then)
        #expect(rows.first { $0.name == "max sustained rate" }?.ratio == 2)
        #expect(rows.first { $0.name == "p50" }?.ratio == 0.55)
    }

    @Test func aMissingFigureHasNoRatio() {
        #expect(Baseline.Row(name: "x", current: 1, baseline: nil, unit: "µs").ratio == nil)
        #expect(Baseline.Row(name: "x", current: 1, baseline: 0, unit: "µs").ratio == nil)
    }

    @Test func aReportSurvivesJSON() throws {
        let original = report("fixed", [step(rate: 1000, p50: 600, p99: 1500, auth: 100)])
        let decoded = try JSONDecoder().decode(BenchReport.self, from: JSONEncoder().encode(original))
        #expect(decoded.steps == original.steps)
        #expect(decoded.mode == "fixed")
    }
}

@Suite struct WireTests {
    let factory = RequestFactory(runTag: "0a1b2c3d", time: "2026-11-23T10:00:00.000Z")

    @Test func aSignInTemplateTakesEachRequestsNumber() throws {
        let text = factory.signIn().text(for: 0x2a)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
        #expect(object["id"] as? String == "0a1b2c3d-0000-4000-8000-00000000002a")
        #expect(object["type"] as? String == "auth.signIn")
        #expect(object["sequence"] as? Int == 0)
        let payload = try #require(object["payload"] as? [String: Any])
        #expect(payload["subject"] as? String == "bench-0a1b2c3d-00000000002a")
        #expect(payload["provider"] as? String == "kakao")
        #expect(UUID(uuidString: object["id"] as! String) != nil)
    }

    @Test func tracedRequestsCarryATraceOfTheirOwnSampledAsAsked() throws {
        let traced = RequestFactory(runTag: "0a1b2c3d", time: "2026-11-23T10:00:00.000Z", tracedPercent: 10)
        func traceparent(_ number: UInt64) throws -> String {
            let text = traced.signIn().text(for: number)
            let object = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
            return try #require(object["traceparent"] as? String)
        }
        #expect(try traceparent(0x2a) == "00-0a1b2c3d00000000000000000000002a-00f067aa0000002a-00")
        #expect(try traceparent(105) == "00-0a1b2c3d000000000000000000000069-00f067aa00000069-01")
        let sampled = try (0..<1000).filter { try traceparent(UInt64($0)).hasSuffix("-01") }
        #expect(sampled.count == 100)
        #expect(!factory.signIn().text(for: 1).contains("traceparent"))
    }

    @Test func setUpUsernamesAreValidAndUnique() throws {
        var names = Set<String>()
        for number: UInt64 in [1, 2, 35, 36, 1_000_000, 2_176_782_335] {
            let text = factory.setUp(sessionToken: Array("tok".utf8)).text(for: number)
            let object = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
            #expect(object["sessionToken"] as? String == "tok")
            let username = try #require((object["payload"] as? [String: Any])?["username"] as? String)
            #expect(username.count == 9)
            #expect(UsernameRules.formatProblem(username) == nil)
            names.insert(UsernameRules.uniquenessKey(username))
        }
        #expect(names.count == 6)
    }

    @Test func repliesAndIntentsAreReadInPlace() {
        let reply = #"{"correlationId":"x","id":"y","payload":{"isNewAccount":true,"provider":"kakao","sessionToken":"q7Vn2xK9pLm4","uid":"3f2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40"},"sequence":0,"source":"auth","time":"t","type":"auth.signIn.reply","version":1}"#
        let reading = Array(reply.utf8).withUnsafeBytes { ReplyReading.read($0, wantUID: true, wantToken: true) }
        #expect(reading == .success(uid: UUIDKey("3f2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40"), sessionToken: Array("q7Vn2xK9pLm4".utf8)))

        let error = #"{"id":"e", "payload": {"code" : "overloaded", "message":"busy"}, "type": "error"}"#
        #expect(Array(error.utf8).withUnsafeBytes { ReplyReading.read($0, wantUID: true, wantToken: false) } == .error(code: "overloaded"))

        let intent = #"{"id":"i","payload":{"intent":"dismiss","intentId":"k","reason":"profileCreated","uid":"u"},"type":"route.intent"}"#
        let observed = Array(intent.utf8).withUnsafeBytes {
            ObservedIntent(intent: WireScan.stringValue("intent", in: $0), reason: WireScan.stringValue("reason", in: $0))
        }
        #expect(observed == .dismissProfileCreated)
    }

    @Test func uidsRoundTrip() {
        let text = "3f2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40"
        #expect(UUIDKey(text)?.description == text)
        #expect(UUIDKey("3f2b8c1e") == nil)
        #expect(UUIDKey("zf2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40") == nil)
    }
}

@Suite struct PartsCommandTests {
    @Test("the parts benchmark runs every piece, and refuses a count of 0")
    func runs() throws {
        let command = try PartsCommand.parse(["--count", "20", "--rounds", "1"])
        try command.run()
        #expect(throws: (any Error).self) { try PartsCommand.parse(["--count", "0"]) }
    }
}
