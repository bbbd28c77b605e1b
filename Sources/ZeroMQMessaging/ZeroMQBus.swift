// Placeholder with the agreed interface; the real implementation lands from the `zmq` branch.
import Logging
import Messaging
import ServiceLifecycle

public final class ZeroMQBus: MessageBus, Service {
    public init(source: String, logger: Logger) { fatalError("placeholder") }
    public var statistics: BusStatistics { fatalError("placeholder") }
    public func publisher(at endpoint: Endpoint) async throws -> any EventPublisher { fatalError("placeholder") }
    public func subscribe(to endpoints: [Endpoint], topics: [String], limits: MessageLimits) async throws -> AsyncStream<Message> { fatalError("placeholder") }
    public func serve(at endpoint: Endpoint, limits: MessageLimits) async throws -> AsyncStream<IncomingRequest> { fatalError("placeholder") }
    public func request(_ message: OutgoingMessage, to endpoint: Endpoint, timeout: Duration) async throws -> Message { fatalError("placeholder") }
    public func shutdown() async {}
    public func run() async throws {}
}
