import Foundation
@testable import Messaging
import OnboardingAPI

/// The repository's `proto/` folder and what is in it.
enum Proto {
    /// The package root: the nearest folder above this file that holds `Package.swift`.
    static let packageRoot: URL = {
        var folder = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while folder.path != "/" {
            if FileManager.default.fileExists(atPath: folder.appendingPathComponent("Package.swift").path) {
                return folder
            }
            folder.deleteLastPathComponent()
        }
        fatalError("No Package.swift above \(#filePath)")
    }()

    static let folder = packageRoot.appendingPathComponent("proto")
    static let schemasFolder = folder.appendingPathComponent("schemas")
    static let examplesFolder = folder.appendingPathComponent("examples")

    /// Schema files that are not the payload of one message type.
    static let sharedSchemas: Set<String> = ["envelope.schema.json", "common.schema.json"]

    static let validator: SchemaValidator = {
        do {
            return try SchemaValidator(folder: schemasFolder)
        } catch {
            fatalError("Cannot read \(schemasFolder.path): \(error)")
        }
    }()

    /// The message types that have an example file (`<type>.json`), sorted.
    static let exampleTypes: [String] = jsonFiles(in: examplesFolder, suffix: ".json")

    /// The message types that have a payload schema (`<type>.schema.json`), sorted.
    static let schemaTypes: [String] = jsonFiles(in: schemasFolder, suffix: ".schema.json")
        .filter { !sharedSchemas.contains($0 + ".schema.json") }

    static func schemaFile(for type: String) -> String { type + ".schema.json" }

    static func exampleData(_ type: String) throws -> Data {
        try Data(contentsOf: examplesFolder.appendingPathComponent(type + ".json"))
    }

    static func example(_ type: String) throws -> JSONValue {
        try JSONValue.parse(exampleData(type))
    }

    static func schema(_ file: String) -> JSONValue {
        validator.documents[file] ?? .null
    }

    static func text(_ relativePath: String) throws -> String {
        try String(contentsOf: packageRoot.appendingPathComponent(relativePath), encoding: .utf8)
    }

    private static func jsonFiles(in folder: URL, suffix: String) -> [String] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: folder.path)) ?? []
        return names.filter { $0.hasSuffix(suffix) }.map { String($0.dropLast(suffix.count)) }.sorted()
    }
}

/// Every message type on the wire, with the Swift type its payload decodes into.
///
/// Built from the Swift types themselves, so a type string here is always the one the code
/// sends. `OnboardingAPITests` checks that this table, the Swift sources, the schemas and the
/// examples name the same set of types.
enum WireCatalog {
    enum Kind: String, Sendable {
        case request, reply, event, error
    }

    struct Entry: Sendable {
        let type: String
        let kind: Kind
        let swiftType: String
        /// Decodes a whole envelope of this type into `Envelope<T>` and encodes it again with
        /// the wire encoder.
        let roundTrip: @Sendable (Data) throws -> Data
        /// Decodes a received message's payload as `T`, the way services do.
        let decodePayload: @Sendable (Message) throws(ServiceError) -> Void
        /// Decodes a whole envelope and encodes it with ``WireEncoder`` and with Foundation's
        /// encoder (``WireFormat/encoder()``).
        let bothEncodings: @Sendable (Data) throws -> (wire: Data, foundation: Data)
        /// Decodes a whole envelope with the fast path alone and with Foundation; each result
        /// re-encoded by Foundation, so they compare.
        let bothDecodings: @Sendable (Data) throws -> (fast: Data, foundation: Data)
        /// What the two decoders make of `data`.
        let compareDecoders: @Sendable (Data) -> DecoderVerdict
    }

    enum DecoderVerdict {
        case bothDecoded(fast: Data, foundation: Data)
        case fastAcceptedWhatFoundationRefused
        case leftToFoundation
    }

    static func entry<T: Codable & Sendable>(_ type: String, _ kind: Kind, _: T.Type) -> Entry {
        Entry(
            type: type, kind: kind, swiftType: String(describing: T.self),
            roundTrip: { data in
                let envelope = try WireFormat.decoder().decode(Envelope<T>.self, from: data)
                return try envelope.encoded()
            },
            decodePayload: { message throws(ServiceError) in _ = try message.payload(as: T.self) },
            bothEncodings: { data in
                let envelope = try WireFormat.decoder().decode(Envelope<T>.self, from: data)
                return (try WireEncoder.encode(envelope), try WireFormat.encoder().encode(envelope))
            },
            bothDecodings: { data in
                let fast = try WireDecoder.fastDecode(Envelope<T>.self, from: data, userInfo: [:])
                let foundation = try WireFormat.decoder().decode(Envelope<T>.self, from: data)
                return (try WireFormat.encoder().encode(fast), try WireFormat.encoder().encode(foundation))
            },
            compareDecoders: { data in
                let fast = try? WireDecoder.fastDecode(Envelope<T>.self, from: data, userInfo: [:])
                let foundation = try? WireFormat.decoder().decode(Envelope<T>.self, from: data)
                switch (fast, foundation) {
                case (let fast?, let foundation?):
                    return .bothDecoded(
                        fast: (try? WireFormat.encoder().encode(fast)) ?? Data(),
                        foundation: (try? WireFormat.encoder().encode(foundation)) ?? Data())
                case (.some, nil): return .fastAcceptedWhatFoundationRefused
                default: return .leftToFoundation
                }
            })
    }

    static func request<R: APIRequest>(_: R.Type) -> [Entry] {
        [entry(R.type, .request, R.self), entry(R.replyType, .reply, R.Response.self)]
    }

    static func event<E: APIEvent>(_: E.Type) -> Entry {
        entry(E.type, .event, E.self)
    }

    static let requests: [[Entry]] = [
        request(HealthCheck.self),
        request(SignIn.self), request(SignOut.self), request(Withdraw.self), request(VerifySession.self),
        request(GetProfile.self), request(CreateProfile.self), request(AbandonCreates.self), request(UpdateProfile.self),
        request(DeleteProfile.self), request(CheckUsername.self), request(EvictCachedProfile.self),
        request(UploadImage.self), request(DeleteImage.self), request(DeleteAllImages.self),
        request(CheckOnboarding.self), request(SetUpProfile.self),
        request(EventsAfter.self), request(CurrentIntent.self), request(ListRouteStates.self),
    ]

    static let events: [Entry] = [
        event(SignedIn.self), event(SignedOut.self), event(Withdrawn.self),
        event(ProfileCreated.self), event(ProfileUpdated.self), event(ProfileDeleted.self),
        event(RouteIntent.self),
    ]

    static let all: [Entry] = requests.flatMap { $0 } + events + [entry(ServiceError.messageType, .error, ServiceError.self)]

    static let byType: [String: Entry] = Dictionary(uniqueKeysWithValues: all.map { ($0.type, $0) })

    static var types: [String] { all.map(\.type).sorted() }
}
