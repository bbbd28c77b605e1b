import Messaging
import OnboardingAPI

extension MessageBus {
    /// Waits until the service at `endpoint` answers `health`.
    ///
    /// While nothing listens there (`noResponder`), it asks again every 20 ms. When something
    /// listens but has not answered in time (`timeout`: a service still starting, or a busy
    /// machine), the next ask waits twice as long, from 0.5 s up to what is left of `timeout`,
    /// so that a service answering slowly is still found instead of being asked too briefly
    /// again and again.
    ///
    /// A probe rather than a retry (so not ``RetryPolicy/untilSuccess(_:failed:)``): what grows is
    /// the patience of each ask, not the wait between asks, and only "not there yet" is asked again.
    ///
    /// - Returns: the service's health reply.
    /// - Throws: the last ``ServiceError`` once `timeout` has passed.
    @discardableResult
    public func waitUntilAnswering(_ endpoint: Endpoint, source: String, timeout: Duration = .seconds(30)) async throws -> HealthStatus {
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: timeout)
        var patience = Duration.milliseconds(500)
        while true {
            let left = clock.now.duration(to: deadline)
            do {
                return try await call(HealthCheck(), to: endpoint, source: source, timeout: max(.milliseconds(1), min(patience, left)))
            } catch let error as ServiceError where error.code == .noResponder || error.code == .timeout {
                if clock.now >= deadline { throw error }
                if error.code == .timeout {
                    patience *= 2
                } else {
                    try await Task.sleep(for: .milliseconds(20))
                }
            }
        }
    }
}
