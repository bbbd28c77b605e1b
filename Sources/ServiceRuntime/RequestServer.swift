import Logging
import Messaging
import ServiceLifecycle

/// Serves a ``RequestDispatcher`` at an endpoint until graceful shutdown.
///
/// Each request is handled in a child task, so a slow handler does not hold up the others.
/// On graceful shutdown it stops taking requests (unbinding the endpoint), lets the ones in
/// flight finish, then returns.
public struct RequestServer: Service {
    public let bus: any MessageBus
    public let endpoint: Endpoint
    public let limits: MessageLimits
    public let dispatcher: RequestDispatcher
    public let logger: Logger

    public init(bus: any MessageBus, endpoint: Endpoint, limits: MessageLimits = MessageLimits(),
                dispatcher: RequestDispatcher, logger: Logger) {
        self.bus = bus
        self.endpoint = endpoint
        self.limits = limits
        self.dispatcher = dispatcher
        self.logger = logger
    }

    public func run() async throws {
        let requests = try await bus.serve(at: endpoint, limits: limits)
        logger.info("\(dispatcher.source) answers requests at \(endpoint)")
        let bus = self.bus
        let dispatcher = self.dispatcher
        await withDiscardingTaskGroup { group in
            for await request in requests.cancelOnGracefulShutdown() {
                group.addTask { await dispatcher.handle(request, statistics: bus.statistics) }
            }
        }
        logger.info("\(dispatcher.source) stopped taking requests at \(endpoint)")
    }
}
