import Foundation
import Messaging
import OnboardingAPI
import Synchronization

/// One delivery of a route intent as the recorder keeps it: one per route sequence number.
///
/// The same `intentId` may be recorded several times with different route sequences: the
/// orchestrator publishes the intent in force again (same id, same reason, new route sequence)
/// when a check confirms it. That is a repeat; a duplicate is one route sequence delivered twice.
public struct RecordedIntent: Sendable, Hashable {
    public var uid: String
    public var intentId: String
    public var kind: RouteIntent.Kind
    public var reason: RouteIntent.Reason
    /// The envelope's route sequence number.
    public var sequence: UInt64
    /// The order in which the recorder first had it (live deliveries in arrival order; intents
    /// filled from `events.after` after them).
    public var position: Int
    /// Whether it was delivered live (rather than only found with `events.after`).
    public var live: Bool

    public init(
        uid: String, intentId: String, kind: RouteIntent.Kind, reason: RouteIntent.Reason, sequence: UInt64,
        position: Int, live: Bool
    ) {
        self.uid = uid
        self.intentId = intentId
        self.kind = kind
        self.reason = reason
        self.sequence = sequence
        self.position = position
        self.live = live
    }
}

/// What the recorder has, frozen for the checks.
public struct RouteRecording: Sendable {
    /// How intents of one person are put in order.
    public enum Order: String, Sendable {
        /// By route sequence: the publisher's own order, once `events.after` has shown that
        /// sequences are durable.
        case sequence
        /// By arrival: when the route sequence cannot be trusted (no replay, or reused numbers).
        case arrival
    }

    /// Each person's deliveries (one per route sequence, repeats included), oldest first in ``order``.
    public var intentsByUID: [String: [RecordedIntent]]
    /// Every intentId recorded.
    public var intentIDs: Set<String>
    public var order: Order
    public var counts: RecorderCounts

    public init(intentsByUID: [String: [RecordedIntent]], intentIDs: Set<String>, order: Order, counts: RecorderCounts) {
        self.intentsByUID = intentsByUID
        self.intentIDs = intentIDs
        self.order = order
        self.counts = counts
    }
}

/// The recorder's counts.
public struct RecorderCounts: Sendable, Hashable {
    /// Distinct intents recorded (by intentId): the decisions.
    public var intents = 0
    /// Distinct deliveries recorded (by route sequence): decisions plus repeats.
    public var deliveries = 0
    /// Deliveries of an intentId already recorded under another route sequence: the intent in
    /// force published again (after a check), which an app recognises by its id.
    public var repeats = 0
    /// Messages delivered on the route topic.
    public var liveDeliveries = 0
    /// Live deliveries of a route sequence the recorder already had: the app would get one
    /// publication twice.
    public var duplicatesDelivered = 0
    /// Deliveries found only with `events.after` (the live stream missed them).
    public var filled = 0
    /// Records dropped as already recorded: live duplicates and replayed deliveries already had live.
    public var deduplicated = 0
    /// Route sequence numbers carried by two different intents (the sequence restarted).
    public var sequenceReused = 0
    /// Messages on the route topic that were not readable route intents.
    public var unreadable = 0
    /// Events the publisher had pruned before `events.after` could fetch them.
    public var pruned: UInt64 = 0

    public init() {}
}

/// How the last `events.after` fill went.
public enum FillResult: Sendable, Hashable {
    /// Fetched everything up to the publisher's last sequence; `added` intents were new.
    case filled(added: Int, through: UInt64)
    /// `events.after` could not be used (not served yet, no service token, …).
    case unavailable(String)
}

/// Records every route intent: live from `route.`, and at the end whatever `events.after` on the
/// orchestrator's request endpoint has that the live stream missed. Keeps one record per route
/// sequence (a repeat of the intent in force is a delivery of its own) and drops a sequence
/// delivered again, counting it.
public final class RouteRecorder: Sendable {
    /// One delivery: its route sequence and intent (two intents with one sequence are two
    /// deliveries, counted as a reused sequence).
    private struct Key: Hashable {
        var sequence: UInt64
        var intentId: String
    }

    private struct State {
        var deliveries: [Key: RecordedIntent] = [:]
        var intentIDs: Set<String> = []
        var keysByUID: [String: [Key]] = [:]
        var intentBySequence: [UInt64: String] = [:]
        var counts = RecorderCounts()
        var nextPosition = 0
        var filledThrough: UInt64 = 0
        var fillWorked = false
        var nextWaiter = 0
        var waiters: [Int: (uid: String, continuation: CheckedContinuation<Bool, Never>)] = [:]
    }

    private let state = Mutex(State())

    public init() {}

    /// Records route intents from `messages` until it ends or the task is cancelled.
    public func follow(_ messages: AsyncStream<Message>) async {
        for await message in messages {
            guard message.header.type == RouteIntent.type, let intent = try? message.payload(as: RouteIntent.self) else {
                state.withLock { $0.counts.unreadable += 1 }
                continue
            }
            record(intent, sequence: message.header.sequence, live: true)
        }
    }

    /// Records one delivery. - Returns: whether it was new (a route sequence not recorded yet).
    @discardableResult
    public func record(_ intent: RouteIntent, sequence: UInt64, live: Bool) -> Bool {
        let (isNew, waiting) = state.withLock { state -> (Bool, [CheckedContinuation<Bool, Never>]) in
            if live { state.counts.liveDeliveries += 1 }
            let key = Key(sequence: sequence, intentId: intent.intentId)
            if state.deliveries[key] != nil {
                state.counts.deduplicated += 1
                if live { state.counts.duplicatesDelivered += 1 }
                return (false, [])
            }
            let recorded = RecordedIntent(
                uid: intent.uid, intentId: intent.intentId, kind: intent.intent, reason: intent.reason,
                sequence: sequence, position: state.nextPosition, live: live)
            state.nextPosition += 1
            state.deliveries[key] = recorded
            state.keysByUID[intent.uid, default: []].append(key)
            state.counts.deliveries += 1
            if state.intentIDs.insert(intent.intentId).inserted {
                state.counts.intents += 1
            } else {
                state.counts.repeats += 1
            }
            if !live { state.counts.filled += 1 }
            if let other = state.intentBySequence[sequence], other != intent.intentId {
                state.counts.sequenceReused += 1
            } else {
                state.intentBySequence[sequence] = intent.intentId
            }
            let ready = state.waiters.filter { $0.value.uid == intent.uid }
            for id in ready.keys { state.waiters[id] = nil }
            return (true, ready.values.map(\.continuation))
        }
        for continuation in waiting { continuation.resume(returning: true) }
        return isNew
    }

    /// Waits until an intent for `uid` has been recorded, at most `timeout`.
    ///
    /// - Returns: whether one was.
    public func waitForIntent(of uid: String, timeout: Duration) async -> Bool {
        let id = state.withLock { state in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                await withTaskCancellationHandler {
                    await withCheckedContinuation { continuation in
                        let immediate: Bool? = self.state.withLock { state in
                            if state.keysByUID[uid]?.isEmpty == false { return true }
                            if Task.isCancelled { return false }
                            state.waiters[id] = (uid, continuation)
                            return nil
                        }
                        if let immediate { continuation.resume(returning: immediate) }
                    }
                } onCancel: {
                    let waiter = self.state.withLock { $0.waiters.removeValue(forKey: id) }
                    waiter?.continuation.resume(returning: false)
                }
            }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }

    /// Fetches the recorded route intents after the last sequence fetched so far (0 at first)
    /// with `events.after`, page by page, and records those the live stream missed.
    public func fill(
        using caller: RetryingCaller, at endpoint: Endpoint, serviceToken: String?, until deadline: ContinuousClock.Instant
    ) async -> FillResult {
        guard let serviceToken else { return .unavailable("no service token") }
        var added = 0
        var after = state.withLock { $0.filledThrough }
        while true {
            let page: EventPage
            do {
                page = try await caller.call(
                    EventsAfter(sequence: after, limit: EventsAfter.maximumLimit), to: endpoint,
                    serviceToken: serviceToken, until: deadline)
            } catch {
                return .unavailable("events.after: \(PersonDriver.describe(error))")
            }
            if page.firstSequence > after + 1 {
                let pruned = page.firstSequence - after - 1
                state.withLock { $0.counts.pruned += pruned }
            }
            for event in page.events {
                guard let message = try? Message(topic: event.topic, body: Data(event.envelope.utf8)),
                    message.header.type == RouteIntent.type,
                    let intent = try? message.payload(as: RouteIntent.self)
                else {
                    state.withLock { $0.counts.unreadable += 1 }
                    continue
                }
                if record(intent, sequence: event.sequence, live: false) { added += 1 }
            }
            let last = page.events.last?.sequence ?? after
            after = max(after, last)
            state.withLock {
                $0.filledThrough = after
                $0.fillWorked = true
            }
            if page.events.isEmpty || after >= page.lastSequence { return .filled(added: added, through: after) }
        }
    }

    /// The recording as it is now.
    public func snapshot() -> RouteRecording {
        state.withLock { state in
            let order: RouteRecording.Order =
                state.fillWorked && state.counts.sequenceReused == 0 ? .sequence : .arrival
            var byUID: [String: [RecordedIntent]] = [:]
            for (uid, keys) in state.keysByUID {
                let intents = keys.compactMap { state.deliveries[$0] }
                byUID[uid] = intents.sorted {
                    order == .sequence ? ($0.sequence, $0.position) < ($1.sequence, $1.position) : $0.position < $1.position
                }
            }
            return RouteRecording(intentsByUID: byUID, intentIDs: state.intentIDs, order: order, counts: state.counts)
        }
    }
}
