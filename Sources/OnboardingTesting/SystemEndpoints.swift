import Foundation
import OnboardingClient

/// Every endpoint of one system: where each service answers requests and publishes events.
///
/// ``inProcess`` names them on an ``InProcessBus`` (what ``InProcessSystem`` and the stand-ins
/// use by default); ``tcp(base:)`` puts them on loopback ports for real processes.
public struct SystemEndpoints: Sendable, Hashable {
    public var authRPC: Endpoint
    public var authEvents: Endpoint
    public var profileRPC: Endpoint
    public var profileEvents: Endpoint
    public var imageRPC: Endpoint
    public var orchestratorRPC: Endpoint
    /// The orchestrator's route-intent publisher (topics `route.<uid>`).
    public var routes: Endpoint

    public init(
        authRPC: Endpoint, authEvents: Endpoint, profileRPC: Endpoint, profileEvents: Endpoint, imageRPC: Endpoint,
        orchestratorRPC: Endpoint, routes: Endpoint
    ) {
        self.authRPC = authRPC
        self.authEvents = authEvents
        self.profileRPC = profileRPC
        self.profileEvents = profileEvents
        self.imageRPC = imageRPC
        self.orchestratorRPC = orchestratorRPC
        self.routes = routes
    }

    /// Endpoints on loopback, `base` and the six ports above it (for real processes).
    public static func tcp(base: Int) -> SystemEndpoints {
        func at(_ offset: Int) -> Endpoint { Endpoint("tcp://127.0.0.1:\(base + offset)") }
        return SystemEndpoints(
            authRPC: at(0), authEvents: at(1), profileRPC: at(2), profileEvents: at(3), imageRPC: at(4),
            orchestratorRPC: at(5), routes: at(6))
    }

    /// The names every helper of this module uses on an ``InProcessBus``.
    public static let inProcess = SystemEndpoints(
        authRPC: "inproc://auth", authEvents: "inproc://auth-events", profileRPC: "inproc://profile",
        profileEvents: "inproc://profile-events", imageRPC: "inproc://image", orchestratorRPC: "inproc://orchestrator",
        routes: "inproc://routes")

    /// The four request endpoints, each with the name of the service that answers there.
    public var rpcEndpoints: [(service: String, endpoint: Endpoint)] {
        [(ServiceName.auth, authRPC), (ServiceName.profile, profileRPC), (ServiceName.imageUpload, imageRPC),
         (ServiceName.orchestrator, orchestratorRPC)]
    }

    /// A client configuration for these endpoints, with timings for tests: each attempt waits
    /// `timeout`, a retried call gives up after `deadline`.
    public func clientConfiguration(
        name: String = "app", timeout: Duration = .seconds(5), deadline: Duration = Defaults.retryDeadline
    ) -> OnboardingClient.Configuration {
        OnboardingClient.Configuration(
            authRPC: authRPC, profileRPC: profileRPC, orchestratorRPC: orchestratorRPC, routes: routes,
            timeout: timeout, deadline: deadline, name: name)
    }

    /// A client of these endpoints on `bus` (see ``clientConfiguration(name:timeout:deadline:)``).
    public func client(
        _ bus: any MessageBus, name: String = "app", session: OnboardingClient.Session? = nil,
        timeout: Duration = .seconds(5), deadline: Duration = Defaults.retryDeadline
    ) -> OnboardingClient {
        OnboardingClient(
            bus: bus, configuration: clientConfiguration(name: name, timeout: timeout, deadline: deadline), session: session)
    }
}
