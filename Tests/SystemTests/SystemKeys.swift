import Foundation
import Logging
import Messaging
import OnboardingTesting
import ServiceHosting
import ZeroMQMessaging

extension SystemEndpoints {
    /// Which server binds each endpoint, by its key name.
    var servers: [String: [Endpoint]] {
        ["auth": [authRPC, authEvents], "profile": [profileRPC, profileEvents], "image-upload": [imageRPC],
         "orchestrator": [orchestratorRPC, routes]]
    }
}

/// A bus configuration for a test that talks to executables started with `directory` as their
/// data directory: every program's keys made in `directory/keys`, and the test's own ("test").
func testBusConfiguration(directory: URL, servers: [String: [Endpoint]]) throws -> ZeroMQBus.Configuration {
    var configuration = ZeroMQBus.Configuration()
    configuration.keys = try BusSecurity.makeKeys(
        in: directory.appendingPathComponent("keys").path, andLoad: "test", servers: servers)
    return configuration
}

/// A bus with the key of `name` (one of the programs') from `directory/keys`: for a test that
/// needs a right only that program has, such as replaying profile's events as the orchestrator.
func testBus(as name: String, directory: URL, servers: [String: [Endpoint]]) throws -> ZeroMQBus {
    var configuration = ZeroMQBus.Configuration()
    configuration.keys = try BusKeys.load(from: directory.appendingPathComponent("keys").path, identity: name, servers: servers)
    var logger = Logger(label: "test-as-\(name)")
    logger.logLevel = .warning
    return ZeroMQBus(source: "test-as-\(name)", logger: logger, configuration: configuration)
}
