import CoreMetrics
import Messaging
import Synchronization

/// The count and latency of one request type's replies, by outcome
/// (``MetricDefinition/requests``, ``MetricDefinition/requestDuration``).
///
/// Made once per type when the dispatcher registers it, and set as the ``ReplyObserver`` of
/// every request of that type, so each reply is counted wherever it is sent from. Answers cost
/// an atomic add and a histogram record, with no allocation; each error code's counter is made
/// the first time that code is replied (under a lock, off the common path).
final class RequestFigures: ReplyObserver {
    private let type: String
    private let factory: any MetricsFactory
    private let answered: Counter
    private let answeredTime: CoreMetrics.Timer
    private let failedTime: CoreMetrics.Timer
    private let failures = Mutex<[ErrorCode: Counter]>([:])

    /// At most this many error codes get series of their own per type; later ones count as
    /// `other`. The codes come from our own services, but a label must stay bounded whatever a
    /// reply says.
    static let maxCodes = 32

    /// - Parameter factory: where the handles are made; by default the task's (a test's own,
    ///   with `withMetricsFactory`) or the process's.
    init(type: String, factory: any MetricsFactory = MetricsSystem.factory) {
        self.type = type
        self.factory = factory
        let (requests, duration) = (MetricDefinition.requests.name, MetricDefinition.requestDuration.name)
        answered = Counter(label: requests, dimensions: [("type", type), ("outcome", "ok")], factory: factory)
        answeredTime = Timer(label: duration, dimensions: [("type", type), ("outcome", "ok")], factory: factory)
        failedTime = Timer(label: duration, dimensions: [("type", type), ("outcome", "error")], factory: factory)
    }

    func replied(_ reply: OutgoingMessage, received: ContinuousClock.Instant) {
        let nanoseconds = received.duration(to: .now).nanoseconds
        guard let code = reply.failure else {
            answered.increment()
            answeredTime.recordNanoseconds(nanoseconds)
            return
        }
        failures.withLock { failures in
            if let counter = failures[code] { return counter }
            let label = failures.count < Self.maxCodes && code.rawValue.allSatisfy(\.isLetter) ? code.rawValue : "other"
            let counter = Counter(
                label: MetricDefinition.requests.name, dimensions: [("type", type), ("outcome", label)], factory: factory)
            failures[code] = counter
            return counter
        }.increment()
        failedTime.recordNanoseconds(nanoseconds)
    }
}

extension Duration {
    /// The whole duration in nanoseconds, saturating.
    public var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        return overflow ? .max : scaled + attoseconds / 1_000_000_000
    }
}
