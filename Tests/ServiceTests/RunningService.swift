import Foundation
import Logging
import Messaging
import OnboardingAPI
import ServiceLifecycle
import ServiceRuntime

/// A logger that keeps test output quiet.
let quietLogger = Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }

/// Runs `service` in a child task, waits until it answers `health` at `endpoint`, runs `body`,
/// then cancels the service and waits for it to finish (so its database is closed afterwards).
@discardableResult
func withRunningService<Result: Sendable>(
    _ service: some Service, on bus: any MessageBus, answeringAt endpoint: Endpoint,
    _ body: () async throws -> Result
) async throws -> Result {
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { try await service.run() }
        do {
            try await bus.waitUntilAnswering(endpoint, source: "test")
            let result = try await body()
            group.cancelAll()
            try await group.waitForAll()
            return result
        } catch {
            group.cancelAll()
            throw error
        }
    }
}

/// A fresh folder under the system's temporary directory, removed after `body`.
@discardableResult
func withTemporaryDirectory<Result>(_ body: (String) async throws -> Result) async throws -> Result {
    let path = FileManager.default.temporaryDirectory
        .appendingPathComponent("onboarding-tests-\(UUID().uuidString.lowercased())").path
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: path) }
    return try await body(path)
}
