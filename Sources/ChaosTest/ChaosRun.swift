import Foundation
import Logging
import Messaging
import OnboardingAPI
import ZeroMQMessaging

/// Everything one chaos run needs.
public struct ChaosConfiguration: Sendable {
    public var people: Int
    /// How many people are in the middle of their journey at once.
    public var concurrency: Int
    /// The faults inflicted during the drive: SIGKILLs, hangs, two services at once, whole-system restarts.
    public var faults: FaultCounts
    public var seed: UInt64
    public var shares: RunPlan.Shares
    public var endpoints: ChaosEndpoints
    public var stores: StoreLocations
    /// compose's run directory, holding `<service>.pid`.
    public var runDirectory: String
    /// The secret for `onboarding.routes` and `events.after`; without it the route state and the
    /// replay are not read.
    public var serviceToken: String?
    /// How long one attempt of a request waits for its reply.
    public var requestTimeout: Duration
    /// How long one person may take over the whole journey, resends included.
    public var personTimeout: Duration
    /// How long to wait at the end for the system to converge.
    public var settleTimeout: Duration
    /// How long a killed service may take to come back (also: to answer at the start).
    public var recoveryTimeout: Duration
    /// The image every set-up with an image sends; `nil`: a generated PNG of each person's own.
    public var image: Data?
    /// The chaos tool's own bus: its CURVE keys among others.
    public var bus = ZeroMQBus.Configuration()

    public init(
        people: Int, concurrency: Int, faults: FaultCounts, seed: UInt64, shares: RunPlan.Shares = .init(),
        endpoints: ChaosEndpoints, stores: StoreLocations, runDirectory: String, serviceToken: String?,
        requestTimeout: Duration = .seconds(3), personTimeout: Duration = .seconds(180),
        settleTimeout: Duration = .seconds(60), recoveryTimeout: Duration = .seconds(120), image: Data? = nil
    ) {
        self.people = people
        self.concurrency = concurrency
        self.faults = faults
        self.seed = seed
        self.shares = shares
        self.endpoints = endpoints
        self.stores = stores
        self.runDirectory = runDirectory
        self.serviceToken = serviceToken
        self.requestTimeout = requestTimeout
        self.personTimeout = personTimeout
        self.settleTimeout = settleTimeout
        self.recoveryTimeout = recoveryTimeout
        self.image = image
    }
}

/// A reason the run could not even start (nothing answers, no pid files…).
public struct ChaosSetupError: Error, CustomStringConvertible {
    public var description: String
}

/// What a run found.
public struct ChaosSummary: Sendable {
    public var plan: RunPlan
    public var outcomes: [PersonOutcome]
    /// Everyone whose traces break a rule: lost, doubled or both.
    public var inconsistent: [LostPerson]
    public var faults: [FaultReport]
    public var recording: RecorderCounts
    /// Each person's deliveries, in ``order`` (for the report file).
    public var intentsByUID: [String: [RecordedIntent]] = [:]
    public var order: RouteRecording.Order
    /// How the replay went, or why it could not be used.
    public var replay: FillResult
    /// How many people had an intent in force, or why the route state could not be read.
    public var routeState: Result<Int, RouteStateUnavailable>
    /// How the orchestrator followed auth and profile since its last start (its `health`
    /// reply); empty when it did not say.
    public var feeds: [FeedStatistics] = []
    /// Problems that concern the whole run (unreadable stores, a service that never came back).
    public var runProblems: [String]
    /// Uids of people who stopped before their sign-in was answered, found in auth's store.
    public var uidsBySubject: [String: String]
    public var droppedByBus: Int
    public var elapsed: Duration
    public var driveTime: Duration
    public var settleTime: Duration
    public var settleRounds: Int

    public var unfinished: [PersonOutcome] { outcomes.filter { !$0.finished } }
    /// People a rule other than a doubling one fails for.
    public var lost: [LostPerson] { inconsistent.filter(\.isLost) }
    /// People who got a decision twice for one state change.
    public var doubled: [LostPerson] { inconsistent.filter(\.isDoubled) }
    /// Decisions beyond one per state change, over everyone.
    public var doubledIntents: DoubledIntents {
        doubled.reduce(into: DoubledIntents()) {
            $0.dismiss += $1.doubled.dismiss
            $0.presentProfileSetup += $1.doubled.presentProfileSetup
        }
    }
    /// Faults that did not happen, or after which a service did not come back.
    public var faultsFailed: [FaultReport] { faults.filter { !$0.happened || !$0.problems.isEmpty } }
    public var passed: Bool {
        inconsistent.isEmpty && unfinished.isEmpty && runProblems.isEmpty && faultsFailed.isEmpty
    }
}

public struct RouteStateUnavailable: Error, Sendable, Hashable {
    public var reason: String
}

/// One chaos run: the recorder, the people, the faults, then the checks.
public struct ChaosRun: Sendable {
    public let configuration: ChaosConfiguration
    /// Where progress lines go (standard output in the command).
    public let output: @Sendable (String) -> Void

    public init(configuration: ChaosConfiguration, output: @escaping @Sendable (String) -> Void) {
        self.configuration = configuration
        self.output = output
    }

    public func run() async throws -> ChaosSummary {
        var logger = Logger(label: "onboarding-chaos")
        logger.logLevel = .warning
        let bus = ZeroMQBus(source: "onboarding-chaos", logger: logger, configuration: configuration.bus)
        do {
            let summary = try await run(on: bus)
            await bus.shutdown()
            return summary
        } catch {
            await bus.shutdown()
            throw error
        }
    }

    private func run(on bus: ZeroMQBus) async throws -> ChaosSummary {
        let configuration = self.configuration
        let clock = ContinuousClock()
        let started = clock.now
        let say: @Sendable (String) -> Void = { [output] line in
            output("[\(Report.seconds(started.duration(to: ContinuousClock.now), width: 7))] \(line)")
        }
        let caller = RetryingCaller(bus: bus, source: "onboarding-chaos", attemptTimeout: configuration.requestTimeout)
        let targets = ServiceTarget.all(configuration.endpoints)
        let plan = RunPlan.make(
            seed: configuration.seed, nonce: RunPlan.makeNonce(), people: configuration.people,
            shares: configuration.shares, faults: configuration.faults, services: targets.map(\.name))
        output(Report.header(configuration, plan: plan))

        // Every service must answer, and (to inflict faults) run under compose's supervise loop.
        try await waitUntilHealthy(targets, caller: caller, within: min(configuration.recoveryTimeout, .seconds(30)), say: say)
        if !plan.faults.isEmpty {
            for target in targets {
                let process = ServiceProcess(target: target, runDirectory: configuration.runDirectory)
                guard await process.currentPID() == nil else { continue }
                throw ChaosSetupError(
                    description: "no live \(target.program) in \(process.pidFile): faults need compose's pid files. "
                        + "Run the system with ./compose/onboarding up (or use ./compose/onboarding chaos), "
                        + "point --data-dir or --run-dir at its data, or pass --kills 0 --hangs 0 --double-kills 0 --system-restarts 0.")
            }
        }
        let scheduler = FaultScheduler(
            targets: targets, runDirectory: configuration.runDirectory, caller: caller,
            recoveryTimeout: configuration.recoveryTimeout, say: say)

        let recorder = RouteRecorder()
        let messages = try await bus.subscribe(
            to: [configuration.endpoints.routes], topics: [Topics.routePrefix], limits: MessageLimits(queueLimit: 1 << 20))
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await recorder.follow(messages) }
            defer { group.cancelAll() }
            do {
                try await probe(caller: caller, recorder: recorder, nonce: plan.nonce, say: say)
            } catch {
                throw ChaosSetupError(
                    description: "a probe person could not sign in or withdraw before the drive: \(PersonDriver.describe(error))")
            }

            // The drive, with the faults alongside.
            let driveStarted = clock.now
            let (outcomes, faults) = await drive(plan: plan, caller: caller, scheduler: scheduler, say: say)
            // A safety net: every hang resumes its process itself.
            StoppedProcesses.resumeAll()
            let driveTime = driveStarted.duration(to: clock.now)
            let finished = outcomes.filter(\.finished).count
            say("drive over in \(Report.seconds(driveTime)): \(finished) of \(outcomes.count) people finished; faults over")

            var runProblems: [String] = []
            do {
                try await waitUntilHealthy(targets, caller: caller, within: configuration.recoveryTimeout, say: say)
            } catch {
                runProblems.append("\(error)")
            }

            // Check until everything holds or the settle time is up.
            let settleStarted = clock.now
            let settleDeadline = settleStarted.advanced(by: configuration.settleTimeout)
            let uids = Set(outcomes.compactMap(\.uid))
            var round = 0
            var lastCount = -1
            while true {
                round += 1
                let callDeadline = clock.now.advanced(by: .seconds(30))
                let replay = await recorder.fill(
                    using: caller, at: configuration.endpoints.orchestratorRPC, serviceToken: configuration.serviceToken,
                    until: callDeadline)
                let states = await routeStates(caller: caller, until: callDeadline)
                let stores = try await StoreInspector.snapshot(of: configuration.stores, uids: uids)
                let recording = recorder.snapshot()
                let inconsistent = Verdict.lost(in: Evidence(
                    people: outcomes, stores: stores, recording: recording, routeStates: try? states.get()))
                // A doubled decision stays doubled: waiting longer cannot mend it.
                let lost = inconsistent.filter(\.isLost)
                let consistent = lost.isEmpty && stores.problems.isEmpty
                if consistent || clock.now >= settleDeadline {
                    var summary = ChaosSummary(
                        plan: plan, outcomes: outcomes, inconsistent: inconsistent, faults: faults, recording: recording.counts,
                        order: recording.order, replay: replay, routeState: states.map(\.count),
                        runProblems: runProblems + stores.problems, uidsBySubject: stores.accountBySubject,
                        droppedByBus: bus.statistics.droppedEvents, elapsed: started.duration(to: clock.now),
                        driveTime: driveTime, settleTime: settleStarted.duration(to: clock.now), settleRounds: round)
                    summary.intentsByUID = recording.intentsByUID
                    summary.feeds = (try? await caller.call(
                        HealthCheck(), to: configuration.endpoints.orchestratorRPC, until: callDeadline).feeds) ?? []
                    say(consistent ? "consistent after \(round) check\(round == 1 ? "" : "s")" : "settle time is up")
                    return summary
                }
                // Said when the count changes, and every tenth check.
                if lost.count != lastCount || round % 10 == 1 {
                    let example = lost.first.map { " (e.g. \($0.uid): \($0.problems[0]))" } ?? ""
                    say("check \(round): \(lost.count) people not consistent yet\(example)\(stores.problems.first.map { "; \($0)" } ?? ""); checking again until the settle time is up")
                    lastCount = lost.count
                }
                // The system converges on its own time and offers nothing to wait on: poll.
                try await Task.sleep(for: .seconds(1))
            }
        }
    }

    /// Drives every person, `concurrency` at a time, while the faults happen.
    private func drive(
        plan: RunPlan, caller: RetryingCaller, scheduler: FaultScheduler, say: @escaping @Sendable (String) -> Void
    ) async -> ([PersonOutcome], [FaultReport]) {
        enum Finished: Sendable {
            case people([PersonOutcome])
            case faults([FaultReport])
        }
        let configuration = self.configuration
        let setUps = SetUpSignal()
        var driver = PersonDriver(
            caller: caller, endpoints: configuration.endpoints, personTimeout: configuration.personTimeout,
            image: { [image = configuration.image] index in image ?? PNG.pixel(index: index) })
        driver.setUpStarted = { setUps.started() }
        let gate = ProgressGate()
        let total = plan.people.count
        let progress = FaultProgress(thresholds: plan.faults.map { FaultScheduler.threshold($0.point, total: total) })
        // A person starts only once the faults planned for about half a batch of people earlier
        // have begun, so a fault that waits for another one still hits a system under load.
        let lead = max(1, configuration.concurrency / 2)
        return await withTaskGroup(of: Finished.self) { [driver] group in
            group.addTask {
                .faults(await scheduler.run(
                    plan.faults, total: total, gate: gate, progress: progress, setUps: setUps, seed: plan.seed))
            }
            group.addTask {
                var outcomes: [PersonOutcome] = []
                outcomes.reserveCapacity(total)
                await withTaskGroup(of: PersonOutcome.self) { people in
                    // Each person counts themselves done, so faults waiting for a point of the
                    // drive see it even while this loop waits to start the next person.
                    func start(_ person: PersonPlan) {
                        people.addTask {
                            let outcome = await driver.run(person)
                            gate.complete()
                            return outcome
                        }
                    }
                    var next = 0
                    while next < min(configuration.concurrency, total) {
                        start(plan.people[next])
                        next += 1
                    }
                    var tenth = 0
                    while let outcome = await people.next() {
                        outcomes.append(outcome)
                        let done = outcomes.count
                        if done * 10 / total > tenth {
                            tenth = done * 10 / total
                            let stopped = outcomes.count(where: { !$0.finished })
                            say("\(done) of \(total) people done\(stopped > 0 ? " (\(stopped) could not finish)" : "")")
                        }
                        if next < total {
                            await progress.waitUntilFired(upTo: next - lead)
                            start(plan.people[next])
                            next += 1
                        }
                    }
                }
                return .people(outcomes)
            }
            var outcomes: [PersonOutcome] = []
            var faults: [FaultReport] = []
            for await finished in group {
                switch finished {
                case .people(let people):
                    outcomes = people
                    gate.finish()
                    progress.release()
                case .faults(let reports): faults = reports
                }
            }
            outcomes.sort { $0.plan.index < $1.plan.index }
            return (outcomes, faults)
        }
    }

    /// Signs in one extra person and waits for their intent, so the recorder's subscription is
    /// known to be live before the drive starts; then withdraws them.
    private func probe(
        caller: RetryingCaller, recorder: RouteRecorder, nonce: String, say: @Sendable (String) -> Void
    ) async throws {
        let deadline = ContinuousClock.now.advanced(by: configuration.recoveryTimeout)
        let endpoints = configuration.endpoints
        for attempt in 1...5 {
            let probe = try await caller.call(
                SignIn(provider: .google, subject: "chaos-\(nonce)-probe-\(attempt)"), to: endpoints.authRPC, until: deadline)
            let seen = await recorder.waitForIntent(of: probe.uid, timeout: .seconds(3))
            _ = try await caller.call(Withdraw(), to: endpoints.authRPC, sessionToken: probe.sessionToken, until: deadline)
            if seen {
                say("the route recorder is live (probe \(probe.uid) seen and withdrawn)")
                return
            }
        }
        say("warning: the route recorder saw none of 5 probes' intents; the recording may miss intents")
    }

    /// Every person's intent in force, from `onboarding.routes`.
    private func routeStates(
        caller: RetryingCaller, until deadline: ContinuousClock.Instant
    ) async -> Result<[String: RouteState], RouteStateUnavailable> {
        guard let token = configuration.serviceToken else { return .failure(RouteStateUnavailable(reason: "no service token")) }
        var states: [String: RouteState] = [:]
        var after: String?
        while true {
            do {
                let page = try await caller.call(
                    ListRouteStates(afterUID: after, limit: ListRouteStates.maximumLimit),
                    to: configuration.endpoints.orchestratorRPC, serviceToken: token, until: deadline)
                for state in page.states { states[state.uid] = state }
                guard let next = page.nextUID, next != after else { return .success(states) }
                after = next
            } catch {
                return .failure(RouteStateUnavailable(reason: "onboarding.routes: \(PersonDriver.describe(error))"))
            }
        }
    }

    private func waitUntilHealthy(
        _ targets: [ServiceTarget], caller: RetryingCaller, within timeout: Duration, say: @Sendable (String) -> Void
    ) async throws {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        for target in targets {
            do {
                _ = try await caller.call(HealthCheck(), to: target.endpoint, until: deadline)
            } catch {
                throw ChaosSetupError(
                    description: "\(target.name) does not answer health at \(target.endpoint) (\(PersonDriver.describe(error))). "
                        + "Is the system up? ./compose/onboarding up, or ./compose/onboarding chaos to start one for the test.")
            }
        }
        say("every service answers health")
    }
}
