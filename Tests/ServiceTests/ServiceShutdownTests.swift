import AuthService
import Foundation
import GRDB
import Messaging
import OnboardingAPI
import OnboardingOrchestrator
import ProfileService
import ServiceRuntime
import Testing

/// A service that has stopped has let go of its database: starting it again in the same process
/// (a restart test, an embedding app) finds the file free, whatever still holds a reference to
/// the service's handlers.
@Suite("Services close their databases when they stop")
struct ServiceShutdownTests {

    /// Leaving WAL mode needs the only connection to the file. With no busy timeout, any
    /// connection left open, or closing at that moment, makes this fail at once.
    static func expectAlone(_ path: String, _ service: String) async throws {
        do {
            let alone = try DatabaseQueue(path: path)
            let mode = try await alone.writeWithoutTransaction { try String.fetchOne($0, sql: "PRAGMA journal_mode = DELETE") }
            #expect(mode == "delete", "\(service) left its database open")
            try alone.close()
        } catch {
            Issue.record("\(service) left its database open: \(error)")
        }
    }

    @Test("auth, profile and the orchestrator close their database when run returns")
    func closedWhenStopped() async throws {
        try await withTemporaryDirectory { directory in
            let bus = InProcessBus()
            let e = (
                authRPC: Endpoint("inproc://closing-auth"), authEvents: Endpoint("inproc://closing-auth-events"),
                profileRPC: Endpoint("inproc://closing-profile"), profileEvents: Endpoint("inproc://closing-profile-events"),
                orchestratorRPC: Endpoint("inproc://closing-orchestrator"), routes: Endpoint("inproc://closing-routes"),
                imageRPC: Endpoint("inproc://closing-images"))

            let authPath = "\(directory)/auth.sqlite"
            let auth = try AuthService(
                configuration: .init(rpc: e.authRPC, events: e.authEvents, databasePath: authPath, devMode: true),
                bus: bus, logger: quietLogger)
            try await withRunningService(auth, on: bus, answeringAt: e.authRPC) {
                _ = try await bus.call(SignIn(provider: .google, subject: "closing"), to: e.authRPC, source: "test")
            }
            // The bus still holds what the service registered on it; the service object is alive.
            try await Self.expectAlone(authPath, "auth")
            withExtendedLifetime(auth) {}

            let profilePath = "\(directory)/profile.sqlite"
            let profile = try ProfileService(
                configuration: .init(
                    rpc: e.profileRPC, events: e.profileEvents, authRPC: e.authRPC, databasePath: profilePath,
                    serviceToken: "secret"),
                bus: bus, logger: quietLogger, sessions: StubSessions())
            try await withRunningService(profile, on: bus, answeringAt: e.profileRPC) {
                _ = try await bus.call(
                    CreateProfile(username: "closing"), to: e.profileRPC, source: "test", uid: UUID().uuidString.lowercased(),
                    serviceToken: "secret")
            }
            try await Self.expectAlone(profilePath, "profile")
            withExtendedLifetime(profile) {}

            let orchestratorPath = "\(directory)/orchestrator.sqlite"
            let orchestrator = try OnboardingOrchestrator(
                configuration: .init(
                    rpc: e.orchestratorRPC, routes: e.routes, authRPC: e.authRPC, authEvents: e.authEvents,
                    profileRPC: e.profileRPC, profileEvents: e.profileEvents, imageRPC: e.imageRPC,
                    databasePath: orchestratorPath, callTimeout: .milliseconds(100)),
                bus: bus, logger: quietLogger, sessions: StubSessions())
            try await withRunningService(orchestrator, on: bus, answeringAt: e.orchestratorRPC) {
                _ = try await bus.call(HealthCheck(), to: e.orchestratorRPC, source: "test")
            }
            try await Self.expectAlone(orchestratorPath, "the orchestrator")
            withExtendedLifetime(orchestrator) {}
        }
    }
}
