import Foundation
import Logging
import Messaging
import OnboardingAPI
import Synchronization

/// Follows one publisher's events so that none is lost, none is handled twice, and all are
/// handled in sequence order: the live stream, with gaps filled from the publisher's record.
///
/// The zguide's Clone pattern: subscribe to the live stream first, then fetch what was recorded
/// after the subscriber's cursor with `events.after` until caught up, then follow the live
/// stream. A live event with a number at or below the cursor is dropped (counted in
/// ``FeedStatistics/duplicatesDropped``, and checked with a fetch at most once per
/// `idleCheck`); one that skips numbers (a lost message, a full queue, the ZeroMQ slow joiner)
/// makes the feed fetch from the cursor again, once the missing numbers have had `reorderWait`
/// to arrive: replicas of a publisher share one numbering but publish apart, so their events
/// arrive a little out of order. When nothing arrives live for `idleCheck`, the feed asks anyway, which finds a lost
/// last event and a publisher that restarted.
///
/// The live subscription takes every topic of the publisher, so its numbers have no gaps of
/// their own; only events whose topic starts with one of `topics` reach the handler.
///
/// Thread safety: immutable apart from the statistics, which sit behind a mutex. Call
/// ``run(after:handle:)`` from one task at a time.
public final class EventFeed: Sendable {
    /// Handles one batch of events, oldest first, then stores `through` as the subscriber's
    /// cursor (best in the same transaction as the batch's effects).
    ///
    /// `through` is the sequence of the last event the batch covers, including events of other
    /// topics that were filtered out, so `batch` may be empty. It is smaller than before only
    /// when the publisher's store was reset. A handler that throws gets the same batch again
    /// after a backoff.
    public typealias Handler = @Sendable (_ batch: [Message], _ through: UInt64) async throws -> Void

    /// Handles a batch of live events on the bus's own thread (the hot path), then stores
    /// `through` as the cursor, as ``Handler`` does, without waiting for anything but the
    /// database. After a failure the feed fetches the batch again (`events.after`) and hands it
    /// to the ``Handler``, which retries.
    public typealias LoopHandler = @Sendable (_ batch: [Message], _ through: UInt64) throws -> Void

    public let events: Endpoint
    public let replay: Endpoint
    public let topics: [String]
    private let bus: any MessageBus
    private let source: String
    private let serviceToken: String?
    private let pageSize: Int
    private let idleCheck: Duration
    private let reorderWait: Duration
    private let callTimeout: Duration
    private let retry: RetryPolicy
    private let limits: MessageLimits
    private let logger: Logger
    private let shared: Mutex<FeedStatistics>
    /// Who delivers live events now: the bus's thread (``LiveState/delivering``) or the follower task.
    private let liveState = Mutex(LiveState())
    /// When the bus's thread last delivered (monotonic nanoseconds, 0: never): the follower's
    /// idle check waits for quiet. Outside the lock, which is held while a batch commits.
    private let lastLiveDelivery = Atomic<UInt64>(0)

    /// - Parameters:
    ///   - events: the publisher's event endpoint (PUB).
    ///   - replay: the publisher's request endpoint, which answers `events.after`.
    ///   - topics: topic prefixes of the events to handle (`""`: every event).
    ///   - source: the name this feed signs its `events.after` requests with.
    ///   - serviceToken: the services' shared secret, which `events.after` requires.
    ///   - pageSize: the most events asked for at once, and the largest batch handed over.
    ///   - idleCheck: how long the live stream may be quiet before the feed asks anyway.
    ///   - reorderWait: how long a gap in the live stream may wait for the missing events to
    ///     arrive live (another replica's, published a moment later) before they are fetched;
    ///     by default 20 ms when `events` lists replicas, none for one publisher (whose events
    ///     arrive in order, so a gap is a loss).
    ///   - callTimeout: how long one `events.after` call waits for its reply.
    ///   - retry: the waits between failed calls, and after a handler failure.
    ///   - limits: the live subscription's limits; a full queue drops events that are then
    ///     fetched instead.
    public init(
        bus: any MessageBus, events: Endpoint, replay: Endpoint, topics: [String] = [""], source: String,
        serviceToken: String?, pageSize: Int = Outbox.defaultPageSize, idleCheck: Duration = .seconds(1),
        reorderWait: Duration? = nil,
        callTimeout: Duration = .seconds(2), retry: RetryPolicy = RetryPolicy(), limits: MessageLimits = MessageLimits(),
        logger: Logger
    ) {
        self.bus = bus
        self.events = events
        self.replay = replay
        self.topics = topics
        self.source = source
        self.serviceToken = serviceToken
        self.pageSize = min(max(1, pageSize), EventsAfter.maximumLimit)
        self.idleCheck = idleCheck
        self.reorderWait = reorderWait ?? (events.isList ? .milliseconds(20) : .zero)
        self.callTimeout = callTimeout
        self.retry = retry
        self.limits = limits
        self.logger = logger
        self.shared = Mutex(FeedStatistics(publisher: replay.rawValue, sequence: 0))
    }

    /// What the feed has done so far; ``FeedStatistics/sequence`` is the last sequence handled.
    public var statistics: FeedStatistics {
        shared.withLock { $0 }
    }

    /// Hands every event after `cursor` to `handle`, once each and in sequence order, in batches
    /// (a replayed page, or the consecutive live events already queued). Returns when the
    /// calling task is cancelled.
    ///
    /// Failed `events.after` calls are retried with backoff for as long as it takes: the feed
    /// never skips an event it could still get. Only events the publisher has pruned are
    /// skipped; they are logged and counted in ``FeedStatistics/lost``.
    ///
    /// - Parameters:
    ///   - reader: reads the live events' envelopes, payloads included for the types it knows,
    ///     so that handlers read each event once.
    ///   - onLoop: when given, live events that follow the cursor are handed to it on the bus's
    ///     own thread as they arrive (the hot path: no hand-off to a task); everything else (a
    ///     gap, a duplicate, a failure, catching up) goes through `handle` as before.
    public func run(after cursor: UInt64, reader: EnvelopeReader = EnvelopeReader(), onLoop: LoopHandler? = nil, handle: Handler) async {
        var progress = FeedProgress(
            topics: topics, statistics: shared.withLock { statistics in
                statistics.sequence = cursor
                return statistics
            })
        while !Task.isCancelled {
            let mailbox = LiveMailbox(capacity: limits.queueLimit)
            if let onLoop {
                guard let registration = await subscribeOnLoop(reader: reader, mailbox: mailbox, handle: onLoop) else { return }
                await follow(mailbox, progress: &progress, loop: true, handle: handle)
                registration.close()
                progress = takeBackFromLoop(progress)
                mailbox.finish()
                continue
            }
            guard let stream = await subscribe() else { return }
            await withDiscardingTaskGroup { group in
                group.addTask {
                    for await message in stream { mailbox.push(message) }
                    mailbox.finish()
                }
                await follow(mailbox, progress: &progress, loop: false, handle: handle)
                group.cancelAll()
            }
            if !Task.isCancelled {
                logger.warning("the live stream from \(events) ended; subscribing again")
            }
        }
    }

    // MARK: The hot path

    /// Who delivers the live events.
    private struct LiveState: Sendable {
        /// Whether the bus's thread delivers now.
        var delivering = false
        /// The bus's thread's progress: set while it delivers, and kept when it hands delivery
        /// back, until the follower takes it.
        var progress: FeedProgress?
        /// The loop handed delivery back and the follower must fetch from the cursor first.
        var needsCatchUp = false
        var mailbox: LiveMailbox?
    }

    /// Subscribes with a handler on the bus's thread, trying until it works. `nil` when cancelled.
    private func subscribeOnLoop(reader: EnvelopeReader, mailbox: LiveMailbox, handle: @escaping LoopHandler) async -> (any BusLoopRegistration)? {
        liveState.withLock { $0 = LiveState(mailbox: mailbox) }
        lastLiveDelivery.store(0, ordering: .relaxed)
        return await subscribing {
            try await bus.subscribe(to: [events], topics: [""], limits: limits) { [self] batch in
                onLoop(batch, reader: reader, handle: handle)
            }
        }
    }

    /// On the bus's thread: delivers live events that follow the cursor, or hands them to the
    /// follower (when it owns delivery, or on a gap, a duplicate or a failure).
    private func onLoop(_ batch: [RawEvent], reader: EnvelopeReader, handle: LoopHandler) {
        var messages: [Message] = []
        messages.reserveCapacity(batch.count)
        for raw in batch {
            do {
                messages.append(try Message(topic: raw.topic, body: raw.body, attachment: raw.attachment, reader: reader))
            } catch {
                logger.warning("an unreadable event from \(events) was dropped: \(error)")
            }
        }
        guard !messages.isEmpty else { return }
        liveState.withLock { state in
            guard state.delivering, var progress = state.progress, let mailbox = state.mailbox else {
                for message in messages { state.mailbox?.push(message) }
                return
            }
            var pending = messages
            let before = progress.cursor
            let step = progress.planLive(&pending)
            if step.through != before {
                do {
                    try handle(step.batch, step.through)
                    progress.handled(step.batch.count, through: step.through, replayed: false, time: step.batch.last?.header.time)
                    lastLiveDelivery.store(Self.monotonicNanoseconds(), ordering: .relaxed)
                } catch {
                    logger.error("handling live events up to \(step.through) from \(events) failed (\(error)); fetching them again")
                    state.progress = progress
                    state.delivering = false
                    state.needsCatchUp = true
                    shared.withLock { $0 = progress.statistics }
                    mailbox.wake()
                    return
                }
            }
            state.progress = progress
            shared.withLock { $0 = progress.statistics }
            if step.gap != nil || step.duplicates > 0 {
                // As on the follower's path: fetch what is missing (or check a reset) first. The
                // gap's own event is covered by that fetch. (Only the follower holds a gap for the
                // missing events to arrive: replicas share a PostgreSQL store, whose feeds have no
                // bus-thread handler.)
                if step.gap != nil { pending.removeFirst() }
                state.delivering = false
                state.needsCatchUp = true
                for message in pending { mailbox.push(message) }
                mailbox.wake()
            }
        }
    }

    /// Hands delivery to the bus's thread when nothing waits for the follower. Returns whether it did.
    private func handToLoop(_ progress: FeedProgress, mailbox: LiveMailbox) -> Bool {
        liveState.withLock { state in
            guard !state.delivering, state.progress == nil, !state.needsCatchUp, mailbox.isEmpty else { return false }
            state.progress = progress
            state.delivering = true
            return true
        }
    }

    private static func monotonicNanoseconds() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
    }

    /// Takes delivery back from the bus's thread (if it has it), with the progress it made.
    /// Returns the progress and whether the loop asked for a catch-up.
    private func takeBackFromLoop(_ progress: FeedProgress) -> FeedProgress {
        liveState.withLock { state in
            defer {
                state.progress = nil
                state.delivering = false
                state.needsCatchUp = false
            }
            return state.progress ?? progress
        }
    }

    // MARK: Following

    /// Catches up, then follows the live stream until it ends or the task is cancelled.
    ///
    /// With `loop`, whenever it is caught up with nothing queued it hands live delivery to the
    /// bus's thread, and takes it back when that thread asks (a gap, a duplicate, a failure) or
    /// when the stream has been quiet for the idle check.
    private func follow(_ mailbox: LiveMailbox, progress: inout FeedProgress, loop: Bool, handle: Handler) async {
        guard await catchUp(&progress, handle: handle) else { return }
        var pending: [Message] = []
        let clock = ContinuousClock()
        // The gap whose missing events may still arrive live, and until when.
        var heldGap: (sequence: UInt64, until: ContinuousClock.Instant)?
        var lastDuplicateCheck: ContinuousClock.Instant?
        while !Task.isCancelled {
            if loop, pending.isEmpty, handToLoop(progress, mailbox: mailbox) {
                // The bus's thread delivers until it hands back (a wake-up) or all is quiet.
                waiting: while true {
                    switch await mailbox.wait(timeout: idleCheck) {
                    case .finished:
                        return
                    case .timedOut:
                        if Task.isCancelled { return }
                        let last = lastLiveDelivery.load(ordering: .relaxed)
                        let (seconds, attoseconds) = idleCheck.components
                        let quiet = UInt64(max(0, seconds)) * 1_000_000_000 + UInt64(max(0, attoseconds) / 1_000_000_000)
                        if last > 0, Self.monotonicNanoseconds() &- last < quiet { continue waiting }
                        break waiting
                    case .ready:
                        break waiting
                    }
                }
                progress = takeBackFromLoop(progress)
                // Fetch what was missed (or check a quiet publisher), then what queued meanwhile.
                guard await catchUp(&progress, handle: handle) else { return }
                continue
            }
            if pending.isEmpty {
                switch await mailbox.wait(timeout: idleCheck) {
                case .finished:
                    return
                case .timedOut:
                    if Task.isCancelled { return }
                    guard await catchUp(&progress, handle: handle) else { return }
                    continue
                case .ready:
                    pending = mailbox.take(max: pageSize)
                }
            }
            let step = progress.planLive(&pending)
            share(progress)
            if step.through != progress.cursor {
                guard await deliver(step.batch, through: step.through, replayed: false, &progress, handle: handle)
                else { return }
            }
            if let gap = step.gap {
                // Most likely another replica's events, on their way: wait a moment for them.
                if heldGap?.sequence != gap { heldGap = (gap, clock.now.advanced(by: reorderWait)) }
                if let until = heldGap?.until, clock.now < until {
                    switch await mailbox.wait(timeout: clock.now.duration(to: until)) {
                    case .finished: return
                    case .ready: pending += mailbox.take(max: pageSize)
                    case .timedOut: break
                    }
                    continue
                }
                heldGap = nil
                logger.debug("live event \(gap) came after \(progress.cursor) from \(events); fetching what is missing")
                guard await catchUp(&progress, handle: handle) else { return }
                // What was held is covered by the fetch: not received twice, so not counted.
                let cursor = progress.cursor
                pending.removeAll { $0.header.sequence <= cursor }
            } else if step.duplicates > 0,
                (lastDuplicateCheck.map { $0.duration(to: clock.now) >= idleCheck } ?? true)
                    || step.through - (step.lowestDuplicate ?? step.through) > UInt64(pageSize)
            {
                // Usually the overlap after a catch-up, or another replica's events that a fetch
                // got first; but a publisher whose store was reset also sends numbers already
                // seen, and a busy stream never goes quiet: ask, now and then, and at once for a
                // number far behind (a reset, not a late replica).
                lastDuplicateCheck = clock.now
                guard await catchUp(&progress, handle: handle) else { return }
            }
        }
    }

    /// Fetches and hands over pages after the cursor until it reaches the publisher's newest
    /// event. Returns `false` when cancelled.
    private func catchUp(_ progress: inout FeedProgress, handle: Handler) async -> Bool {
        while true {
            guard let page = await fetchPage(after: progress.cursor) else { return false }
            let before = progress.cursor
            let step = progress.planPage(page)
            share(progress)
            if step.reset {
                logger.warning(
                    "\(replay) has recorded events only up to \(page.lastSequence), but this feed was at \(before): its store was reset; following it from the start")
            }
            if step.lost > 0 {
                logger.error(
                    "\(step.lost) events after \(before) from \(replay) were pruned before they could be fetched; they are lost. Continuing from \(step.through)")
            }
            for sequence in step.unreadable {
                logger.error("recorded event \(sequence) from \(replay) cannot be read; skipping it")
            }
            if step.through != progress.cursor || !step.batch.isEmpty {
                guard await deliver(step.batch, through: step.through, replayed: true, &progress, handle: handle)
                else { return false }
            }
            if step.caughtUp { return true }
        }
    }

    /// Hands a batch to `handle` until it succeeds. Returns `false` when cancelled.
    private func deliver(
        _ batch: [Message], through: UInt64, replayed: Bool, _ progress: inout FeedProgress, handle: Handler
    ) async -> Bool {
        let range = batch.isEmpty ? "up to \(through)" : "\(batch[0].header.sequence)...\(through)"
        let handled: Void? = await retry.untilSuccess {
            try await handle(batch, through)
        } failed: { error, attempt, delay in
            logger.error("handling events \(range) from \(events) failed (\(error)); retry \(attempt) in \(delay)")
        }
        guard handled != nil else { return false }
        progress.handled(batch.count, through: through, replayed: replayed, time: batch.last?.header.time)
        share(progress)
        return true
    }

    // MARK: Calls

    /// The page after `cursor`, asked for until an answer comes. `nil` when cancelled.
    private func fetchPage(after cursor: UInt64) async -> EventPage? {
        await retry.untilSuccess {
            try await bus.call(
                EventsAfter(sequence: cursor, limit: pageSize), to: replay, source: source,
                serviceToken: serviceToken, timeout: callTimeout)
        } failed: { error, attempt, delay in
            // Failures that pass by themselves (and this bus closing) are warnings; others (a
            // wrong service token, a publisher that does not answer `events.after`) are
            // retried too, but logged as errors.
            let message: Logger.Message = "events.after \(cursor) at \(replay) failed (\(error)); retry \(attempt) in \(delay)"
            if let error = error as? ServiceError, ErrorCode.retryable.contains(error.code) || error.code == .closed {
                logger.warning(message)
            } else {
                logger.error(message)
            }
        }
    }

    /// Subscribes to every topic at ``events``, trying until it works. `nil` when cancelled.
    private func subscribe() async -> AsyncStream<Message>? {
        await subscribing { try await bus.subscribe(to: [events], topics: [""], limits: limits) }
    }

    /// Runs `subscribe` until it works, with backoff. `nil` when cancelled.
    private func subscribing<T>(_ subscribe: () async throws -> T) async -> T? {
        await retry.untilSuccess(subscribe) { error, attempt, delay in
            logger.warning("subscribing to \(events) failed (\(error)); retry \(attempt) in \(delay)")
        }
    }

    private func share(_ progress: FeedProgress) {
        shared.withLock { $0 = progress.statistics }
    }
}
