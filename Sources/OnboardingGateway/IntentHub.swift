import CoreMetrics
import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingClient
import ServiceLifecycle
import ServiceRuntime
import Synchronization

/// What an intent stream receives from the hub.
public enum HubItem: Sendable, Hashable {
    /// A route intent for the subscriber's person.
    case intent(ReceivedIntent)
    /// Time for a heartbeat: every intent up to `through` (everyone's route sequence) has been
    /// handed to the subscriber, so a client that reconnects from there misses nothing.
    case heartbeat(through: UInt64)
}

/// Follows every route intent the orchestrator publishes, once, and hands each to the intent
/// streams of its person.
///
/// One ``EventFeed`` (the live `route.` topic, gaps filled from the orchestrator's
/// `events.after`) feeds every stream of this gateway, so the orchestrator sees one subscriber
/// per gateway, not one per app. It starts following from the orchestrator's newest intent when
/// the gateway starts; a stream that needs older intents replays them itself (``RouteReplay``).
///
/// Thread safety: every method may be called from any task; the subscribers sit behind a mutex.
/// Each subscription is an `AsyncStream` that buffers at most `bufferLimit` items; one whose
/// client reads too slowly is finished (the client reconnects with `Last-Event-ID`).
public final class IntentHub: Service, Sendable {
    /// One stream's view of the hub.
    public struct Subscription: Sendable {
        public let items: AsyncStream<HubItem>
        /// The hub's position when the subscription began: every intent after it reaches `items`.
        public let from: UInt64
    }

    private struct Subscriber {
        let continuation: AsyncStream<HubItem>.Continuation
    }

    private struct State {
        var subscribers: [String: [UInt64: Subscriber]] = [:]
        var nextID: UInt64 = 0
        /// The last route sequence handed over (`nil` until the hub follows the orchestrator).
        var position: UInt64?
        var stopping = false
    }

    private let configuration: GatewayConfiguration
    private let bus: any MessageBus
    private let logger: Logger
    private let feed: EventFeed
    private let state = Mutex(State())
    /// Open streams, for the metrics (``MetricDefinition/intentStreams``).
    private let openStreamsMeter = Meter(label: MetricDefinition.intentStreams.name)

    public init(configuration: GatewayConfiguration, bus: any MessageBus, logger: Logger) {
        self.configuration = configuration
        self.bus = bus
        self.logger = logger
        self.feed = EventFeed(
            bus: bus, events: configuration.routes, replay: configuration.orchestratorRPC, topics: [Topics.routePrefix],
            source: configuration.name, serviceToken: configuration.serviceToken, callTimeout: configuration.callTimeout,
            logger: logger)
    }

    /// The last route sequence handed to the streams, once the hub follows the orchestrator.
    public var position: UInt64? { state.withLock { $0.position } }

    /// How many intent streams are open.
    public var openStreams: Int { state.withLock { $0.subscribers.values.reduce(0) { $0 + $1.count } } }

    /// The hub's feed: how it has followed the orchestrator.
    public var feedStatistics: FeedStatistics { feed.statistics }

    /// Follows the orchestrator until the task is cancelled. On graceful shutdown every stream
    /// is finished (their clients reconnect to another gateway, or this one once restarted) and
    /// new subscriptions are refused.
    public func run() async throws {
        try await withGracefulShutdownHandler {
            guard let start = await startingPoint() else { return }
            state.withLock { $0.position = start }
            logger.info("following route intents at \(configuration.routes) from sequence \(start)")
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { [self] in
                    await feed.run(after: start) { batch, through in self.dispatch(batch, through: through) }
                }
                group.addTask { [self] in
                    // Ends quietly when cancelled: stopping is not a failure.
                    while (try? await Task.sleep(for: configuration.heartbeat)) != nil {
                        beat()
                    }
                }
            }
        } onGracefulShutdown: {
            self.stop()
        }
    }

    /// Waits until the hub follows the orchestrator, at most `timeout`.
    ///
    /// - Throws: ``ProblemError`` `dependencyUnavailable` when it does not in time,
    ///   `shuttingDown` when the gateway is stopping.
    public func waitUntilFollowing(timeout: Duration) async throws {
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: timeout)
        while true {
            let (following, stopping) = state.withLock { ($0.position != nil, $0.stopping) }
            if stopping {
                throw ProblemError(.shuttingDown, "This gateway is stopping; reconnect (to another one, or to it once restarted).")
            }
            if following { return }
            guard clock.now < deadline else {
                throw ProblemError(
                    .dependencyUnavailable,
                    "The gateway cannot reach the orchestrator's route intents yet; try again in a moment.",
                    reason: ServiceName.orchestrator)
            }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    /// Starts handing `uid`'s intents over. The subscription ends when its `items` are no
    /// longer iterated, when its buffer overflows, or when the gateway stops.
    ///
    /// - Throws: ``ProblemError`` `shuttingDown` when the gateway is stopping, or
    ///   `dependencyUnavailable` when the hub does not follow the orchestrator yet.
    public func subscribe(uid: String) throws -> Subscription {
        let (items, continuation) = AsyncStream.makeStream(
            of: HubItem.self, bufferingPolicy: .bufferingOldest(max(2, configuration.streamBuffer)))
        let (id, from): (UInt64, UInt64) = try state.withLock { state in
            if state.stopping {
                throw ProblemError(.shuttingDown, "This gateway is stopping; reconnect in a moment.")
            }
            guard let position = state.position else {
                throw ProblemError(
                    .dependencyUnavailable, "The gateway does not follow the orchestrator's route intents yet; try again in a moment.",
                    reason: ServiceName.orchestrator)
            }
            let id = state.nextID
            state.nextID += 1
            state.subscribers[uid, default: [:]][id] = Subscriber(continuation: continuation)
            return (id, position)
        }
        openStreamsMeter.increment()
        continuation.onTermination = { [weak self] _ in self?.remove(uid: uid, id: id) }
        return Subscription(items: items, from: from)
    }

    // MARK: Internals

    /// The orchestrator's newest route sequence, asked until it answers. `nil` when cancelled.
    private func startingPoint() async -> UInt64? {
        await RetryPolicy().untilSuccess {
            try await bus.call(
                EventsAfter(sequence: UInt64(Int64.max), limit: 1), to: configuration.orchestratorRPC,
                source: configuration.name, serviceToken: configuration.serviceToken, timeout: configuration.callTimeout
            ).lastSequence
        } failed: { error, _, delay in
            logger.warning(
                "the orchestrator at \(configuration.orchestratorRPC) did not say where its route intents are (\(error)); asking again in \(delay)")
        }
    }

    private func dispatch(_ batch: [Message], through: UInt64) {
        var intents: [(String, ReceivedIntent)] = []
        for message in batch {
            guard message.header.type == RouteIntent.type, let intent = try? message.payload(as: RouteIntent.self),
                message.topic == nil || message.topic == Topics.route(uid: intent.uid)
            else {
                logger.error("route event \(message.header.sequence) is not a readable route intent; no stream gets it")
                continue
            }
            intents.append(
                (intent.uid, ReceivedIntent(intent: intent, time: message.header.time, sequence: message.header.sequence)))
        }
        let overflowed: [AsyncStream<HubItem>.Continuation] = state.withLock { state in
            state.position = max(state.position ?? 0, through)
            var overflowed: [AsyncStream<HubItem>.Continuation] = []
            for (uid, received) in intents {
                for subscriber in state.subscribers[uid].map({ Array($0.values) }) ?? [] {
                    if case .dropped = subscriber.continuation.yield(.intent(received)) {
                        overflowed.append(subscriber.continuation)
                    }
                }
            }
            return overflowed
        }
        finish(overflowed)
    }

    private func beat() {
        let overflowed: [AsyncStream<HubItem>.Continuation] = state.withLock { state in
            guard let position = state.position else { return [] }
            var overflowed: [AsyncStream<HubItem>.Continuation] = []
            for subscriber in state.subscribers.values.lazy.flatMap(\.values) {
                if case .dropped = subscriber.continuation.yield(.heartbeat(through: position)) {
                    overflowed.append(subscriber.continuation)
                }
            }
            return overflowed
        }
        finish(overflowed)
    }

    private func finish(_ overflowed: [AsyncStream<HubItem>.Continuation]) {
        guard !overflowed.isEmpty else { return }
        logger.notice("\(overflowed.count) intent stream(s) read too slowly and were closed; their clients reconnect with Last-Event-ID")
        for continuation in overflowed { continuation.finish() }
    }

    private func remove(uid: String, id: UInt64) {
        let removed = state.withLock { state in
            let removed = state.subscribers[uid]?.removeValue(forKey: id) != nil
            if state.subscribers[uid]?.isEmpty == true { state.subscribers[uid] = nil }
            return removed
        }
        if removed { openStreamsMeter.decrement() }
    }

    private func stop() {
        let continuations = state.withLock { state in
            state.stopping = true
            return state.subscribers.values.flatMap { $0.values.map(\.continuation) }
        }
        for continuation in continuations { continuation.finish() }
    }
}
