import Foundation
import Messaging
import OnboardingAPI
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What one fault did.
public struct FaultReport: Sendable, Hashable {
    public var fault: PlannedFault
    /// Whether it was inflicted.
    public var happened = false
    /// How many people had finished when it began.
    public var peopleDone = 0
    /// It began after every person had finished (it waited for another fault of its services).
    public var afterDrive = false
    /// A hang: how long the service was stopped. A kill or restart: from the signal until every
    /// service it touched answered `health` again.
    public var took: Duration?
    /// Why it did not happen, or did not end well (a service that did not come back…).
    public var problems: [String] = []

    public init(fault: PlannedFault) { self.fault = fault }
}

/// The pipe the signal handler writes the signal's number to (the self-pipe trick: writing is
/// async-signal-safe; everything else happens on a thread of its own). -1 until installed.
nonisolated(unsafe) private var signalPipeWrite: Int32 = -1

/// Processes this tool has SIGSTOPped and not yet resumed: every one of them gets SIGCONT, when
/// its hang ends, at the end of the run, and when the tool is interrupted (SIGINT, SIGTERM,
/// SIGHUP; see ``installSignalHandlers()``).
enum StoppedProcesses {
    private static let pids = Mutex<Set<Int32>>([])
    private static let installed = Mutex(false)

    /// Stops `pid` (recorded first, so an interruption at any moment resumes it).
    static func stop(_ pid: Int32) -> Bool {
        pids.withLock { _ = $0.insert(pid) }
        guard kill(pid, SIGSTOP) == 0 else {
            pids.withLock { _ = $0.remove(pid) }
            return false
        }
        return true
    }

    /// Resumes `pid` if this tool stopped it.
    static func resume(_ pid: Int32) {
        guard pids.withLock({ $0.remove(pid) }) != nil else { return }
        kill(pid, SIGCONT)
    }

    /// Resumes every process still stopped.
    static func resumeAll() {
        for pid in pids.withLock({ let all = $0; $0 = []; return all }) { kill(pid, SIGCONT) }
    }

    /// On SIGINT, SIGTERM or SIGHUP: resume every stopped service, then die of the signal as
    /// usual. The handler only writes the signal's number to a pipe; a thread of its own reads
    /// it, resumes the services (locks and all) and re-raises the signal with its default action.
    static func installSignalHandlers() {
        guard installed.withLock({ let was = $0; $0 = true; return !was }) else { return }
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else { return }
        let readEnd = ends[0]
        signalPipeWrite = ends[1]
        let watcher = Thread {
            var number: UInt8 = 0
            while read(readEnd, &number, 1) != 1 {}  // again after EINTR
            resumeAll()
            // Die of the signal, as without this handler. This thread inherited the mask of the
            // thread that made it (Swift's pool threads block most signals): unblock it first.
            let signalNumber = Int32(number)
            signal(signalNumber, SIG_DFL)
            var unblock = sigset_t()
            sigemptyset(&unblock)
            sigaddset(&unblock, signalNumber)
            pthread_sigmask(SIG_UNBLOCK, &unblock, nil)
            raise(signalNumber)
            _exit(128 + signalNumber)
        }
        watcher.name = "onboarding-chaos signals"
        watcher.start()
        for number in [SIGINT, SIGTERM, SIGHUP] {
            signal(number) { number in
                var byte = UInt8(truncatingIfNeeded: number)
                _ = write(signalPipeWrite, &byte, 1)
            }
        }
    }
}

/// Keeps two faults off one service at a time: a stopped service is never also killed (its
/// SIGCONT would go to a dead or reused pid) and a service coming back is not hit again before
/// it answers. A fault takes all its services at once, or waits.
final class FaultLocks: Sendable {
    private struct State {
        var busy: Set<String> = []
        var waiters: [(services: Set<String>, continuation: CheckedContinuation<Void, Never>)] = []
    }

    private let state = Mutex(State())

    func acquire(_ services: Set<String>) async {
        await withCheckedContinuation { continuation in
            let granted = state.withLock { state in
                guard state.busy.isDisjoint(with: services) else {
                    state.waiters.append((services, continuation))
                    return false
                }
                state.busy.formUnion(services)
                return true
            }
            if granted { continuation.resume() }
        }
    }

    func release(_ services: Set<String>) {
        let ready = state.withLock { state in
            state.busy.subtract(services)
            var ready: [CheckedContinuation<Void, Never>] = []
            // In arrival order; a waiter whose services are busy does not hold back later ones.
            state.waiters.removeAll { waiter in
                guard state.busy.isDisjoint(with: waiter.services) else { return false }
                state.busy.formUnion(waiter.services)
                ready.append(waiter.continuation)
                return true
            }
            return ready
        }
        for continuation in ready { continuation.resume() }
    }
}

/// Which faults have begun, so the drive can hold back new people until the faults planned
/// for that point have: every fault then hits a system under load, even when it had to wait
/// for another one of its services.
final class FaultProgress: Sendable {
    private struct State {
        var fired: Set<Int> = []
        var released = false
        var nextID = 0
        var waiters: [Int: (upTo: Int, continuation: CheckedContinuation<Void, Never>)] = [:]
    }

    /// Each fault's threshold: how many people must have finished before it begins.
    let thresholds: [Int]
    private let state = Mutex(State())

    init(thresholds: [Int]) { self.thresholds = thresholds }

    private func ready(_ upTo: Int, _ state: State) -> Bool {
        state.released || thresholds.indices.allSatisfy { thresholds[$0] > upTo || state.fired.contains($0) }
    }

    /// Fault `index` has begun.
    func fired(_ index: Int) {
        let waiting = state.withLock { state in
            state.fired.insert(index)
            let ready = state.waiters.filter { self.ready($0.value.upTo, state) }
            for id in ready.keys { state.waiters[id] = nil }
            return ready.values.map(\.continuation)
        }
        for continuation in waiting { continuation.resume() }
    }

    /// Lets every waiter go (the drive is over, or no faults will begin any more).
    func release() {
        let waiting = state.withLock { state in
            state.released = true
            defer { state.waiters = [:] }
            return state.waiters.values.map(\.continuation)
        }
        for continuation in waiting { continuation.resume() }
    }

    /// Waits until every fault whose threshold is at most `upTo` has begun.
    func waitUntilFired(upTo: Int) async {
        await withCheckedContinuation { continuation in
            let immediate = state.withLock { state in
                if ready(upTo, state) { return true }
                state.nextID += 1
                state.waiters[state.nextID] = (upTo, continuation)
                return false
            }
            if immediate { continuation.resume() }
        }
    }
}

/// Tells hangs that wait for one that a set-up has just been sent.
final class SetUpSignal: Sendable {
    private struct State {
        var nextID = 0
        var waiters: [Int: CheckedContinuation<Bool, Never>] = [:]
    }

    private let state = Mutex(State())

    /// A set-up is about to be sent.
    func started() {
        let waiting = state.withLock { state in
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for continuation in waiting { continuation.resume(returning: true) }
    }

    /// Waits for the next set-up, at most `timeout`. - Returns: whether one began.
    func next(timeout: Duration) async -> Bool {
        let id = state.withLock { state in
            state.nextID += 1
            return state.nextID
        }
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                await withTaskCancellationHandler {
                    await withCheckedContinuation { continuation in
                        let cancelled = self.state.withLock { state in
                            if Task.isCancelled { return true }
                            state.waiters[id] = continuation
                            return false
                        }
                        if cancelled { continuation.resume(returning: false) }
                    }
                } onCancel: {
                    let waiter = self.state.withLock { $0.waiters.removeValue(forKey: id) }
                    waiter?.resume(returning: false)
                }
            }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }
}

/// Inflicts the run's faults at their points of the drive.
struct FaultScheduler: Sendable {
    let targets: [ServiceTarget]
    let runDirectory: String
    let caller: RetryingCaller
    /// How long a service may take to come back (or answer after a hang) before the fault is
    /// reported as a problem.
    let recoveryTimeout: Duration
    let say: @Sendable (String) -> Void

    private func process(_ name: String) -> ServiceProcess? {
        targets.first { $0.name == name }.map { ServiceProcess(target: $0, runDirectory: runDirectory) }
    }

    /// How many people must have finished before a fault at `point` begins.
    static func threshold(_ point: Double, total: Int) -> Int {
        max(1, min(total, Int((Double(total) * point).rounded())))
    }

    /// Runs every fault: each waits for its point of the drive (or the drive's end), a moment
    /// of its own, and its services; then it happens. - Returns: a report per fault, in plan order.
    func run(
        _ faults: [PlannedFault], total: Int, gate: ProgressGate, progress: FaultProgress, setUps: SetUpSignal, seed: UInt64
    ) async -> [FaultReport] {
        let locks = FaultLocks()
        let names = targets.map(\.name)
        return await withTaskGroup(of: (Int, FaultReport).self) { group in
            for (index, fault) in faults.enumerated() {
                group.addTask {
                    var random = SeededGenerator(seed: seed &+ UInt64(index + 1) &* 0x9E37_79B9_7F4A_7C15)
                    _ = await gate.wait(untilCompleted: progress.thresholds[index])
                    // A moment of its own, not exactly when a person finished.
                    try? await Task.sleep(for: .milliseconds(Int(random.next() % 400)))
                    let services = Set(fault.services(all: names))
                    await locks.acquire(services)
                    progress.fired(index)
                    var report = FaultReport(fault: fault)
                    report.peopleDone = gate.completed
                    report.afterDrive = gate.isFinished
                    await inflict(fault, report: &report, setUps: setUps, gate: gate, random: &random)
                    locks.release(services)
                    return (index, report)
                }
            }
            var reports: [(Int, FaultReport)] = []
            for await report in group { reports.append(report) }
            return reports.sorted { $0.0 < $1.0 }.map(\.1)
        }
    }

    private func inflict(
        _ fault: PlannedFault, report: inout FaultReport, setUps: SetUpSignal, gate: ProgressGate,
        random: inout SeededGenerator
    ) async {
        switch fault.kind {
        case .kill(let service):
            await stop([service], with: SIGKILL, report: &report, gate: gate)
        case .killTwo(let first, let second):
            await stop([first, second], with: SIGKILL, report: &report, gate: gate)
        case .restartAll(let signal):
            await stop(targets.map(\.name), with: signal == .term ? SIGTERM : SIGKILL, report: &report, gate: gate)
        case .hang(let service, let milliseconds, let afterSetUpBegins):
            if afterSetUpBegins, await setUps.next(timeout: .seconds(2)) {
                // Just after the set-up was sent: while its upload or create is in flight.
                try? await Task.sleep(for: .milliseconds(Int(random.next() % 50)))
            }
            await hang(service, for: .milliseconds(milliseconds), report: &report, gate: gate)
        case .pauseDatabase(let milliseconds):
            await pauseDatabase(for: .milliseconds(milliseconds), report: &report, gate: gate)
        case .restartDatabase:
            await restartDatabase(report: &report, gate: gate)
        }
    }

    /// compose's PostgreSQL: the postmaster's pid (`<run-dir>/postgres.pid`), and the script
    /// that restarts it (`<run-dir>/postgres-restart`), both written by `compose ... --postgres`.
    var databasePIDFile: String { "\(runDirectory)/postgres.pid" }
    var databaseRestartScript: String { "\(runDirectory)/postgres-restart" }

    /// SIGSTOPs the postmaster and every backend for `duration`, SIGCONTs them (always), and
    /// waits until auth, whose store it holds, answers `health`.
    private func pauseDatabase(for duration: Duration, report: inout FaultReport, gate: ProgressGate) async {
        let pidFile = databasePIDFile
        let family = (try? await Blocking.run { Processes.family(pidFile: pidFile) }) ?? []
        guard !family.isEmpty else {
            report.problems.append("no live PostgreSQL in \(pidFile) to stop")
            return
        }
        let stopped = family.filter { StoppedProcesses.stop($0) }
        let clock = ContinuousClock()
        let start = clock.now
        report.happened = true
        say("SIGSTOP PostgreSQL (\(stopped.count) processes) for \(Report.seconds(duration)), with \(gate.completed) people done")
        try? await Task.sleep(for: duration)
        for pid in stopped { StoppedProcesses.resume(pid) }
        report.took = start.duration(to: clock.now)
        await expectAuthAnswers(after: "SIGCONT PostgreSQL", report: &report)
    }

    /// Runs compose's restart script (`pg_ctl restart -m immediate`), then waits until auth
    /// answers `health`.
    private func restartDatabase(report: inout FaultReport, gate: ProgressGate) async {
        let script = databaseRestartScript
        let clock = ContinuousClock()
        let start = clock.now
        let status = try? await Blocking.run { Processes.run(script) }
        guard status == 0 else {
            report.problems.append("\(script) failed (\(status.map { "status \($0)" } ?? "could not run")): PostgreSQL was not restarted")
            return
        }
        report.happened = true
        report.took = start.duration(to: clock.now)
        say("PostgreSQL restarted at once (pg_ctl restart -m immediate) in \(Report.seconds(report.took!)), with \(gate.completed) people done")
        await expectAuthAnswers(after: "the restart", report: &report)
    }

    private func expectAuthAnswers(after what: String, report: inout FaultReport) async {
        guard let auth = targets.first(where: { $0.name == "auth" }) else { return }
        do {
            _ = try await caller.call(HealthCheck(), to: auth.endpoint, until: ContinuousClock.now.advanced(by: recoveryTimeout))
        } catch {
            report.problems.append("auth did not answer health within \(recoveryTimeout) of \(what): \(PersonDriver.describe(error))")
        }
    }

    /// Sends `signal` to every service of `services` at once, then waits until compose has
    /// started each again (a new live pid) and it answers `health`.
    private func stop(_ services: [String], with signal: Int32, report: inout FaultReport, gate: ProgressGate) async {
        let clock = ContinuousClock()
        let processes = services.compactMap(process)
        var victims: [(ServiceProcess, Int32)] = []
        for process in processes {
            guard let pid = await process.waitForLivePID(other: nil, until: clock.now.advanced(by: recoveryTimeout)) else {
                report.problems.append("no live \(process.target.program) in \(process.pidFile) to signal")
                return
            }
            victims.append((process, pid))
        }
        // At once: one signal after the other, nothing in between.
        for (process, pid) in victims where kill(pid, signal) != 0 {
            report.problems.append("kill -\(signal) \(pid) (\(process.target.name)) failed: \(String(cString: strerror(errno)))")
        }
        guard report.problems.isEmpty else { return }
        let signalled = clock.now
        report.happened = true
        let what = victims.map { "\($0.0.target.name) (pid \($0.1))" }.joined(separator: ", ")
        say("\(report.fault.label): \(what), with \(gate.completed) people done")
        let deadline = signalled.advanced(by: recoveryTimeout)
        var back: [String] = []
        for (process, victim) in victims {
            guard let successor = await process.waitForLivePID(other: victim, until: deadline) else {
                report.problems.append(
                    "\(process.target.name) did not come back within \(recoveryTimeout) (no new process in \(process.pidFile))")
                continue
            }
            do {
                _ = try await caller.call(HealthCheck(), to: process.target.endpoint, until: deadline)
                back.append("\(process.target.name) as pid \(successor)")
            } catch {
                report.problems.append(
                    "\(process.target.name) restarted as pid \(successor) but did not answer health within \(recoveryTimeout): \(PersonDriver.describe(error))")
            }
        }
        let took = signalled.duration(to: clock.now)
        report.took = took
        if !back.isEmpty { say("back: \(back.joined(separator: ", ")), every one answering after \(Report.seconds(took))") }
    }

    /// SIGSTOPs the service for `duration`, then SIGCONTs it (always: cancelled or not), and
    /// waits until it answers `health` again.
    private func hang(_ service: String, for duration: Duration, report: inout FaultReport, gate: ProgressGate) async {
        let clock = ContinuousClock()
        guard let process = process(service),
            let pid = await process.waitForLivePID(other: nil, until: clock.now.advanced(by: recoveryTimeout))
        else {
            report.problems.append("no live \(service) process to stop")
            return
        }
        guard StoppedProcesses.stop(pid) else {
            report.problems.append("kill -STOP \(pid) (\(service)) failed: \(String(cString: strerror(errno)))")
            return
        }
        let stopped = clock.now
        report.happened = true
        say("SIGSTOP \(service) (pid \(pid)) for \(Report.seconds(duration)), with \(gate.completed) people done")
        try? await Task.sleep(for: duration)
        StoppedProcesses.resume(pid)
        report.took = stopped.duration(to: clock.now)
        do {
            _ = try await caller.call(HealthCheck(), to: process.target.endpoint, until: clock.now.advanced(by: recoveryTimeout))
            say("SIGCONT \(service) (pid \(pid)) after \(Report.seconds(report.took!)); it answers")
        } catch {
            report.problems.append(
                "\(service) did not answer health within \(recoveryTimeout) of SIGCONT: \(PersonDriver.describe(error))")
        }
    }
}
