import FakeIdentityProvider
import Foundation
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime
import Testing
import ZeroMQMessaging

#if canImport(Glibc)
import Glibc
import TestSupport
#endif

/// The real `auth-service` executable with dev mode off, configured only through its environment
/// (as compose and the README's walkthrough do), verifying against a fake provider the test runs.
@Suite("Real sign-in with the auth-service executable", .serialized, .timeLimit(.minutes(2)))
struct ProductionSignInTests {
    /// Starts auth-service on loopback ports of its own, its data in `directory`.
    static func startAuth(
        base: String, rpc: Endpoint, events: Endpoint, directory: URL, more: [String: String] = [:]
    ) throws -> ChildProcess {
        var environment = ProcessInfo.processInfo.environment.merging(more) { $1 }.merging([
            "ONBOARDING_DATA_DIR": directory.path, "ONBOARDING_AUTH_RPC": rpc.rawValue,
            "ONBOARDING_AUTH_EVENTS": events.rawValue, "ONBOARDING_LOG_LEVEL": "warning",
            "ONBOARDING_AUTH_DEV_MODE": "0",
            // Stopped with this test process, even when it crashes.
            "ONBOARDING_EXIT_WITH_PARENT": String(ProcessInfo.processInfo.processIdentifier),
            "ONBOARDING_NAVER_CLIENT_IDS": FakeIdentityProvider.defaultClientID(.naver),
            "ONBOARDING_NAVER_PROFILE_URL": FakeIdentityProvider.naverProfileURL(base: base),
        ]) { $1 }
        for provider in FakeIdentityProvider.oidcProviders {
            let name = provider.rawValue.uppercased()
            environment["ONBOARDING_\(name)_CLIENT_IDS"] = FakeIdentityProvider.defaultClientID(provider)
            environment["ONBOARDING_\(name)_JWKS_URL"] = FakeIdentityProvider.jwksURL(provider, base: base)
        }
        return try ChildProcess(RunningSystem.binDirectory.appendingPathComponent("auth-service"), environment: environment)
    }

    static func stop(_ process: ChildProcess) async -> Int32 {
        if process.isRunning { process.terminate() }
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: .seconds(15))
        while process.isRunning, clock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        return process.isRunning ? -1 : process.terminationStatus
    }

    /// Runs `body` with a fake provider, a ZeroMQ bus, auth's two loopback endpoints and a data
    /// folder of its own, all gone afterwards.
    static func withSetting(
        _ body: (FakeIdentityProvider, ZeroMQBus, Endpoint, Endpoint, URL) async throws -> Void
    ) async throws {
        let fake = try await FakeIdentityProvider.make()
        // 17000-17999: no other suite's ports (the system tests take 26000-31999, the gateway's
        // process tests 16000-16999, the intent feed's 18000-19899).
        let port = 17_000 + Int.random(in: 0..<500) * 2
        let (rpc, events) = (Endpoint("tcp://127.0.0.1:\(port)"), Endpoint("tcp://127.0.0.1:\(port + 1)"))
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("onboarding-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var logger = Logger(label: "production-sign-in-test")
        logger.logLevel = .warning
        let keys = try testBusConfiguration(directory: directory, servers: ["auth": [rpc, events]])
        let bus = ZeroMQBus(source: "test", logger: logger, configuration: keys)
        do {
            try await body(fake, bus, rpc, events, directory)
        } catch {
            await bus.shutdown()
            throw error
        }
        await bus.shutdown()
    }

    @Test("each provider's token signs in, with the same uid after a restart of auth; bad tokens are refused")
    func eachProvider() async throws {
        try await Self.withSetting { fake, bus, rpc, events, directory in
            try await signInTwice(fake: fake, bus: bus, rpc: rpc, events: events, directory: directory)
        }
    }

    @Test("configured by its environment, auth exchanges Apple's code at sign-in and unlinks withdrawals at Apple and Kakao")
    func unlinkOnWithdrawal() async throws {
        try await Self.withSetting { fake, bus, rpc, events, directory in
            try await withdrawTwo(fake: fake, bus: bus, rpc: rpc, events: events, directory: directory)
        }
    }

    func withdrawTwo(fake: FakeIdentityProvider, bus: ZeroMQBus, rpc: Endpoint, events: Endpoint, directory: URL) async throws {
        let keyFile = directory.appendingPathComponent("AuthKey_KEY1234567.p8")
        try FakeIdentityProvider.makeAppleDeveloperKeyPEM().write(to: keyFile, atomically: true, encoding: .utf8)
        try await fake.withRunning { base in
            let auth = try Self.startAuth(
                base: base, rpc: rpc, events: events, directory: directory,
                more: [
                    "ONBOARDING_APPLE_TEAM_ID": "TEAM123456", "ONBOARDING_APPLE_KEY_ID": "KEY1234567",
                    "ONBOARDING_APPLE_PRIVATE_KEY_PATH": keyFile.path,
                    "ONBOARDING_APPLE_TOKEN_URL": "\(base)\(FakeIdentityProvider.appleTokenPath)",
                    "ONBOARDING_APPLE_REVOKE_URL": "\(base)/apple/auth/revoke",
                    "ONBOARDING_KAKAO_ADMIN_KEY": "kakao-admin-key", "ONBOARDING_KAKAO_UNLINK_URL": "\(base)/kakao/v1/user/unlink",
                ])
            do {
                _ = try await bus.waitUntilAnswering(rpc, source: "test", timeout: .seconds(30))
                let apple: SignInResult = try await bus.call(
                    SignIn(provider: .apple, subject: "", idToken: try fake.mintIDToken(.apple, subject: "a-7"), authorizationCode: "c-7"),
                    to: rpc, source: "test")
                let kakao: SignInResult = try await bus.call(
                    SignIn(provider: .kakao, subject: "", idToken: try fake.mintIDToken(.kakao, subject: "7007")), to: rpc, source: "test")
                for session in [apple, kakao] {
                    let _: AccountResult = try await bus.call(Withdraw(), to: rpc, source: "test", sessionToken: session.sessionToken)
                }
                let revoked = await fake.waitForRequests(path: "/apple/auth/revoke")
                #expect(revoked.first?.body.contains("token=\(FakeIdentityProvider.appleRefreshToken(forCode: "c-7"))") == true)
                let unlinked = await fake.waitForRequests(path: "/kakao/v1/user/unlink")
                #expect(unlinked.first?.body == "target_id_type=user_id&target_id=7007")
                #expect(unlinked.first?.authorization == "KakaoAK kakao-admin-key")
                let health: HealthStatus = try await bus.call(HealthCheck(), to: rpc, source: "test")
                #expect(health.unlink != nil, "auth's health shows its unlink queue")
            } catch {
                _ = await Self.stop(auth)
                throw error
            }
            #expect(await Self.stop(auth) == 0, "auth stops cleanly on SIGTERM")
        }
    }

    func signInTwice(fake: FakeIdentityProvider, bus: ZeroMQBus, rpc: Endpoint, events: Endpoint, directory: URL) async throws {
        try await fake.withRunning { base in
            func proofs() throws -> [SignIn] {
                try FakeIdentityProvider.oidcProviders.map { provider in
                    SignIn(provider: provider, subject: "", idToken: try fake.mintIDToken(provider, subject: "person-7"))
                } + [SignIn(provider: .naver, subject: "", accessToken: fake.naverAccessToken(for: "person-7"))]
            }
            var first: [Provider: String] = [:]
            for round in 0..<2 {
                let auth = try Self.startAuth(base: base, rpc: rpc, events: events, directory: directory)
                do {
                    _ = try await bus.waitUntilAnswering(rpc, source: "test", timeout: .seconds(30))
                    for request in try proofs() {
                        // A fresh auth fetches each provider's keys first; on a loaded machine that
                        // can outlast its deadline, answered dependencyUnavailable (nothing changed),
                        // which an app sends again.
                        let result: SignInResult = try await bus.callRetrying(
                            request, to: rpc, source: "test", deadline: .seconds(30), retryingOn: [.dependencyUnavailable])
                        #expect(result.isNewAccount == (round == 0), "\(request.provider) round \(round)")
                        if round == 0 { first[request.provider] = result.uid }
                        #expect(first[request.provider] == result.uid, "\(request.provider): the same uid every time")
                    }
                    let wrongAudience = SignIn(
                        provider: .kakao, subject: "",
                        idToken: try fake.mintIDToken(.kakao, subject: "person-7", audience: "another-app"))
                    let error = await #expect(throws: ServiceError.self) {
                        let _: SignInResult = try await bus.call(wrongAudience, to: rpc, source: "test")
                    }
                    #expect(error?.code == .unauthenticated && error?.reason == "wrongAudience")
                } catch {
                    _ = await Self.stop(auth)
                    throw error
                }
                #expect(await Self.stop(auth) == 0, "auth stops cleanly on SIGTERM")
            }
            #expect(Set(first.values).count == 4)
        }
    }
}
