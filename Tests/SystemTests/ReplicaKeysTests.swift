import Foundation
import Messaging
import OnboardingSettings
import ServiceHosting
import Testing

/// The bus's keys for a replica that binds a wildcard address, as the README's two-host example does.
@Suite("Replica keys")
struct ReplicaKeysTests {
    @Test("a replica bound on tcp://* knows its own key at loopback, and its publisher keeps the rights table")
    func wildcardBind() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-keys-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        do {
            _ = try BusSecurity.makeKeys(in: directory, names: BusSecurity.standardNames)
            let settings = Settings(environment: [
                "ONBOARDING_KEYS_DIR": directory,
                "ONBOARDING_AUTH_RPC": "tcp://10.0.0.1:7101,tcp://10.0.0.2:7101",
                "ONBOARDING_AUTH_EVENTS": "tcp://10.0.0.1:7102,tcp://10.0.0.2:7102",
                "ONBOARDING_RPC_BIND": "tcp://*:7101", "ONBOARDING_EVENTS_BIND": "tcp://*:7102",
            ])
            let keys = try #require(try BusSecurity.keys(for: .auth, settings: settings))
            // Its metrics ask it for its health here.
            #expect(try BusSecurity.ownRequestEndpoint(of: .auth, settings: settings) == "tcp://127.0.0.1:7101")
            #expect(keys.serverKey(for: "tcp://127.0.0.1:7101") == keys.own.publicKey)
            #expect(keys.serverKey(for: "tcp://10.0.0.2:7101") == keys.own.publicKey)
            // Its publisher asks at the address it binds: only the orchestrator may follow.
            #expect(keys.mayFollow("orchestrator", "tcp://*:7102"))
            #expect(!keys.mayFollow("gateway", "tcp://*:7102"))
        }
    }
}
