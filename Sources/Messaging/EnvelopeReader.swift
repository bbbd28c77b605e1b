import Foundation

/// Reads an envelope's header and, for the message types it knows, the payload too, in one pass
/// over the JSON: the hot path reads each message once (``Message/init(topic:body:attachment:)``
/// followed by ``Message/payload(as:)`` reads it twice).
///
/// Register the payload type of each message type the reader should decode; other types are
/// read as far as the header, and ``Read/payload`` is `nil`.
///
/// Threading: immutable once built; `read` may be called from any thread.
public struct EnvelopeReader: Sendable {
    /// What was read.
    public struct Read: Sendable {
        public var header: EnvelopeHeader
        /// The payload, when the header's type is registered.
        public var payload: (any Sendable)?
    }

    private var decoders: [String: @Sendable (any Decoder) throws -> any Sendable] = [:]
    /// The registered types that read themselves (``WireReadable``), by message type.
    private var readers: [String: @Sendable (WireObject) throws -> any Sendable] = [:]
    /// The registered types that do not.
    private var decodables: Set<String> = []

    public init() {}

    /// Decodes the payload of messages of type `messageType` as `Payload`.
    public mutating func register<Payload: Decodable & Sendable>(_: Payload.Type, for messageType: String) {
        decoders[messageType] = { decoder in
            try decoder.container(keyedBy: PayloadKey.self).decode(Payload.self, forKey: .payload)
        }
        if let readable = Payload.self as? any (WireReadable & Sendable).Type {
            // The type is looked up once, here, not on every message.
            readers[messageType] = Self.reader(of: readable)
            decodables.remove(messageType)
        } else {
            readers[messageType] = nil
            decodables.insert(messageType)
        }
    }

    private static func reader<Payload: WireReadable & Sendable>(of _: Payload.Type) -> @Sendable (WireObject) throws -> any Sendable {
        { object in try Payload(wire: object) }
    }

    /// Reads `body`.
    ///
    /// - Throws: ``ServiceError`` with `invalidMessage` (naming the wrong field, as
    ///   ``Message/payload(as:)`` does) or `unsupportedVersion`, the same errors and texts as
    ///   reading it with ``Message``.
    public func read(_ body: Data) throws(ServiceError) -> Read {
        guard Message.endsWithClosingBrace(body) else {
            throw ServiceError(.invalidMessage, "The message is not a JSON envelope: malformed JSON")
        }
        if let (header, payload) = WireDecoder.fastRead(body, readers: readers, decodables: decodables) {
            guard header.version == EnvelopeHeader.currentVersion else { throw Message.unsupported(header) }
            return Read(header: header, payload: payload)
        }
        let read: Read
        do {
            read = try WireDecoder.decode(OnePass.self, from: body, userInfo: [.envelopeReader: Box(decoders: decoders)]).read
        } catch let failure as PayloadFailure {
            guard failure.header.version == EnvelopeHeader.currentVersion else { throw Message.unsupported(failure.header) }
            throw ServiceError(
                .invalidMessage,
                "The payload of a \(failure.header.type) message is not valid: \(Message.explain(failure.error))")
        } catch {
            throw ServiceError(.invalidMessage, "The message is not a JSON envelope: \(Message.explain(error))")
        }
        guard read.header.version == EnvelopeHeader.currentVersion else { throw Message.unsupported(read.header) }
        return read
    }

    private enum PayloadKey: String, CodingKey { case payload }

    private final class Box: Sendable {
        let decoders: [String: @Sendable (any Decoder) throws -> any Sendable]
        init(decoders: [String: @Sendable (any Decoder) throws -> any Sendable]) { self.decoders = decoders }
    }

    /// A payload that did not decode, with the header that did.
    private struct PayloadFailure: Error {
        var header: EnvelopeHeader
        var error: any Error
    }

    private struct OnePass: Decodable {
        var read: Read

        init(from decoder: any Decoder) throws {
            let header = try EnvelopeHeader(from: decoder)
            guard let box = decoder.userInfo[.envelopeReader] as? Box, let decode = box.decoders[header.type] else {
                read = Read(header: header, payload: nil)
                return
            }
            do {
                read = Read(header: header, payload: try decode(decoder))
            } catch {
                throw PayloadFailure(header: header, error: error)
            }
        }
    }
}

extension CodingUserInfoKey {
    fileprivate static let envelopeReader = CodingUserInfoKey(rawValue: "onboarding.envelopeReader")!
}
