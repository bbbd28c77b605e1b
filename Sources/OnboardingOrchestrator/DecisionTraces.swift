import Messaging
import OnboardingAPI
import Synchronization
import Tracing

/// The orchestrator's part of a traced sign-in (see ``Traces``): a span for each traced event it
/// processes, and under it the decision, the route intent's publication and the commit. The
/// intent's envelope carries the trace on, to the gateway's stream.
///
/// An event's context is kept by uid until an intent for that person is published: when the
/// intent waits for a profile check (a later transaction), it still joins the sign-in's trace.
///
/// Thread safety: behind one mutex. Nothing is taken while tracing is off.
final class DecisionTraces: Sendable {
    private struct State {
        /// The context of each person's last traced event whose intent is not yet published.
        var waiting: [String: ServiceContext] = [:]
        /// Event spans of the transaction under way, ended once it has committed.
        var open: [any Tracing.Span] = []
    }

    private let state = Mutex(State())
    /// People remembered at most; beyond, the oldest contexts are forgotten.
    static let maxWaiting = 50_000

    /// A traced event about `uid` arrived: its span starts.
    func received(_ event: Message, about uid: String) {
        guard let span = Traces.span("process \(event.header.type)", for: event.header, ofKind: .consumer) else { return }
        state.withLock { state in
            if state.waiting.count >= Self.maxWaiting { state.waiting.removeAll(keepingCapacity: true) }
            state.waiting[uid] = span.context
            state.open.append(span)
        }
    }

    /// Runs the machine's step for `uid` in a decision span, when a traced event about them waits.
    func deciding<T>(_ uid: String, _ body: () throws -> T) rethrows -> T {
        guard Traces.isEnabled, let context = state.withLock({ $0.waiting[uid] }) else { return try body() }
        let span = Traces.child("orchestrator.decide", of: context)
        defer { span.end() }
        return try ServiceContext.withValue(span.context, operation: body)
    }

    /// Records `uid`'s route intent in a publication span (its envelope then carries the trace).
    func publishing<T>(_ uid: String, _ body: () throws -> T) rethrows -> T {
        guard Traces.isEnabled, let context = state.withLock({ $0.waiting.removeValue(forKey: uid) }) else { return try body() }
        let span = Traces.child("publish route.intent", of: context, ofKind: .producer)
        defer { span.end() }
        return try ServiceContext.withValue(span.context, operation: body)
    }

    /// The transaction under way ended (it began at `started`): each traced event's span gets a
    /// commit span, and ends.
    func ended(committed: Bool, started: DefaultTracerClock.Instant) {
        guard Traces.isEnabled else { return }
        let open = state.withLock { state in
            defer { state.open.removeAll(keepingCapacity: true) }
            return state.open
        }
        for span in open {
            let commit = Traces.child("orchestrator.commit", of: span.context, at: started)
            if !committed { commit.setStatus(SpanStatus(code: .error, message: "rolled back")) }
            commit.end()
            span.end()
        }
    }
}
