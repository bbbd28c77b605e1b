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
    /// Its service's request endpoint, where it answers `health` (every replica's: a standby
    /// orchestrator answers nothing, and whichever leads answers for it).
    public var endpoint: Endpoint

    public init(name: String, program: String, endpoint: Endpoint) {
        self.name = name
        self.program = program
        self.endpoint = endpoint
    }

    /// Every replica of the four services, in compose's order and with compose's names: `auth`,
    /// then `auth-2` and on for each further replica its endpoint lists.
    public static func all(_ endpoints: ChaosEndpoints) -> [ServiceTarget] {
        [
            ("auth", "auth-service", endpoints.authRPC), ("profile", "profile-service", endpoints.profileRPC),
            ("image-upload", "image-upload-service", endpoints.imageRPC),
            ("onboarding-orchestrator", "onboarding-orchestrator", endpoints.orchestratorRPC),
        ].flatMap { name, program, endpoint in
            (1...endpoint.replicas.count).map { replica in
                ServiceTarget(name: replica == 1 ? name : "\(name)-\(replica)", program: program, endpoint: endpoint)
            }
        }
    }
}

/// Finds the process compose runs for one service, from its pid file.
struct ServiceProcess: Sendable {
    let target: ServiceTarget
    let runDirectory: String

    var pidFile: String { "\(runDirectory)/\(target.name).pid" }

    /// The pid of the running service, if the pid file names a live process running its program.
    func currentPID() async -> Int32? {
        let (pidFile, program) = (self.pidFile, target.program)
        // Cancelled before it was read: not known, so none.
        return (try? await Blocking.run { Processes.livePID(pidFile: pidFile, program: program) }) ?? nil
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
