import Foundation
import Logging
import Messaging
import NIOCore
import OnboardingAPI
import OnboardingClient

/// Reads a person's route intents after a route sequence from the orchestrator's record
/// (`events.after`), for a stream that reconnects with `Last-Event-ID`.
///
/// `events.after` answers with everyone's intents, so this reads every intent after the given
/// sequence and keeps the person's: at most ``GatewayConfiguration/maxReplay`` of them.
public struct RouteReplay: Sendable {
    /// What was found.
    public enum Outcome: Sendable, Hashable {
        /// The person's intents after the sequence asked for, oldest first; every route
        /// sequence up to `through` has been read.
        case missed([ReceivedIntent], through: UInt64)
        /// The intents cannot be replayed (pruned, the orchestrator's store was reset, too far
        /// behind, no service token); the reason says which.
        case unavailable(String)
    }

    let bus: any MessageBus
    let configuration: GatewayConfiguration

    public init(bus: any MessageBus, configuration: GatewayConfiguration) {
        self.bus = bus
        self.configuration = configuration
    }

    /// `uid`'s intents after route sequence `after`.
    ///
    /// - Throws: ``ServiceError`` when the orchestrator does not answer.
    public func intents(of uid: String, after: UInt64) async throws -> Outcome {
        guard let serviceToken = configuration.serviceToken else {
            return .unavailable("the gateway has no service token, which events.after requires")
        }
        let topic = Topics.route(uid: uid)
        var cursor = after
        var found: [ReceivedIntent] = []
        var newest: UInt64?
        while true {
            let page = try await bus.callRetrying(
                EventsAfter(sequence: cursor, limit: EventsAfter.maximumLimit), to: configuration.orchestratorRPC,
                source: configuration.name, serviceToken: serviceToken, timeout: configuration.callTimeout,
                deadline: configuration.callDeadline)
            if newest == nil {
                if page.lastSequence < after {
                    return .unavailable("the orchestrator's record ends at \(page.lastSequence), before \(after): its store was reset")
                }
                if page.lastSequence > after, page.firstSequence == 0 || page.firstSequence > after + 1 {
                    return .unavailable("the intents after \(after) have been pruned from the orchestrator's record")
                }
                if page.lastSequence - after > configuration.maxReplay {
                    return .unavailable("\(page.lastSequence - after) intents were published since \(after), more than the \(configuration.maxReplay) a replay reads")
                }
                newest = page.lastSequence
            }
            for event in page.events {
                cursor = event.sequence
                guard event.topic == topic else { continue }
                guard let message = try? Message(topic: event.topic, body: Data(event.envelope.utf8)),
                    message.header.type == RouteIntent.type, let intent = try? message.payload(as: RouteIntent.self),
                    intent.uid == uid
                else { continue }
                found.append(ReceivedIntent(intent: intent, time: message.header.time, sequence: event.sequence))
            }
            // Reading on past the newest intent there was when the replay began would chase the
            // live stream, which the hub already follows.
            if page.events.isEmpty || cursor >= newest! { return .missed(found, through: max(cursor, after)) }
        }
    }
}

/// The text of the intent stream (`text/event-stream`).
///
/// An intent is an event of type `intent` whose `id` is its route sequence and whose `data` is
/// a ``RouteState`` (the same JSON `GET /v1/me/intent` answers). A heartbeat is a comment with
/// an `id` line and no data: no event reaches the app, but its last event ID moves on to the
/// newest route sequence the gateway has handed over, so a reconnect replays only from there.
public enum ServerSentEvents {
    /// How long a client waits before reconnecting, in milliseconds.
    public static let retryMilliseconds = 2000

    public static func opening() -> String {
        "retry: \(retryMilliseconds)\n: connected\n\n"
    }

    public static func intent(_ received: ReceivedIntent) -> String {
        let state = RouteState(
            uid: received.intent.uid, intent: received.intent, sequence: received.sequence, time: received.time)
        let json = (try? JSONEncoder.gateway.encode(state)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
        return "id: \(received.sequence)\nevent: intent\ndata: \(json)\n\n"
    }

    public static func heartbeat(through sequence: UInt64) -> String {
        "id: \(sequence)\n: heartbeat\n\n"
    }

    /// Where a stream stands once its first events are sent: an `id` line and no data.
    public static func position(_ sequence: UInt64) -> String {
        "id: \(sequence)\n: caught up\n\n"
    }

    /// Sent before the gateway ends a stream whose session has ended.
    public static func sessionEnded() -> String {
        "event: sessionEnded\ndata: {\"code\":\"unauthenticated\"}\n\n"
    }
}

/// One opened intent stream: what to send first, and the live part.
struct OpenedIntentStream: Sendable {
    /// The first events: the intent in force, or the intents missed since `Last-Event-ID`.
    var first: [ReceivedIntent]
    /// The route sequence the stream stands at once `first` is sent: live intents at or below it
    /// are already reflected, and the first heartbeat's `id` is at least this.
    var last: UInt64
    var subscription: IntentHub.Subscription
    /// Whether a `Last-Event-ID` could not be honoured and the intent in force was sent instead.
    var replayUnavailable: String?
}
