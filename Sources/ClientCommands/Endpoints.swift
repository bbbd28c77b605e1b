import ArgumentParser
import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingClient
import ZeroMQMessaging

/// Where the services are, for the command-line tools.
public struct EndpointOptions: ParsableArguments {
    @Option(help: "auth's request endpoint. Env: ONBOARDING_AUTH_RPC. Default: \(Defaults.authRPC)")
    var authRpc: String?
    @Option(help: "profile's request endpoint. Env: ONBOARDING_PROFILE_RPC. Default: \(Defaults.profileRPC)")
    var profileRpc: String?
    @Option(help: "image-upload's request endpoint. Env: ONBOARDING_IMAGE_RPC. Default: \(Defaults.imageRPC)")
    var imageRpc: String?
    @Option(help: "The orchestrator's request endpoint. Env: ONBOARDING_ORCHESTRATOR_RPC. Default: \(Defaults.orchestratorRPC)")
    var orchestratorRpc: String?
    @Option(help: "The route-intent publisher. Env: ONBOARDING_ROUTES. Default: \(Defaults.routes)")
    var routes: String?

    public init() {}

    public var authRPC: Endpoint { Settings.endpoint(authRpc, env: "ONBOARDING_AUTH_RPC", default: Defaults.authRPC) }
    public var profileRPC: Endpoint { Settings.endpoint(profileRpc, env: "ONBOARDING_PROFILE_RPC", default: Defaults.profileRPC) }
    public var imageRPC: Endpoint { Settings.endpoint(imageRpc, env: "ONBOARDING_IMAGE_RPC", default: Defaults.imageRPC) }
    public var orchestratorRPC: Endpoint {
        Settings.endpoint(orchestratorRpc, env: "ONBOARDING_ORCHESTRATOR_RPC", default: Defaults.orchestratorRPC)
    }
    public var routesEndpoint: Endpoint { Settings.endpoint(routes, env: "ONBOARDING_ROUTES", default: Defaults.routes) }

    func clientConfiguration(_ calls: CallOptions) -> OnboardingClient.Configuration {
        OnboardingClient.Configuration(
            authRPC: authRPC, profileRPC: profileRPC, orchestratorRPC: orchestratorRPC, routes: routesEndpoint,
            timeout: .milliseconds(calls.timeoutMs), deadline: .milliseconds(calls.deadlineMs))
    }

    /// Every service's name and request endpoint.
    public var services: [(name: String, endpoint: Endpoint)] {
        [(ServiceName.auth, authRPC), (ServiceName.profile, profileRPC), (ServiceName.imageUpload, imageRPC),
         (ServiceName.orchestrator, orchestratorRPC)]
    }
}

/// How long the client tools wait for replies, and keep resending.
struct CallOptions: ParsableArguments {
    @Option(help: "How long to wait for a reply, in milliseconds.")
    var timeoutMs: Int = 3000
    @Option(help: "How long to keep resending a request that is safe to repeat while the service does not answer, in milliseconds.")
    var deadlineMs: Int = 10_000
}

/// Runs `body` with a ZeroMQ bus, shutting the bus down afterwards; a ``ServiceError`` is
/// printed with its code and a hint, and the command exits with status 1.
func withBus<T: Sendable>(name: String, _ body: (ZeroMQBus) async throws -> T) async throws -> T {
    var logger = Logger(label: name)
    logger.logLevel = .warning
    let bus = ZeroMQBus(source: name, logger: logger)
    do {
        let value = try await body(bus)
        await bus.shutdown()
        return value
    } catch let error as ServiceError {
        await bus.shutdown()
        Terminal.report(error)
        throw ExitCode.failure
    } catch {
        await bus.shutdown()
        throw error
    }
}

/// Sets up logging for a command-line tool: warnings and worse, to standard error.
func bootstrapToolLogging() {
    LoggingSystem.bootstrap { label in
        var handler = StreamLogHandler.standardError(label: label)
        handler.logLevel = .warning
        return handler
    }
}
