import Foundation

/// Where a socket binds or connects, such as `tcp://127.0.0.1:7101`.
///
/// An endpoint to connect to may name several replicas of one service, separated by commas
/// (`tcp://10.0.0.1:7101,tcp://10.0.0.2:7101`): a request goes to one replica that is
/// connected, and a subscription hears every replica's events. A socket binds one address.
///
/// The in-process bus uses the same strings as names, so configuration is the same for both.
public struct Endpoint: RawRepresentable, Hashable, Sendable, ExpressibleByStringLiteral,
    CustomStringConvertible
{
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public init(stringLiteral value: String) { self.rawValue = value }
    public var description: String { rawValue }

    /// One endpoint naming every replica in `replicas`.
    public init(replicas: [Endpoint]) {
        self.rawValue = replicas.map(\.rawValue).joined(separator: ",")
    }

    /// The addresses this endpoint names: itself, or each replica of a list.
    public var replicas: [Endpoint] {
        guard rawValue.contains(",") else { return [self] }
        return rawValue.split(separator: ",").map { Endpoint(String($0.trimmingCharacters(in: .whitespaces))) }
    }

    /// Whether this endpoint names more than one replica (it can be connected to, not bound).
    public var isList: Bool { rawValue.contains(",") }
}

extension ServiceError {
    /// The error for binding an endpoint that lists replicas.
    public static func cannotBindList(_ endpoint: Endpoint) -> ServiceError {
        ServiceError(
            .invalidEndpoint,
            "\(endpoint) lists several replicas: a process binds one address of them (its rpc.bind or events.bind setting).")
    }
}

/// Size limits for what an endpoint accepts.
public struct MessageLimits: Sendable, Hashable {
    /// The largest JSON envelope frame accepted.
    public var maxEnvelopeBytes: Int
    /// The largest binary frame accepted; 0 means the endpoint takes no binary frame.
    public var maxAttachmentBytes: Int
    /// How many received requests (or events) may wait for the handler before new ones are
    /// refused with `overloaded` (or, for events, counted as dropped).
    public var queueLimit: Int

    public init(maxEnvelopeBytes: Int = 64 * 1024, maxAttachmentBytes: Int = 0, queueLimit: Int = 4096) {
        self.maxEnvelopeBytes = maxEnvelopeBytes
        self.maxAttachmentBytes = maxAttachmentBytes
        self.queueLimit = queueLimit
    }

    /// The hard cap a transport may enforce below the application limits (such as
    /// `ZMQ_MAXMSGSIZE`): anything larger is cut off rather than answered.
    ///
    /// The larger limit plus 1 MiB of slack, saturating: limits near `Int.max` give `Int.max`
    /// (never a trap), and the result always fits the `int64_t` that `ZMQ_MAXMSGSIZE` takes.
    public var transportCap: Int {
        let largest = max(maxEnvelopeBytes, maxAttachmentBytes, 0)
        let (sum, overflow) = largest.addingReportingOverflow(1024 * 1024)
        let saturated = overflow ? Int.max : sum
        return Int(clamping: Int64(clamping: saturated))
    }
}

/// A message to send: the JSON envelope bytes and at most one binary frame.
public struct OutgoingMessage: Sendable {
    /// The topic frame of an event; `nil` on requests and replies.
    public var topic: String?
    /// The JSON envelope.
    public var body: Data
    /// Raw bytes sent as a frame of their own after the envelope (an image, for example).
    public var attachment: Data?
    /// The code of the error this reply carries (see ``Message/errorReply(_:correlationId:source:)``),
    /// for the replier's own counts; `nil` on answers and events. Not sent: the body says it.
    public var failure: ErrorCode?

    public init(topic: String? = nil, body: Data, attachment: Data? = nil) {
        self.topic = topic
        self.body = body
        self.attachment = attachment
    }

    /// Encodes `envelope` as the body.
    public init<Payload>(topic: String? = nil, _ envelope: Envelope<Payload>, attachment: Data? = nil) throws {
        self.init(topic: topic, body: try envelope.encoded(), attachment: attachment)
    }
}

/// A message received from the bus, with its header already read.
public struct Message: Sendable {
    /// The topic frame, on events.
    public var topic: String?
    public var header: EnvelopeHeader
    /// The whole JSON envelope as received.
    public var body: Data
    /// The binary frame after the envelope, if there was one.
    public var attachment: Data?
    /// Who sent it, as the bus authenticated it: the name of the caller's key (CURVE). `nil` on
    /// a bus without keys, and on the in-process bus.
    public var caller: String?
    /// The payload, when it was read with the header (see ``EnvelopeReader``): ``payload(as:)``
    /// then returns it without reading the JSON again.
    var preread: (any Sendable)?

    public init(topic: String? = nil, header: EnvelopeHeader, body: Data, attachment: Data? = nil) {
        self.topic = topic
        self.header = header
        self.body = body
        self.attachment = attachment
    }

    /// A message read by `reader` in one pass: header and, for the types it knows, payload.
    ///
    /// - Throws: the same errors as ``init(topic:body:attachment:)``, and for a known type the
    ///   errors of ``payload(as:)``.
    public init(topic: String? = nil, body: Data, attachment: Data? = nil, reader: EnvelopeReader) throws(ServiceError) {
        self.init(topic: topic, read: try reader.read(body), body: body, attachment: attachment)
    }

    /// A message whose envelope `body` was read into `read`.
    public init(topic: String? = nil, read: EnvelopeReader.Read, body: Data, attachment: Data? = nil) {
        self.init(topic: topic, header: read.header, body: body, attachment: attachment)
        self.preread = read.payload
    }

    /// Reads the header of a received envelope.
    ///
    /// - Throws: ``ServiceError`` with `invalidMessage` when `body` is not a JSON envelope, or
    ///   `unsupportedVersion` when its version is not ``EnvelopeHeader/currentVersion``.
    public init(topic: String? = nil, body: Data, attachment: Data? = nil) throws(ServiceError) {
        // An envelope is a JSON object, so it ends with "}". Refusing anything else before
        // decoding is not only quicker: JSONDecoder traps (crashing the process) instead of
        // throwing when the body's last byte is the "[" that nests one level too deep (513).
        guard Self.endsWithClosingBrace(body) else {
            throw ServiceError(.invalidMessage, "The message is not a JSON envelope: malformed JSON")
        }
        let header: EnvelopeHeader
        do {
            header = try WireDecoder.decode(EnvelopeHeader.self, from: body)
        } catch {
            throw ServiceError(.invalidMessage, "The message is not a JSON envelope: \(Self.explain(error))")
        }
        guard header.version == EnvelopeHeader.currentVersion else { throw Self.unsupported(header) }
        self.init(topic: topic, header: header, body: body, attachment: attachment)
    }

    static func unsupported(_ header: EnvelopeHeader) -> ServiceError {
        ServiceError(
            .unsupportedVersion,
            "Envelope version \(header.version) is not supported; this service speaks version \(EnvelopeHeader.currentVersion)."
        )
    }

    /// Decodes the payload as `Payload`.
    ///
    /// - Throws: ``ServiceError`` with `invalidMessage`, naming the field that is wrong.
    public func payload<Payload: Codable & Sendable>(as _: Payload.Type = Payload.self) throws(ServiceError) -> Payload {
        if let preread = preread as? Payload { return preread }
        do {
            return try WireDecoder.decode(Envelope<Payload>.self, from: body).payload
        } catch {
            throw ServiceError(
                .invalidMessage, "The payload of a \(header.type) message is not valid: \(Self.explain(error))")
        }
    }

    /// When this message is an error reply, the error it carries.
    public var serviceError: ServiceError? {
        guard header.type == ServiceError.messageType else { return nil }
        return (try? payload(as: ServiceError.self))
            ?? ServiceError(.invalidMessage, "An error reply from \(header.source) could not be read.")
    }

    /// Whether the last byte of `body` that is not JSON whitespace is `}`.
    static func endsWithClosingBrace(_ body: Data) -> Bool {
        body.last { ![0x20, 0x09, 0x0A, 0x0D].contains($0) } == UInt8(ascii: "}")
    }

    static func explain(_ error: any Error) -> String {
        switch error {
        case DecodingError.keyNotFound(let key, let context):
            return "missing field \(path(context.codingPath + [key]))"
        case DecodingError.typeMismatch(_, let context), DecodingError.valueNotFound(_, let context):
            return "field \(path(context.codingPath)) has the wrong type"
        case DecodingError.dataCorrupted(let context):
            return context.codingPath.isEmpty ? "malformed JSON" : "field \(path(context.codingPath)) is not valid"
        default:
            return "\(error)"
        }
    }

    private static func path(_ keys: [any CodingKey]) -> String {
        let joined = keys.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
        return "'\(joined)'"
    }
}

extension Message {
    /// Makes the reply envelope header for this request.
    public func replyHeader(type: String, source: String) -> EnvelopeHeader {
        EnvelopeHeader(type: type, source: source, correlationId: header.id, uid: header.uid)
    }

    /// Builds the error reply to this request.
    public func errorReply(_ error: ServiceError, source: String) -> OutgoingMessage {
        Self.errorReply(error, correlationId: header.id, source: source)
    }

    /// Builds the error reply to a request that was refused before anything answered it: over a
    /// limit, with frames it should not have, unreadable, or of another envelope version.
    ///
    /// The reply carries the request's `id` as `correlationId` whenever it can be had cheaply:
    /// when the envelope frame `body` is within `limits` and is a JSON object with a string `id`
    /// (read alone, so it is found even when other fields are wrong). An envelope frame over the
    /// limit is not read at all: its reply has no `correlationId`, nor has one whose `id` cannot
    /// be read.
    public static func errorReply(_ error: ServiceError, refusing body: Data?, limits: MessageLimits, source: String)
        -> OutgoingMessage
    {
        let id = body.flatMap { $0.count <= limits.maxEnvelopeBytes ? requestID(in: $0) : nil }
        return errorReply(error, correlationId: id, source: source)
    }

    /// The string `id` at the top level of the JSON object `body`, or `nil`. For error replies
    /// only: it reads `body` again. Call it only on a frame within the envelope limit.
    public static func requestID(in body: Data) -> String? {
        guard endsWithClosingBrace(body) else { return nil }
        return (try? WireDecoder.decode(IDOnly.self, from: body))?.id
    }

    private struct IDOnly: Decodable {
        var id: String?
    }

    /// Builds an error reply when the request could not even be read.
    public static func errorReply(_ error: ServiceError, correlationId: String?, source: String) -> OutgoingMessage {
        let envelope = Envelope(
            header: EnvelopeHeader(type: ServiceError.messageType, source: source, correlationId: correlationId),
            payload: error
        )
        // Encoding a ServiceError cannot fail: it is strings only.
        var reply = OutgoingMessage(body: (try? envelope.encoded()) ?? Data())
        reply.failure = error.code
        return reply
    }
}
