import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingClient
import ServiceHosting
import Synchronization
import Testing
import ZeroMQMessaging

#if canImport(Glibc)
import Glibc
import TestSupport
#endif

/// The five real executables on loopback ports of their own (16000-16999, which no other test
/// uses: the bus contract tests take 20000-24999, the feed tests 25000-25899, others 18000-19899
/// and 26000-31999), data in a temporary folder.
final class RunningExecutables: Sendable {
    let base: Int
    let directory: URL
    private let environment: [String: String]
    private let services: [ChildProcess]
    private let gatewayProcess: Mutex<ChildProcess?> = Mutex(nil)
    /// The test's own bus: its CURVE keys among the services'.
    let bus: ZeroMQBus.Configuration

    /// Where `swift build` put the executables: beside this test bundle.
    static var binDirectory: URL {
        if let path = ProcessInfo.processInfo.environment["ONBOARDING_BIN_DIR"] { return URL(fileURLWithPath: path) }
        var url = Bundle.main.bundleURL
        while !FileManager.default.fileExists(atPath: url.appendingPathComponent("onboarding-gateway").path), url.path != "/" {
            url = url.deletingLastPathComponent()
        }
        return url
    }

    /// - Parameter extra: more environment for every executable (tracing's, say).
    init(extra: [String: String] = [:]) throws {
        let base = 16_000 + Int.random(in: 0..<99) * 10
        self.base = base
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("gateway-processes-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let at = { (offset: Int) in Endpoint("tcp://127.0.0.1:\(base + offset)") }
        var keys = ZeroMQBus.Configuration()
        keys.keys = try BusSecurity.makeKeys(
            in: directory.appendingPathComponent("keys").path, andLoad: "gateway-test",
            servers: ["auth": [at(0), at(1)], "profile": [at(2), at(3)], "image-upload": [at(4)], "orchestrator": [at(5), at(6)]])
        bus = keys
        environment = ProcessInfo.processInfo.environment.merging([
            "ONBOARDING_DATA_DIR": directory.path,
            "ONBOARDING_AUTH_RPC": "tcp://127.0.0.1:\(base)", "ONBOARDING_AUTH_EVENTS": "tcp://127.0.0.1:\(base + 1)",
            "ONBOARDING_PROFILE_RPC": "tcp://127.0.0.1:\(base + 2)", "ONBOARDING_PROFILE_EVENTS": "tcp://127.0.0.1:\(base + 3)",
            "ONBOARDING_IMAGE_RPC": "tcp://127.0.0.1:\(base + 4)", "ONBOARDING_ORCHESTRATOR_RPC": "tcp://127.0.0.1:\(base + 5)",
            "ONBOARDING_ROUTES": "tcp://127.0.0.1:\(base + 6)", "ONBOARDING_GATEWAY_HTTP": "http://127.0.0.1:\(base + 7)",
            "ONBOARDING_GATEWAY_HEARTBEAT_SECONDS": "1", "ONBOARDING_LOG_LEVEL": "warning",
            // Stopped with this test process, even when it crashes.
            "ONBOARDING_EXIT_WITH_PARENT": String(ProcessInfo.processInfo.processIdentifier),
        ].merging(extra) { $1 }) { $1 }
        var services: [ChildProcess] = []
        for (name, arguments) in [
            ("auth-service", ["--auth-dev-mode"]), ("profile-service", []), ("image-upload-service", []),
            ("onboarding-orchestrator", []),
        ] {
            services.append(try Self.launch(name, arguments, environment))
        }
        self.services = services
    }

    var gatewayBase: String { "http://127.0.0.1:\(base + 7)" }

    /// An app's client on the internal bus, with `token` as its session.
    func client(bus: ZeroMQBus, token: String) -> OnboardingClient {
        OnboardingClient(
            bus: bus,
            configuration: .init(
                authRPC: Endpoint("tcp://127.0.0.1:\(base)"), profileRPC: Endpoint("tcp://127.0.0.1:\(base + 2)"),
                orchestratorRPC: Endpoint("tcp://127.0.0.1:\(base + 5)"), routes: Endpoint("tcp://127.0.0.1:\(base + 6)"),
                timeout: .seconds(5), name: "gateway-process-test"),
            session: .init(uid: "", sessionToken: token, provider: .kakao))
    }

    /// Starts the gateway and waits until it answers `GET /v1/health` with every service `ok`
    /// and follows the orchestrator.
    func startGateway() async throws {
        let process = try Self.launch("onboarding-gateway", [], environment)
        gatewayProcess.withLock { $0 = process }
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: .seconds(60))
        while true {
            if let reply = try? await GatewayHTTP(base: gatewayBase).send(.GET, "/v1/health"), reply.status == 200,
                let health = try? JSONDecoder().decode(GatewayHealthView.self, from: reply.body),
                health.streams.following, health.dependencies.allSatisfy({ $0.status == "ok" })
            {
                return
            }
            guard clock.now < deadline else { throw ServiceError(.timeout, "the gateway did not become ready in 60 s") }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    /// Sends `signal` to the gateway and waits until it has exited; returns its exit status.
    @discardableResult
    func signalGateway(_ signal: Int32) async -> Int32 {
        guard let process = gatewayProcess.withLock({ $0 }) else { return -1 }
        kill(process.processIdentifier, signal)
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: .seconds(15))
        while process.isRunning, clock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
        return process.isRunning ? -1 : process.terminationStatus
    }

    func stop() async {
        await signalGateway(SIGTERM)
        for process in services where process.isRunning { process.terminate() }
        for process in services {
            let clock = ContinuousClock()
            let deadline = clock.now.advanced(by: .seconds(15))
            while process.isRunning, clock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        }
        try? FileManager.default.removeItem(at: directory)
    }

    private static func launch(_ name: String, _ arguments: [String], _ environment: [String: String]) throws -> ChildProcess {
        try ChildProcess(binDirectory.appendingPathComponent(name), arguments: arguments, environment: environment)
    }

    /// The parts of `GET /v1/health` the readiness wait reads.
    private struct GatewayHealthView: Decodable {
        struct Dependency: Decodable { var status: String }
        struct Streams: Decodable { var following: Bool }
        var dependencies: [Dependency]
        var streams: Streams
    }
}

@Suite("The gateway as a real executable over ZeroMQ")
struct GatewayProcessTests {
    @Test("SIGKILLed and started again: a reconnect with Last-Event-ID gets every intent it missed, once; SIGTERM ends open streams")
    func sigkill() async throws {
        let system = try RunningExecutables()
        var logger = Logger(label: "gateway-process-test")
        logger.logLevel = .warning
        let bus = ZeroMQBus(source: "gateway-process-test", logger: logger, configuration: system.bus)
        do {
            try await system.startGateway()
            let http = GatewayHTTP(base: system.gatewayBase)
            let me = try await http.signIn("sigkill-\(UUID().uuidString)")
            let stream = try await EventStreamReader.open(base: system.gatewayBase, token: me.sessionToken)
            await stream.waitForIntents(1)
            let first = try #require(stream.intents.first)
            #expect(first.intent?.intent == .presentProfileSetup)

            #expect(await system.signalGateway(SIGKILL) != 0)
            await stream.waitForEnd()
            let seen = try #require(stream.lastEventID)

            // While no gateway runs, the person acts on the internal bus (another device).
            let device = system.client(bus: bus, token: me.sessionToken)
            _ = try await device.checkNow()
            let profile = try await device.setUpProfile(username: "kl\(Int.random(in: 1000...9999))")
            #expect(profile.uid == me.uid)

            try await system.startGateway()
            let again = try await EventStreamReader.open(base: system.gatewayBase, token: me.sessionToken, lastEventID: seen)
            await again.waitForIntents(2)
            let missed = again.intents
            #expect(missed.map { $0.intent?.intent } == [.presentProfileSetup, .dismiss])
            #expect(missed.first?.intent == first.intent)
            let sequences = missed.compactMap(\.sequence)
            #expect(sequences.count == 2 && sequences[0] > UInt64(seen)! && sequences[1] > sequences[0])
            // A heartbeat past the dismiss, and nothing more came: each missed intent once.
            let last = sequences.last ?? 0
            await again.wait(for: "a heartbeat past the dismiss") { $0.contains { !$0.isIntent && ($0.sequence ?? 0) >= last } }
            #expect(again.intents.count == 2)

            // SIGTERM: the gateway ends its open streams and exits cleanly.
            let status = await system.signalGateway(SIGTERM)
            #expect(status == 0, "the gateway's exit status after SIGTERM")
            await again.waitForEnd()
        } catch {
            await bus.shutdown()
            await system.stop()
            throw error
        }
        await bus.shutdown()
        await system.stop()
    }
}
