import Foundation
import Messaging
import OnboardingAPI

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One service of the compose deployment.
public struct ServiceTarget: Sendable, Hashable {
    /// compose's name for it: its pid file is `<run-dir>/<name>.pid`.
    public var name: String
    /// The program it runs, to make sure the pid in the file is that service and nothing else.
    public var program: String
    /// Its request endpoint, where it answers `health`.
    public var endpoint: Endpoint

    public init(name: String, program: String, endpoint: Endpoint) {
        self.name = name
        self.program = program
        self.endpoint = endpoint
    }

    /// The four services, in compose's order.
    public static func all(_ endpoints: ChaosEndpoints) -> [ServiceTarget] {
        [
            ServiceTarget(name: "auth", program: "auth-service", endpoint: endpoints.authRPC),
            ServiceTarget(name: "profile", program: "profile-service", endpoint: endpoints.profileRPC),
            ServiceTarget(name: "image-upload", program: "image-upload-service", endpoint: endpoints.imageRPC),
            ServiceTarget(
                name: "onboarding-orchestrator", program: "onboarding-orchestrator", endpoint: endpoints.orchestratorRPC),
        ]
    }
}

/// What one killer did.
public struct KillReport: Sendable, Hashable {
    public var service: String
    public var planned: Int
    public var kills = 0
    /// How long each kill took to be answered by a new process.
    public var recoveries: [Duration] = []
    /// Why it stopped early, if it did.
    public var problems: [String] = []

    public init(service: String, planned: Int) {
        self.service = service
        self.planned = planned
    }
}

/// SIGKILLs one service at chosen points of the drive, and after each kill waits until compose's
/// supervise loop has restarted it (a new live pid in its pid file) and it answers `health`.
struct ServiceKiller: Sendable {
    let target: ServiceTarget
    let runDirectory: String
    let caller: RetryingCaller
    /// How long a killed service may take to come back before the killer gives up on it.
    let recoveryTimeout: Duration
    let say: @Sendable (String) -> Void

    var pidFile: String { "\(runDirectory)/\(target.name).pid" }

    /// The pid of the running service, if the pid file names a live process running its program.
    func currentPID() async -> Int32? {
        let (pidFile, program) = (self.pidFile, target.program)
        return await Blocking.run { Processes.livePID(pidFile: pidFile, program: program) }
    }

    /// Kills the service once `points[k]` of `total` people have finished, for each point.
    func run(points: [Double], total: Int, gate: ProgressGate, seed: UInt64) async -> KillReport {
        var report = KillReport(service: target.name, planned: points.count)
        var random = SeededGenerator(seed: seed)
        for point in points {
            let threshold = max(1, min(total, Int((Double(total) * point).rounded())))
            guard await gate.wait(untilCompleted: threshold) else { break }
            // A moment of its own, not exactly when a person finished.
            let pause = Duration.milliseconds(Int(random.next() % 400))
            guard (try? await Task.sleep(for: pause)) != nil, !gate.isFinished else { break }
            let clock = ContinuousClock()
            guard let victim = await waitForLivePID(other: nil, until: clock.now.advanced(by: recoveryTimeout)) else {
                report.problems.append("no live \(target.program) in \(pidFile) to kill")
                break
            }
            guard kill(victim, SIGKILL) == 0 else {
                report.problems.append("kill -9 \(victim) failed: \(String(cString: strerror(errno)))")
                break
            }
            let killedAt = clock.now
            report.kills += 1
            say("killed \(target.name) (pid \(victim)) with \(gate.completed) of \(total) people done")
            let deadline = killedAt.advanced(by: recoveryTimeout)
            guard let successor = await waitForLivePID(other: victim, until: deadline) else {
                report.problems.append(
                    "\(target.name) did not come back within \(recoveryTimeout) of kill \(report.kills) (no new process in \(pidFile))")
                break
            }
            do {
                _ = try await caller.call(HealthCheck(), to: target.endpoint, until: deadline)
            } catch {
                report.problems.append(
                    "\(target.name) restarted as pid \(successor) but did not answer health within \(recoveryTimeout): \(PersonDriver.describe(error))")
                break
            }
            let took = killedAt.duration(to: clock.now)
            report.recoveries.append(took)
            say("\(target.name) is back as pid \(successor), answering after \(Report.seconds(took))")
        }
        return report
    }

    /// Waits until the pid file names a live process of the service other than `other`.
    ///
    /// Polls: the pid file is written by compose's shell loop, which offers nothing to wait on.
    func waitForLivePID(other: Int32?, until deadline: ContinuousClock.Instant) async -> Int32? {
        while true {
            if let pid = await currentPID(), pid != other { return pid }
            guard ContinuousClock.now < deadline, (try? await Task.sleep(for: .milliseconds(50))) != nil else { return nil }
        }
    }
}
