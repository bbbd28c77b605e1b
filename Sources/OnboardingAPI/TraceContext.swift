import Instrumentation
import Messaging
import Synchronization
import Tracing

/// W3C trace context on the bus: each envelope may carry `traceparent` and `tracestate`
/// (see `proto/README.md`, "Traces"), and a process that exports traces continues the trace a
/// message carries.
///
/// Nothing here costs anything while ``isEnabled`` is false (the default, and whenever no OTLP
/// endpoint is set): no context is read from or written to an envelope, and no span is made.
/// The host turns it on once, before the services start, after bootstrapping the tracer.
public enum Traces {
    private static let enabled = Atomic<Bool>(false)

    /// Whether this process exports traces.
    public static var isEnabled: Bool { enabled.load(ordering: .relaxed) }

    /// Turns tracing on (or off) for the process: call it after bootstrapping the
    /// `InstrumentationSystem` and before anything sends or handles a message.
    public static func enable(_ on: Bool = true) {
        enabled.store(on, ordering: .relaxed)
    }

    /// Writes the current task's trace context (when tracing, and there is one) into `header`.
    public static func inject(into header: inout EnvelopeHeader) {
        guard isEnabled, let context = ServiceContext.current else { return }
        InstrumentationSystem.instrument.inject(context, into: &header, using: EnvelopeHeaderInjector())
    }

    /// The context a message continues, or `nil` when tracing is off, or it carries none, or
    /// its trace is not sampled.
    ///
    /// An unsampled trace is not continued: a parent-based sampler would record none of its
    /// spans, and making them (an id, a span, the context written into every event) cost as much
    /// as a third of a sign-in's CPU when the gateway kept 1 % of traces. So the work it causes
    /// carries no trace context on either.
    public static func context(of header: EnvelopeHeader) -> ServiceContext? {
        guard isEnabled, let traceparent = header.traceparent, isSampled(traceparent) else { return nil }
        var context = ServiceContext.topLevel
        InstrumentationSystem.instrument.extract(header, into: &context, using: EnvelopeHeaderExtractor())
        return context
    }

    /// Whether a `traceparent` says its trace is sampled: the low bit of its flags, the last two
    /// hex digits (`00-<trace id>-<span id>-01`). One that cannot be read is not.
    public static func isSampled(_ traceparent: String) -> Bool {
        guard traceparent.utf8.count >= 2, let low = traceparent.utf8.last else { return false }
        switch low {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return (low - UInt8(ascii: "0")) & 1 == 1
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return (low - UInt8(ascii: "a") + 10) & 1 == 1
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return (low - UInt8(ascii: "A") + 10) & 1 == 1
        default: return false
        }
    }

    /// A span for the message with `header`, continuing its trace: `nil` when tracing is off or
    /// the message carries no context. End it.
    public static func span(
        _ name: String, for header: EnvelopeHeader, ofKind kind: SpanKind, at instant: some TracerInstant = DefaultTracerClock.now
    ) -> (any Tracing.Span)? {
        guard let context = context(of: header) else { return nil }
        return InstrumentationSystem.tracer.startSpan(name, context: context, ofKind: kind, at: instant)
    }

    /// A child of `parent`'s span, started at `instant`. End it.
    public static func child(
        _ name: String, of parent: ServiceContext, ofKind kind: SpanKind = .internal, at instant: some TracerInstant = DefaultTracerClock.now
    ) -> any Tracing.Span {
        InstrumentationSystem.tracer.startSpan(name, context: parent, ofKind: kind, at: instant)
    }
}

/// Writes W3C trace context into an envelope's header.
public struct EnvelopeHeaderInjector: Injector {
    public init() {}

    public func inject(_ value: String, forKey key: String, into header: inout EnvelopeHeader) {
        switch key {
        case "traceparent": header.traceparent = value
        case "tracestate": header.tracestate = value
        default: break
        }
    }
}

/// Reads W3C trace context from an envelope's header.
public struct EnvelopeHeaderExtractor: Extractor {
    public init() {}

    public func extract(key: String, from header: EnvelopeHeader) -> String? {
        switch key {
        case "traceparent": header.traceparent
        case "tracestate": header.tracestate
        default: nil
        }
    }
}
