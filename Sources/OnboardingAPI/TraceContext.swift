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
        let (traceparent, tracestate) = current()
        if let traceparent {
            header.traceparent = traceparent
            header.tracestate = tracestate
        }
    }

    /// The current task's trace context as W3C text (`nil`s when not tracing, or there is none),
    /// for what is written later than it is decided (an event recorded in a buffer, say).
    public static func current() -> (traceparent: String?, tracestate: String?) {
        guard isEnabled, let context = ServiceContext.current else { return (nil, nil) }
        var carrier = TraceCarrier()
        InstrumentationSystem.instrument.inject(context, into: &carrier, using: TraceCarrier.Injector())
        return (carrier.traceparent, carrier.tracestate)
    }

    /// The context a message continues, or `nil` when tracing is off, or it carries none, or
    /// its trace is not sampled.
    ///
    /// An unsampled trace is not continued: a parent-based sampler would record none of its
    /// spans, and making them (an id, a span, the context written into every event) cost as much
    /// as a third of a sign-in's CPU when the gateway kept 1 % of traces. So the work it causes
    /// carries no trace context on either.
    ///
    /// A `traceparent` that is not W3C's version 00 form is ignored, as is a `tracestate` over
    /// 512 bytes: they come from callers. Only the two fields reach the tracer (whose log line
    /// about one it cannot read names what it was given).
    public static func context(of header: EnvelopeHeader) -> ServiceContext? {
        guard isEnabled, let traceparent = header.traceparent else { return nil }
        return context(traceparent: traceparent, tracestate: header.tracestate)
    }

    /// The context that W3C trace context text continues: `nil` when tracing is off, or the
    /// `traceparent` is not version 00's form, or its trace is not sampled.
    public static func context(traceparent: String, tracestate: String?) -> ServiceContext? {
        guard isEnabled, isWellFormed(traceparent), isSampled(traceparent) else { return nil }
        let carrier = TraceCarrier(traceparent: traceparent, tracestate: tracestate.flatMap { $0.utf8.count <= 512 ? $0 : nil })
        var context = ServiceContext.topLevel
        InstrumentationSystem.instrument.extract(carrier, into: &context, using: TraceCarrier.Extractor())
        return context
    }

    /// Whether `traceparent` has W3C's version 00 form: `00-<32 hex>-<16 hex>-<2 hex>`, lowercase,
    /// with ids that are not all zeros.
    public static func isWellFormed(_ traceparent: String) -> Bool {
        let bytes = Array(traceparent.utf8)
        guard bytes.count == 55, bytes[0] == UInt8(ascii: "0"), bytes[1] == UInt8(ascii: "0"), bytes[2] == UInt8(ascii: "-"),
            bytes[35] == UInt8(ascii: "-"), bytes[52] == UInt8(ascii: "-")
        else { return false }
        func hex(_ range: Range<Int>) -> Bool {
            bytes[range].allSatisfy { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains($0) }
        }
        func zero(_ range: Range<Int>) -> Bool { bytes[range].allSatisfy { $0 == UInt8(ascii: "0") } }
        return hex(3..<35) && hex(36..<52) && hex(53..<55) && !zero(3..<35) && !zero(36..<52)
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

/// W3C trace context's two fields, and nothing else: what is handed to the tracer to read or
/// write (never a whole envelope or set of HTTP headers, which hold tokens).
public struct TraceCarrier: Sendable, Hashable {
    public var traceparent: String?
    public var tracestate: String?

    public init(traceparent: String? = nil, tracestate: String? = nil) {
        self.traceparent = traceparent
        self.tracestate = tracestate
    }

    public struct Injector: Instrumentation.Injector {
        public init() {}

        public func inject(_ value: String, forKey key: String, into carrier: inout TraceCarrier) {
            switch key {
            case "traceparent": carrier.traceparent = value
            case "tracestate": carrier.tracestate = value
            default: break
            }
        }
    }

    public struct Extractor: Instrumentation.Extractor {
        public init() {}

        public func extract(key: String, from carrier: TraceCarrier) -> String? {
            switch key {
            case "traceparent": carrier.traceparent
            case "tracestate": carrier.tracestate
            default: nil
            }
        }
    }
}
