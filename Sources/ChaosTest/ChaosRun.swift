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
    /// SIGKILLs per service during the drive.
    public var killsPerService: Int
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

    public init(
        people: Int, concurrency: Int, killsPerService: Int, seed: UInt64, shares: RunPlan.Shares = .init(),
        endpoints: ChaosEndpoints, stores: StoreLocations, runDirectory: String, serviceToken: String?,
        requestTimeout: Duration = .seconds(3), personTimeout: Duration = .seconds(180),
        settleTimeout: Duration = .seconds(60), recoveryTimeout: Duration = .seconds(120), image: Data? = nil
    ) {
        self.people = people
        self.concurrency = concurrency
        self.killsPerService = killsPerService
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
    public var kills: [KillReport]
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
    public var killsShort: Bool { kills.contains { $0.kills < $0.planned } }
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
    public var passed: Bool { inconsistent.isEmpty && unfinished.isEmpty && runProblems.isEmpty && !killsShort }
}

public struct RouteStateUnavailable: Error, Sendable, Hashable {
    public var reason: String
}

/// One chaos run: the recorder, the people, the killers, then the checks.
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
        let bus = ZeroMQBus(source: "onboarding-chaos", logger: logger)
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
            shares: configuration.shares, kills: configuration.killsPerService, services: targets.map(\.name))
        output(Report.header(configuration, plan: plan))

        // Every service must answer, and (to kill them) run under compose's supervise loop.
        try await waitUntilHealthy(targets, caller: caller, within: min(configuration.recoveryTimeout, .seconds(30)), say: say)
        let killers = targets.map {
            ServiceKiller(
                target: $0, runDirectory: configuration.runDirectory, caller: caller,
                recoveryTimeout: configuration.recoveryTimeout, say: say)
        }
        if configuration.killsPerService > 0 {
            for killer in killers where await killer.currentPID() == nil {
                throw ChaosSetupError(
                    description: "no live \(killer.target.program) in \(killer.pidFile): the killer needs compose's pid files. "
                        + "Run the system with ./compose/onboarding up (or use ./compose/onboarding chaos), "
                        + "point --data-dir or --run-dir at its data, or pass --kills 0.")
            }
        }

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

            // The drive, with the killers alongside.
            let driveStarted = clock.now
            let (outcomes, kills) = await drive(plan: plan, caller: caller, killers: killers, say: say)
            let driveTime = driveStarted.duration(to: clock.now)
            let finished = outcomes.filter(\.finished).count
            say("drive over in \(Report.seconds(driveTime)): \(finished) of \(outcomes.count) people finished; killing stopped")

            var runProblems = kills.flatMap(\.problems)
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
                let stores = await StoreInspector.snapshot(of: configuration.stores, uids: uids)
                let recording = recorder.snapshot()
                let inconsistent = Verdict.lost(in: Evidence(
                    people: outcomes, stores: stores, recording: recording, routeStates: try? states.get()))
                // A doubled decision stays doubled: waiting longer cannot mend it.
                let lost = inconsistent.filter(\.isLost)
                let consistent = lost.isEmpty && stores.problems.isEmpty
                if consistent || clock.now >= settleDeadline {
                    var summary = ChaosSummary(
                        plan: plan, outcomes: outcomes, inconsistent: inconsistent, kills: kills, recording: recording.counts,
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

    /// Drives every person, `concurrency` at a time, while the killers kill.
    private func drive(
        plan: RunPlan, caller: RetryingCaller, killers: [ServiceKiller], say: @escaping @Sendable (String) -> Void
    ) async -> ([PersonOutcome], [KillReport]) {
        enum Finished: Sendable {
            case people([PersonOutcome])
            case killer(KillReport)
        }
        let configuration = self.configuration
        let driver = PersonDriver(
            caller: caller, endpoints: configuration.endpoints, personTimeout: configuration.personTimeout,
            image: { [image = configuration.image] index in image ?? PNG.pixel(index: index) })
        let gate = ProgressGate()
        let total = plan.people.count
        return await withTaskGroup(of: Finished.self) { group in
            for (offset, killer) in killers.enumerated() where configuration.killsPerService > 0 {
                let points = plan.killPoints[killer.target.name] ?? []
                let seed = plan.seed &+ UInt64(offset + 1) &* 0x9E37_79B9_7F4A_7C15
                group.addTask { .killer(await killer.run(points: points, total: total, gate: gate, seed: seed)) }
            }
            group.addTask {
                var outcomes: [PersonOutcome] = []
                outcomes.reserveCapacity(total)
                await withTaskGroup(of: PersonOutcome.self) { people in
                    var next = 0
                    while next < min(configuration.concurrency, total) {
                        let person = plan.people[next]
                        people.addTask { await driver.run(person) }
                        next += 1
                    }
                    var tenth = 0
                    while let outcome = await people.next() {
                        outcomes.append(outcome)
                        let done = gate.complete()
                        if done * 10 / total > tenth {
                            tenth = done * 10 / total
                            let stopped = outcomes.count(where: { !$0.finished })
                            say("\(done) of \(total) people done\(stopped > 0 ? " (\(stopped) could not finish)" : "")")
                        }
                        if next < total {
                            let person = plan.people[next]
                            people.addTask { await driver.run(person) }
                            next += 1
                        }
                    }
                }
                return .people(outcomes)
            }
            var outcomes: [PersonOutcome] = []
            var kills: [KillReport] = []
            for await finished in group {
                switch finished {
                case .people(let people):
                    outcomes = people
                    gate.finish()
                case .killer(let report): kills.append(report)
                }
            }
            outcomes.sort { $0.plan.index < $1.plan.index }
            let order = killers.map(\.target.name)
            kills.sort { (order.firstIndex(of: $0.service) ?? 0) < (order.firstIndex(of: $1.service) ?? 0) }
            return (outcomes, kills)
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
