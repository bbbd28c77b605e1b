import Messaging
import OnboardingAPI

extension MessageBus {
    /// Waits until the service at `endpoint` answers `health`, asking again every 20 ms while it
    /// is not there yet.
    ///
    /// - Returns: the service's health reply.
    /// - Throws: the last ``ServiceError`` once `timeout` has passed.
    @discardableResult
    public func waitUntilAnswering(_ endpoint: Endpoint, source: String, timeout: Duration = .seconds(10)) async throws -> HealthStatus {
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: timeout)
        while true {
            do {
                return try await call(HealthCheck(), to: endpoint, source: source, timeout: .milliseconds(500))
            } catch let error as ServiceError where error.code == .noResponder || error.code == .timeout {
                if clock.now >= deadline { throw error }
                try await Task.sleep(for: .milliseconds(20))
            }
        }
    }
}
