import Messaging
import OnboardingAPI
import Synchronization
import Tracing

/// The orchestrator's part of a traced sign-in (see ``Traces``): a span for each traced event it
/// processes, and under it the decision, the route intent's publication and the commit. The
/// intent's envelope carries the trace on, to the gateway's stream.
///
/// An event's context is kept by uid until an intent for that person is published, for at most
/// ``maxWait``: when the intent waits for a profile check (a later transaction), it still joins
/// the sign-in's trace. Each event's span travels with its inputs (``Engine/Submission/spans``)
/// and ends once they have committed.
///
/// Thread safety: behind one mutex. Nothing is taken while tracing is off.
final class DecisionTraces: Sendable {
    private struct Waiting {
        var context: ServiceContext
        var since: ContinuousClock.Instant
    }

    /// The context of each person's last traced event whose intent is not yet published.
    private let waiting = Mutex<[String: Waiting]>([:])
    /// People remembered at most; beyond, every context is forgotten (those intents go
    /// untraced), so people who sign in and need no intent do not grow it.
    static let maxWaiting = 50_000
    /// How long a context waits for its intent: a later decision about the person is not the
    /// sign-in's.
    static let maxWait: Duration = .seconds(60)

    /// A traced event about `uid` arrived: its span, started (`nil`: not traced).
    func received(_ event: Message, about uid: String) -> (any Tracing.Span)? {
        guard let span = Traces.span("process \(event.header.type)", for: event.header, ofKind: .consumer) else { return nil }
        waiting.withLock { waiting in
            if waiting.count >= Self.maxWaiting { waiting.removeAll(keepingCapacity: true) }
            waiting[uid] = Waiting(context: span.context, since: .now)
        }
        return span
    }

    /// `uid`'s waiting context, if it is recent enough; with `taking`, it stops waiting.
    private func context(of uid: String, taking: Bool) -> ServiceContext? {
        waiting.withLock { waiting in
            guard let entry = waiting[uid] else { return nil }
            if taking || entry.since.duration(to: .now) > Self.maxWait { waiting[uid] = nil }
            return entry.since.duration(to: .now) > Self.maxWait ? nil : entry.context
        }
    }

    /// Runs the machine's step for `uid` in a decision span, when a traced event about them waits.
    func deciding<T>(_ uid: String, _ body: () throws -> T) rethrows -> T {
        guard Traces.isEnabled, let context = context(of: uid, taking: false) else { return try body() }
        let span = Traces.child("orchestrator.decide", of: context)
        defer { span.end() }
        return try ServiceContext.withValue(span.context, operation: body)
    }

    /// Records `uid`'s route intent in a publication span (its envelope then carries the trace).
    func publishing<T>(_ uid: String, _ body: () throws -> T) rethrows -> T {
        guard Traces.isEnabled, let context = context(of: uid, taking: true) else { return try body() }
        let span = Traces.child("publish route.intent", of: context, ofKind: .producer)
        defer { span.end() }
        return try ServiceContext.withValue(span.context, operation: body)
    }

    /// The transaction that carried `spans`' events ended (it began at `started`): each gets a
    /// commit span, and ends.
    func ended(_ spans: [any Tracing.Span], committed: Bool, started: DefaultTracerClock.Instant) {
        for span in spans {
            let commit = Traces.child("orchestrator.commit", of: span.context, at: started)
            if !committed { commit.setStatus(SpanStatus(code: .error, message: "rolled back")) }
            commit.end()
            span.end()
        }
    }
}
