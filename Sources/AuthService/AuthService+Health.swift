import GRDB
import Messaging
import OnboardingAPI
import ServiceRuntime

extension AuthService {
    /// Auth answers `health` itself, to add its unlink queue (``HealthStatus/unlink``): on the
    /// bus's thread, in a read transaction (two small queries on `unlinkJob`).
    ///
    /// A stand-in until ``RequestDispatcher`` takes extra health fields the way it takes
    /// `feedStatistics`: the dispatcher's own `health` answer includes the requests the server
    /// refused itself (unreadable or over its queue) in `statistics`, and this one has the
    /// bus's counts alone.
    static func answerHealth(
        in dispatcher: inout RequestDispatcher, bus: any MessageBus, database: any DatabaseWriter, unlink: UnlinkWorker
    ) {
        let (source, startedAt) = (dispatcher.source, Timestamp.now())
        dispatcher.onLoop(HealthCheck.self, access: .open, database: database, writes: false) { _, _, db in
            HealthStatus(
                service: source, startedAt: startedAt, statistics: bus.statistics, unlink: try unlink.status(in: db))
        }
    }
}
