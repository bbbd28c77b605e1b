import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingTesting
import ServiceRuntime
import Synchronization
import Testing
import ZeroMQMessaging

#if canImport(Glibc)
import Glibc
import TestSupport
#endif

/// The four real executables, started on loopback ports of their own with their data in a
/// temporary folder.
final class RunningSystem: Sendable {
    let endpoints: SystemEndpoints
    let directory: URL
    let processes: [ChildProcess]
    /// The test's own bus: its keys among the services'.
    let bus: ZeroMQBus.Configuration

    /// Where `swift build` put the executables: beside this test bundle.
    static var binDirectory: URL {
        if let path = ProcessInfo.processInfo.environment["ONBOARDING_BIN_DIR"] { return URL(fileURLWithPath: path) }
        var url = Bundle.main.bundleURL
        while !FileManager.default.fileExists(atPath: url.appendingPathComponent("auth-service").path), url.path != "/" {
            url = url.deletingLastPathComponent()
        }
        return url
    }

    init() throws {
        // 26000-31999: below Linux's ephemeral range (32768 and up), where an outgoing
        // connection could already hold a port, and above the contract tests' ports.
        endpoints = .tcp(base: 26_000 + Int.random(in: 0..<599) * 10)
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("onboarding-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        bus = try testBusConfiguration(directory: directory, servers: endpoints.servers)
        let e = endpoints
        let environment = ProcessInfo.processInfo.environment.merging([
            "ONBOARDING_DATA_DIR": directory.path,
            "ONBOARDING_AUTH_RPC": e.authRPC.rawValue, "ONBOARDING_AUTH_EVENTS": e.authEvents.rawValue,
            "ONBOARDING_PROFILE_RPC": e.profileRPC.rawValue, "ONBOARDING_PROFILE_EVENTS": e.profileEvents.rawValue,
            "ONBOARDING_IMAGE_RPC": e.imageRPC.rawValue, "ONBOARDING_ORCHESTRATOR_RPC": e.orchestratorRPC.rawValue,
            "ONBOARDING_ROUTES": e.routes.rawValue, "ONBOARDING_LOG_LEVEL": "warning",
            // Stopped with this test process, even when it crashes.
            "ONBOARDING_EXIT_WITH_PARENT": String(ProcessInfo.processInfo.processIdentifier),
        ]) { $1 }
        let bin = Self.binDirectory
        var processes: [ChildProcess] = []
        for (name, arguments) in [
            ("auth-service", ["--auth-dev-mode"]), ("profile-service", []), ("image-upload-service", []),
            ("onboarding-orchestrator", []),
        ] {
            processes.append(try ChildProcess(bin.appendingPathComponent(name), arguments: arguments, environment: environment))
        }
        self.processes = processes
    }

    var imagesRoot: URL { directory.appendingPathComponent("images") }

    /// Sends SIGTERM to every service and returns their exit statuses.
    func stop() async -> [Int32] {
        for process in processes where process.isRunning { process.terminate() }
        var statuses: [Int32] = []
        for process in processes {
            let clock = ContinuousClock()
            let deadline = clock.now.advanced(by: .seconds(15))
            while process.isRunning, clock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            statuses.append(process.isRunning ? -1 : process.terminationStatus)
        }
        try? FileManager.default.removeItem(at: directory)
        return statuses
    }

    /// Runs `body` with a ZeroMQ bus once every service answers, then stops the services and
    /// expects each to exit cleanly.
    static func run(_ body: @Sendable (ZeroMQBus, RunningSystem) async throws -> Void) async throws {
        let system = try RunningSystem()
        var logger = Logger(label: "zeromq-system-test")
        logger.logLevel = .warning
        let bus = ZeroMQBus(source: "test", logger: logger, configuration: system.bus)
        do {
            for (name, endpoint) in system.endpoints.rpcEndpoints {
                do {
                    try await bus.waitUntilAnswering(endpoint, source: "test", timeout: .seconds(30))
                } catch {
                    let exited = system.processes.filter { !$0.isRunning }
                        .map { "\($0.name) exited with \($0.terminationStatus)" }
                    Issue.record("\(name) never answered at \(endpoint): \(error); \(exited.isEmpty ? "all still running" : exited.joined(separator: ", "))")
                    throw error
                }
            }
            try await body(bus, system)
        } catch {
            await bus.shutdown()
            _ = await system.stop()
            throw error
        }
        await bus.shutdown()
        let statuses = await system.stop()
        #expect(statuses == [0, 0, 0, 0], "every service stops cleanly on SIGTERM")
    }
}

@Suite("The whole system over ZeroMQ, with the real executables", .serialized)
struct ZeroMQSystemTests {
    @Test("sign in, set up a profile, sign out, sign in again, withdraw")
    func journey() async throws {
        try await RunningSystem.run { bus, system in
            try await runJourney(bus: bus, endpoints: system.endpoints, imagesRoot: system.imagesRoot)
            // Every service's files are readable by their owner only.
            let data = system.directory.path
            for database in ["auth.sqlite", "profile.sqlite", "orchestrator.sqlite"] {
                #expect(permissionBits("\(data)/\(database)") == 0o600, "\(database)")
                for suffix in ["-wal", "-shm"] where FileManager.default.fileExists(atPath: "\(data)/\(database)\(suffix)") {
                    #expect(permissionBits("\(data)/\(database)\(suffix)") == 0o600, "\(database)\(suffix)")
                }
            }
            #expect(permissionBits("\(data)/service.token") == 0o600)
            #expect(permissionBits(system.imagesRoot.path) == 0o700)
        }
    }

    @Test("bad input at every endpoint gets a typed error and no service goes down")
    func badInput() async throws {
        try await RunningSystem.run { bus, system in
            let token = try ServiceTokenFile(directory: system.directory.path).readOrCreate()
            try await runBadInput(bus: bus, endpoints: system.endpoints, serviceToken: token, serviceRefusal: .forbidden)
        }
    }

    @Test("over CURVE, rights go by key: an operator's key is refused what only the orchestrator may do, whatever token it carries")
    func rightsPerKey() async throws {
        try await RunningSystem.run { bus, system in
            let token = try ServiceTokenFile(directory: system.directory.path).readOrCreate()
            let e = system.endpoints
            // The test's key ("test") is an operator's: it may read the orchestrator's record...
            let page = try await bus.call(
                EventsAfter(sequence: 0, limit: 1), to: e.orchestratorRPC, source: "test", serviceToken: token)
            #expect(page.events.count <= 1)
            // ...but not write a profile, upload an image or replay auth's events, token or not.
            func expectForbidden(_ name: String, _ call: () async throws -> Void) async {
                do {
                    try await call()
                    Issue.record("\(name) was allowed")
                } catch let error as ServiceError {
                    #expect(error.code == .forbidden, "\(name): \(error)")
                    #expect(error.reason == "test", "\(name)")
                } catch {
                    Issue.record("\(name): \(error)")
                }
            }
            await expectForbidden("profile.create") {
                _ = try await bus.call(CreateProfile(username: "rights"), to: e.profileRPC, source: "test", uid: "u1", serviceToken: token)
            }
            await expectForbidden("image.deleteAll") {
                _ = try await bus.call(DeleteAllImages(), to: e.imageRPC, source: "test", uid: "u1", serviceToken: token)
            }
            await expectForbidden("auth's events.after") {
                _ = try await bus.call(EventsAfter(sequence: 0, limit: 1), to: e.authRPC, source: "test", serviceToken: token)
            }
            // The orchestrator's own key may replay auth's events.
            var orchestrator = ZeroMQBus.Configuration()
            orchestrator.keys = try BusKeys.load(
                from: system.directory.appendingPathComponent("keys").path, identity: "orchestrator", servers: e.servers)
            let asOrchestrator = ZeroMQBus(source: "rights-test", logger: Logger(label: "rights-test"), configuration: orchestrator)
            let replay = try await asOrchestrator.call(EventsAfter(sequence: 0, limit: 1), to: e.authRPC, source: "test")
            #expect(replay.lastSequence >= 0)
            await asOrchestrator.shutdown()
            // Following auth's events is the orchestrator's alone: the test's key is turned away.
            let before = try await bus.call(HealthCheck(), to: e.authRPC, source: "test").statistics.refusedHandshakes
            let events = try await bus.subscribe(to: [e.authEvents], topics: [""], limits: MessageLimits())
            // Polled: a refused handshake has nothing to wait on but auth's count of them.
            var refused = before
            for _ in 0..<200 where refused == before {
                refused = try await bus.call(HealthCheck(), to: e.authRPC, source: "test").statistics.refusedHandshakes
                if refused == before { try await Task.sleep(for: .milliseconds(20)) }
            }
            #expect(refused > before, "auth refused the subscription of a key that may not follow it")
            _ = events
        }
    }

    @Test("a squatter on each service's port, bound while the service is down, gets no request; callers get a typed error")
    func squatters() async throws {
        try await RunningSystem.run { bus, system in
            let e = system.endpoints
            let token = try ServiceTokenFile(directory: system.directory.path).readOrCreate()
            // The squatter admits every key of the deployment (public keys are readable by anyone).
            let admitted = try BusKeys.clients(in: system.directory.appendingPathComponent("keys").path)
            let services = [("auth", e.authRPC), ("profile", e.profileRPC), ("image-upload", e.imageRPC), ("orchestrator", e.orchestratorRPC)]
            for (index, (name, endpoint)) in services.enumerated() {
                let process = system.processes[index]
                process.terminate()
                while process.isRunning { try await Task.sleep(for: .milliseconds(10)) }
                let own = try CurveKeyPair.generate()
                var configuration = ZeroMQBus.Configuration()
                configuration.keys = BusKeys(identity: name, own: own, servers: [:], otherServers: own.publicKey, clients: admitted)
                let squatter = ZeroMQBus(source: "squatter", logger: Logger(label: "squatter"), configuration: configuration)
                var requests: AsyncStream<IncomingRequest>?
                for _ in 0..<50 where requests == nil {
                    do {
                        requests = try await squatter.serve(at: endpoint, limits: MessageLimits())
                    } catch let error as ServiceError where error.code == .addressInUse {
                        try await Task.sleep(for: .milliseconds(20))
                    }
                }
                let received = Mutex(0)
                let serving = Task { for await _ in try #require(requests) { received.withLock { $0 += 1 } } }
                let failedBefore = bus.statistics.failedHandshakes
                do {
                    _ = try await bus.call(HealthCheck(), to: endpoint, source: "test", serviceToken: token)
                    Issue.record("the squatter on \(name)'s port answered")
                } catch let error as ServiceError {
                    #expect(error.code == .noResponder, "\(name): \(error)")
                }
                #expect(received.withLock { $0 } == 0, "the squatter on \(name)'s port got no request")
                let deadline = ContinuousClock.now + .seconds(10)
                while bus.statistics.failedHandshakes == failedBefore, ContinuousClock.now < deadline {
                    try await Task.sleep(for: .milliseconds(10))
                }
                #expect(bus.statistics.failedHandshakes > failedBefore, "the caller counted the failed handshake with \(name)'s port")
                serving.cancel()
                await squatter.shutdown()
            }
        }
    }

    @Test(
        "a Python client written from proto/ alone drives the whole journey",
        .enabled(if: PythonClient.isAvailable, "needs python3 with pyzmq (./compose/onboarding test installs it)"))
    func pythonClient() async throws {
        try await RunningSystem.run { _, system in
            let result = try await PythonClient.run(
                endpoints: system.endpoints, keysDirectory: system.directory.appendingPathComponent("keys").path)
            #expect(result.status == 0, "the Python client failed:\n\(result.output)")
            #expect(result.output.contains("python client: all steps passed"))
        }
    }
}

/// `proto/examples/python/onboarding_client.py`, run as a separate process.
enum PythonClient {
    static let script = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("proto/examples/python/onboarding_client.py")

    static let isAvailable: Bool = {
        guard
            let process = try? ChildProcess(
                URL(fileURLWithPath: "/usr/bin/env"), arguments: ["python3", "-c", "import zmq"], standardOutput: .null,
                standardError: .null)
        else { return false }
        return process.waitUntilExit() == 0
    }()

    static func run(endpoints: SystemEndpoints, keysDirectory: String) async throws -> (status: Int32, output: String) {
        let output = Pipe()
        let process = try ChildProcess(
            URL(fileURLWithPath: "/usr/bin/env"), arguments: ["python3", script.path],
            environment: ProcessInfo.processInfo.environment.merging([
                "ONBOARDING_AUTH_RPC": endpoints.authRPC.rawValue, "ONBOARDING_PROFILE_RPC": endpoints.profileRPC.rawValue,
                "ONBOARDING_ORCHESTRATOR_RPC": endpoints.orchestratorRPC.rawValue, "ONBOARDING_ROUTES": endpoints.routes.rawValue,
                "ONBOARDING_KEYS_DIR": keysDirectory, "ONBOARDING_KEY_NAME": "client",
            ]) { $1 },
            standardOutput: .pipe(output), standardError: .pipe(output))
        let data = try await Task.detached { try output.fileHandleForReading.readToEnd() ?? Data() }.value
        while process.isRunning { try await Task.sleep(for: .milliseconds(10)) }
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }
}
