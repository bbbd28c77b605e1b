import AuthPostgres
import AuthService
import Foundation
import Messaging
import OnboardingAPI
import ServiceRuntime
import TestSupport
import Testing

/// A service told to stop while it is still starting (opening its pool, migrating) stops.
///
/// Found when the test run hung: a test cancelled by its time limit started auth on PostgreSQL,
/// and the pool was shut under the migration's transaction, whose next statement postgres-nio
/// then never answered. The moments below span the start-up on this machine (cancelled at 35
/// and 60 ms, auth hung every time before the fix).
@Suite("A service stopped during its start-up", .enabled(if: TestPostgres.url != nil), .timeLimit(.minutes(2)))
struct StopDuringStartTests {
    @Test("auth on PostgreSQL, cancelled at moments across its start-up, stops", arguments: [0, 10, 20, 35, 60, 100])
    func authStopsDuringStart(afterMilliseconds delay: Int) async throws {
        let bus = InProcessBus()
        let starting = Task {
            try await withAuthDatabase(.postgres, inMemory: true) { database in
                var configuration = AuthService.Configuration(rpc: Defaults.authRPC, events: Defaults.authEvents, devMode: true)
                configuration.database = database
                let service = try AuthService(configuration: configuration, bus: bus, logger: quietLogger)
                try await withRunningService(service, on: bus, answeringAt: Defaults.authRPC) {}
            }
        }
        try await Task.sleep(for: .milliseconds(delay))
        starting.cancel()
        // Ends (with whatever it threw): the time limit fails the test if it does not.
        _ = await starting.result
    }
}
