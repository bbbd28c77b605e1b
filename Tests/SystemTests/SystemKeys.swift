import Foundation
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
