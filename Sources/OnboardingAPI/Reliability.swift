import Foundation
import Messaging

// MARK: - Replay

/// `events.after`: the events a publisher recorded after `sequence`, oldest first, in pages of
/// at most `limit` (the publisher's own cap, ``maximumLimit``, applies too).
///
/// Served by every service that publishes events (auth, profile) on its request endpoint, to
/// callers with the service token. A subscriber keeps the sequence of the last event it
/// handled; on start, and whenever the live stream skips a number, it asks for what came after.
public struct EventsAfter: APIRequest {
    public typealias Response = EventPage
    public static let type = "events.after"

    /// The largest page a publisher returns.
    public static let maximumLimit = 1_000

    /// The last sequence number the caller has handled (0: none yet).
    public var sequence: UInt64
    /// How many events at most; the publisher's cap applies when absent or larger.
    public var limit: Int?

    public init(sequence: UInt64, limit: Int? = nil) {
        self.sequence = sequence
        self.limit = limit
    }
}

/// One page of recorded events.
public struct EventPage: Codable, Sendable, Hashable {
    /// The events after the requested sequence, oldest first, with no gaps between them.
    public var events: [RecordedEvent]
    /// The oldest sequence the publisher still keeps (0 when it keeps none). When it is more
    /// than one past the requested sequence, the events between were pruned by the retention
    /// window and cannot be replayed.
    public var firstSequence: UInt64
    /// The newest sequence the publisher has recorded (0 when none). Smaller than the requested
    /// sequence only when the publisher's store was reset.
    public var lastSequence: UInt64

    public init(events: [RecordedEvent], firstSequence: UInt64, lastSequence: UInt64) {
        self.events = events
        self.firstSequence = firstSequence
        self.lastSequence = lastSequence
    }
}

/// An event as it was published.
public struct RecordedEvent: Codable, Sendable, Hashable {
    public var sequence: UInt64
    public var topic: String
    /// The event's envelope, exactly the JSON text that was published.
    public var envelope: String

    public init(sequence: UInt64, topic: String, envelope: String) {
        self.sequence = sequence
        self.topic = topic
        self.envelope = envelope
    }
}

// MARK: - Route state

/// `onboarding.intent`: the person's current route intent, so an app that connects late, or
/// reconnects, gets what it missed. With a session it is the session's person; with the
/// service token, the envelope's `uid`.
public struct CurrentIntent: APIRequest {
    public typealias Response = RouteState
    public static let type = "onboarding.intent"
    public init() {}
}

/// What the orchestrator last told one person.
public struct RouteState: Codable, Sendable, Hashable {
    public var uid: String
    /// The last intent emitted to the person; absent when none is in force (never signed in
    /// here, or withdrawn).
    public var intent: RouteIntent?
    /// The route sequence number that intent was published with: live intents with a number at
    /// or below it are already reflected here.
    public var sequence: UInt64?
    /// When the intent was emitted.
    public var time: String?

    public init(uid: String, intent: RouteIntent?, sequence: UInt64?, time: String?) {
        self.uid = uid
        self.intent = intent
        self.sequence = sequence
        self.time = time
    }
}

/// `onboarding.routes`: every person's current intent, in pages ordered by uid (for the tap
/// and for operators; service token only).
public struct ListRouteStates: APIRequest {
    public typealias Response = RouteStatePage
    public static let type = "onboarding.routes"

    /// The largest page the orchestrator returns.
    public static let maximumLimit = 1_000

    /// Start after this uid (absent: from the first).
    public var afterUID: String?
    public var limit: Int?

    public init(afterUID: String? = nil, limit: Int? = nil) {
        self.afterUID = afterUID
        self.limit = limit
    }
}

public struct RouteStatePage: Codable, Sendable, Hashable {
    /// People with an intent in force, ordered by uid.
    public var states: [RouteState]
    /// Pass as `afterUID` for the next page; absent on the last page.
    public var nextUID: String?

    public init(states: [RouteState], nextUID: String?) {
        self.states = states
        self.nextUID = nextUID
    }
}

// MARK: - Idempotency

/// The rules for `idempotencyKey` fields: 1 to 64 characters of `A-Z a-z 0-9 - _` (a UUID does).
/// A request that repeats a key is answered with the first request's result and does no work
/// twice. Keys are scoped to the person.
public enum IdempotencyKey {
    public static let maximumLength = 64

    /// Whether `key` is well formed.
    public static func isValid(_ key: String) -> Bool {
        !key.isEmpty && key.utf8.count <= maximumLength
            && key.utf8.allSatisfy { byte in
                (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                    || byte == 0x2D || byte == 0x5F
            }
    }

    /// The error for a malformed key.
    public static func problem(_ key: String?) -> ServiceError? {
        guard let key, !isValid(key) else { return nil }
        return ServiceError(
            .invalidRequest,
            "idempotencyKey must be 1 to \(maximumLength) characters of A-Z a-z 0-9 - _ (a UUID works).")
    }

    /// A fresh key.
    public static func make() -> String { Identifier.random() }
}

// MARK: - Statistics

/// How a subscriber has followed one publisher's events (reported in `health` replies).
public struct FeedStatistics: Codable, Sendable, Hashable {
    /// The publisher's request endpoint, where missed events are fetched.
    public var publisher: String
    /// The last sequence handled.
    public var sequence: UInt64
    /// Events handled, live or replayed.
    public var handled: Int = 0
    /// Events fetched with `events.after` because the live stream skipped them.
    public var replayed: Int = 0
    /// Events received again after they had been handled, and dropped.
    public var duplicatesDropped: Int = 0
    /// Events pruned by the publisher before they could be fetched (0 unless a subscriber was
    /// away for longer than the retention window).
    public var lost: Int = 0
    /// The newest sequence the publisher is known to have recorded (from its live events and
    /// `events.after` pages); `newest - sequence` events are still to be handled. Absent until
    /// the publisher has been heard from.
    public var newest: UInt64?
    /// When the publisher committed the last event handled (that envelope's `time`).
    public var lastHandledTime: String?

    public init(publisher: String, sequence: UInt64) {
        self.publisher = publisher
        self.sequence = sequence
    }
}
