import Logging
import Messaging
import ServiceLifecycle
import Synchronization

/// Serves a ``RequestDispatcher`` at an endpoint until graceful shutdown.
///
/// - Requests arrive on the bus's own thread, in batches. Those the dispatcher answers there
///   (``RequestDispatcher/onLoop(_:access:database:writes:attachment:replyUID:_:)``, the hot
///   path) are read, committed together and answered on that thread.
/// - Every other request is handled in a child task, so a slow handler does not hold up the
///   others; at most ``maxInFlight`` run at once, and of those at most
///   ``maxAttachmentsInFlight`` carry a binary frame (each holds its bytes until answered).
///   Beyond that they wait in a queue of ``MessageLimits/queueLimit``; when it is full the newest
///   are answered with `overloaded`.
/// - On graceful shutdown it takes no new work: requests that still arrive are answered with
///   `shuttingDown`. Once every request in flight has been answered, it unbinds the endpoint and
///   returns, so no reply is lost and nobody waits for one that will not come.
public struct RequestServer: Service {
    public let bus: any MessageBus
    public let endpoint: Endpoint
    public let limits: MessageLimits
    public let dispatcher: RequestDispatcher
    public let logger: Logger
    public let maxInFlight: Int
    /// How many of the requests in flight may carry a binary frame; `nil`: as many as
    /// ``maxInFlight``. What the frames hold in memory is bounded by this, not by cheap requests.
    public let maxAttachmentsInFlight: Int?

    public init(
        bus: any MessageBus, endpoint: Endpoint, limits: MessageLimits = MessageLimits(),
        dispatcher: RequestDispatcher, logger: Logger, maxInFlight: Int = 1024, maxAttachmentsInFlight: Int? = nil
    ) {
        self.bus = bus
        self.endpoint = endpoint
        self.limits = limits
        self.dispatcher = dispatcher
        self.logger = logger
        self.maxInFlight = max(1, maxInFlight)
        self.maxAttachmentsInFlight = maxAttachmentsInFlight.map { max(1, $0) }
    }

    private struct Drained: Error {}

    public func run() async throws {
        let (bus, dispatcher, source) = (self.bus, self.dispatcher, self.dispatcher.source)
        let work = InFlight(limit: maxInFlight)
        let attachments = maxAttachmentsInFlight.map(Slots.init(limit:))
        let counts = RefusalCounts()
        let (requests, intake) = AsyncStream.makeStream(
            of: IncomingRequest.self, bufferingPolicy: .bufferingOldest(limits.queueLimit))
        let shuttingDown = ServiceError(.shuttingDown, "\(source) is shutting down; try again in a moment.")
        let overloaded = ServiceError(.overloaded, "The service has too many requests in flight; try again shortly.")
        let registration = try await bus.serve(at: endpoint, limits: limits) { batch in
            // Every request counts until answered, so that draining waits for answers that
            // depend on another service too.
            dispatcher.handleOnLoop(
                batch.map(work.tracking), refusing: work.isDraining ? shuttingDown : nil,
                rejected: { counts.value.withLock { $0.rejectedRequests += 1 } }
            ) { request in
                if case .dropped = intake.yield(request) {
                    counts.value.withLock { $0.overloadedRequests += 1 }
                    request.fail(overloaded, source: source)
                }
            }
        }
        defer {
            registration.close()
            intake.finish()
        }
        logger.info("\(dispatcher.source) answers requests at \(endpoint)")
        dispatcher.warnIfTrustingEveryone()
        /// The bus's counts with the requests this server refused itself.
        let statistics: @Sendable () -> BusStatistics = {
            var statistics = bus.statistics
            let own = counts.value.withLock { $0 }
            statistics.rejectedRequests += own.rejectedRequests
            statistics.overloadedRequests += own.overloadedRequests
            return statistics
        }
        do {
            try await withGracefulShutdownHandler {
                // Both the watcher and the accept loop are child tasks: when the watcher throws,
                // the group cancels the accept loop, which ends the stream and unbinds.
                try await withThrowingDiscardingTaskGroup { group in
                    group.addTask {
                        await work.waitUntilDrained()
                        throw Drained()
                    }
                    group.addTask {
                        // Cancelled (not shut down gracefully): admit nothing more either.
                        await withTaskCancellationHandler {
                        await withDiscardingTaskGroup { handlers in
                            for await request in requests {
                                guard await work.acquire() else {
                                    request.fail(shuttingDown, source: source)
                                    continue
                                }
                                // Waited for here, not in the handler: a request waiting for room
                                // already holds its bytes, so it waits in the bounded queue.
                                let slots = request.message.attachment == nil ? nil : attachments
                                await slots?.acquire()
                                handlers.addTask {
                                    await dispatcher.handle(request, statistics: statistics())
                                    slots?.release()
                                    work.release()
                                }
                            }
                            // The stream ended (the bus is shutting down): finish what is in flight.
                            work.beginDraining()
                        }
                        } onCancel: {
                            work.beginDraining()
                        }
                    }
                }
            } onGracefulShutdown: {
                work.beginDraining()
            }
        } catch is Drained {
            // Every request in flight was answered.
        }
        logger.info("\(source) stopped taking requests at \(endpoint)")
    }
}

/// A counting semaphore for tasks: ``acquire()`` waits while `limit` holders have not released.
///
/// Thread safety: all state behind one mutex; continuations are resumed outside it.
final class Slots: Sendable {
    private let limit: Int
    private let state = Mutex<(taken: Int, waiting: [CheckedContinuation<Void, Never>])>((0, []))

    init(limit: Int) {
        self.limit = limit
    }

    func acquire() async {
        await withCheckedContinuation { continuation in
            let admitted = state.withLock { state in
                guard state.taken < limit else {
                    state.waiting.append(continuation)
                    return false
                }
                state.taken += 1
                return true
            }
            if admitted { continuation.resume() }
        }
    }

    func release() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            // The slot passes straight to the next waiter.
            guard state.waiting.isEmpty else { return state.waiting.removeFirst() }
            state.taken -= 1
            return nil
        }
        next?.resume()
    }
}

/// Requests a server refused itself, on the hot path (the bus counts the rest).
final class RefusalCounts: Sendable {
    let value = Mutex(BusStatistics())
}

/// Counts requests in flight, holds the accept loop back at the limit, and says when a
/// draining server has nothing left in flight.
///
/// Thread safety: all state behind one mutex; continuations are resumed outside it.
///
/// Why ours: an async semaphore that refuses (rather than queues) once draining and says when
/// the last request is answered; neither swift-async-algorithms nor NIO offers one.
final class InFlight: Sendable {
    private struct State {
        var running = 0
        /// Requests taken on the bus's thread and not answered yet (most are answered at once;
        /// some wait for another service). Not limited, but waited for when draining.
        var unanswered = 0
        var draining = false
        var admissions: [CheckedContinuation<Bool, Never>] = []
        var drained: CheckedContinuation<Void, Never>?
        var drainedSignalled = false
    }

    private let limit: Int
    private let state = Mutex(State())

    /// Whether graceful shutdown has begun.
    var isDraining: Bool {
        state.withLock { $0.draining }
    }

    init(limit: Int) {
        self.limit = limit
    }

    /// Waits for room for one more request. Returns `false` when the server is draining.
    func acquire() async -> Bool {
        enum Decision { case admitted, refused, wait }
        let decision: Decision = state.withLock { state in
            if state.draining { return .refused }
            if state.running < limit {
                state.running += 1
                return .admitted
            }
            return .wait
        }
        switch decision {
        case .admitted: return true
        case .refused: return false
        case .wait:
            return await withCheckedContinuation { continuation in
                let answer: Bool? = state.withLock { state in
                    if state.draining { return false }
                    if state.running < limit {
                        state.running += 1
                        return true
                    }
                    state.admissions.append(continuation)
                    return nil
                }
                if let answer { continuation.resume(returning: answer) }
            }
        }
    }

    /// One request has been answered.
    func release() {
        let (admitted, drained) = state.withLock { state -> (CheckedContinuation<Bool, Never>?, CheckedContinuation<Void, Never>?) in
            if !state.draining, !state.admissions.isEmpty {
                // The slot passes straight to the next waiting request.
                return (state.admissions.removeFirst(), nil)
            }
            state.running -= 1
            return (nil, takeDrained(&state))
        }
        admitted?.resume(returning: true)
        drained?.resume()
    }

    /// Counts `raw` as unanswered until its first reply.
    func tracking(_ raw: RawRequest) -> RawRequest {
        state.withLock { $0.unanswered += 1 }
        let answered = Atomic(false)
        return RawRequest(body: raw.body, attachment: raw.attachment, caller: raw.caller, received: raw.received) { [self] reply in
            guard !answered.exchange(true, ordering: .acquiringAndReleasing) else { return }
            raw.reply(reply)
            let drained = state.withLock { state -> CheckedContinuation<Void, Never>? in
                state.unanswered -= 1
                return takeDrained(&state)
            }
            drained?.resume()
        }
    }

    /// Graceful shutdown has begun: admit nothing more.
    func beginDraining() {
        let (refused, drained) = state.withLock { state -> ([CheckedContinuation<Bool, Never>], CheckedContinuation<Void, Never>?) in
            state.draining = true
            let refused = state.admissions
            state.admissions = []
            return (refused, takeDrained(&state))
        }
        for admission in refused { admission.resume(returning: false) }
        drained?.resume()
    }

    /// Returns once the server is draining and nothing is in flight, or the task is cancelled.
    func waitUntilDrained() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let now = state.withLock { state -> Bool in
                    if state.drainedSignalled || (state.draining && state.running == 0 && state.unanswered == 0) {
                        state.drainedSignalled = true
                        return true
                    }
                    state.drained = continuation
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancel: {
            let drained = state.withLock { state -> CheckedContinuation<Void, Never>? in
                state.drainedSignalled = true
                defer { state.drained = nil }
                return state.drained
            }
            drained?.resume()
        }
    }

    private func takeDrained(_ state: inout State) -> CheckedContinuation<Void, Never>? {
        guard state.draining, state.running == 0, state.unanswered == 0, !state.drainedSignalled, let drained = state.drained
        else { return nil }
        state.drainedSignalled = true
        state.drained = nil
        return drained
    }
}
