import Foundation
import Messaging
import OnboardingAPI
import Testing

/// `proto/` against the Swift wire types: every example validates against its schemas, decodes
/// into its Swift type and comes back out unchanged, and every message is documented once.
@Suite("proto/ agrees with the Swift wire types")
struct ProtoTests {
    static let validator = Proto.validator

    @Test("Every example validates against the envelope and its payload schema", arguments: Proto.exampleTypes)
    func exampleValidates(type: String) throws {
        let example = try Proto.example(type)
        #expect(example["type"] == .string(type), "the file name must be the envelope's type")
        #expect(Self.validator.validate(example, against: "envelope.schema.json") == [])
        let payload = try #require(example["payload"])
        #expect(Self.validator.validate(payload, against: Proto.schemaFile(for: type)) == [])
    }

    @Test("Every example decodes into its Swift type and re-encodes to the same JSON", arguments: Proto.exampleTypes)
    func exampleRoundTripsThroughSwift(type: String) throws {
        let entry = try #require(WireCatalog.byType[type], "no Swift type for \(type)")
        let original = try Proto.example(type)
        let reencoded = try JSONValue.parse(entry.roundTrip(Proto.exampleData(type)))
        #expect(Self.validator.validate(reencoded, against: "envelope.schema.json") == [])
        #expect(Self.validator.validate(reencoded["payload"] ?? .null, against: Proto.schemaFile(for: type)) == [])
        #expect(reencoded.sameJSON(as: original), "Swift (\(entry.swiftType)) wrote \(reencoded)")
    }

    @Test("The hot path's encoder writes exactly Foundation's bytes for every example", arguments: Proto.exampleTypes)
    func wireEncoderMatchesFoundation(type: String) throws {
        let entry = try #require(WireCatalog.byType[type])
        let (wire, foundation) = try entry.bothEncodings(Proto.exampleData(type))
        #expect(String(decoding: wire, as: UTF8.self) == String(decoding: foundation, as: UTF8.self))
    }

    @Test("Every example sets every payload property its schema declares", arguments: Proto.exampleTypes)
    func examplesAreComplete(type: String) throws {
        // With the round trip above this proves Swift reads and writes each declared property
        // under exactly that name.
        let payload = try #require(Proto.example(type)["payload"]?.objectValue)
        let declared = Proto.schema(Proto.schemaFile(for: type))["properties"]?.objectValue ?? [:]
        #expect(Set(declared.keys).subtracting(payload.keys) == [])
    }

    @Test("Every Swift message type has an example and a schema, and nothing else does")
    func everyMessageIsDocumentedOnce() {
        let swift = WireCatalog.types
        #expect(Proto.exampleTypes == swift, "examples")
        #expect(Proto.schemaTypes == swift, "schemas")
        #expect(Set(swift).count == WireCatalog.all.count, "a type string is used twice")
    }

    @Test("The catalog lists every request and event declared in Sources/OnboardingAPI")
    func catalogCoversTheSources() throws {
        let folder = Proto.packageRoot.appendingPathComponent("Sources/OnboardingAPI")
        let pattern = try NSRegularExpression(pattern: #"static let type = "([^"]+)""#)
        var declared: Set<String> = []
        for file in try FileManager.default.contentsOfDirectory(atPath: folder.path) where file.hasSuffix(".swift") {
            let text = try String(contentsOf: folder.appendingPathComponent(file), encoding: .utf8)
            for match in pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                declared.insert(String(text[Range(match.range(at: 1), in: text)!]))
            }
        }
        let catalogued = Set(WireCatalog.all.filter { $0.kind == .request || $0.kind == .event }.map(\.type))
        #expect(!declared.isEmpty)
        #expect(declared == catalogued)
    }

    @Test("Replies are '<type>.reply' and events are their own topic")
    func typeNaming() {
        for pair in WireCatalog.requests {
            #expect(pair[1].type == pair[0].type + ".reply")
        }
        #expect(RouteIntent.type == "route.intent")
        #expect(Topics.route(uid: "3f2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40") == "route.3f2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40")
        #expect(Topics.routePrefix == "route.")
    }

    // MARK: required and nullable, against Swift's decoder

    /// For every declared property: leaving it out or sending `null` is accepted by the schema
    /// exactly when Swift's decoder accepts it.
    @Test("Schema 'required' and nullability match what Swift decodes", arguments: Proto.schemaTypes)
    func requiredMatchesSwift(type: String) throws {
        let entry = try #require(WireCatalog.byType[type])
        let example = try Proto.example(type)
        let schemaFile = Proto.schemaFile(for: type)
        let schema = Proto.schema(schemaFile)
        let required = Set(schema["required"]?.arrayValue?.compactMap(\.stringValue) ?? [])
        for name in (schema["properties"]?.objectValue ?? [:]).keys.sorted() {
            for variant in [PropertyChange.remove, .setNull] {
                let changed = try #require(example.changingPayload(name, variant))
                let schemaAccepts = Self.validator.validate(changed["payload"] ?? .null, against: schemaFile).isEmpty
                let swiftAccepts = (try? entry.roundTrip(changed.encoded())) != nil
                #expect(schemaAccepts == swiftAccepts, "\(type).\(name) \(variant): schema \(schemaAccepts), Swift \(swiftAccepts)")
                #expect(schemaAccepts == !required.contains(name), "\(type).\(name) \(variant)")
            }
        }
    }

    @Test("Envelope 'required' and nullability match EnvelopeHeader")
    func envelopeRequiredMatchesSwift() throws {
        let schema = Proto.schema("envelope.schema.json")
        let required = Set(schema["required"]?.arrayValue?.compactMap(\.stringValue) ?? [])
        // Examples whose payloads have required fields: an empty Swift payload type decodes even
        // from `"payload": null` (see swiftIsLenientAboutEmptyPayloads).
        let reply = try Proto.example("image.deleteAll.reply")  // has correlationId and uid
        let request = try Proto.example("auth.signOut")  // has sessionToken
        let serviceRequest = try Proto.example("image.deleteAll")  // has serviceToken
        let traced = try Proto.example("auth.signedIn")  // has traceparent and tracestate
        for name in (schema["properties"]?.objectValue ?? [:]).keys.sorted() {
            let example = [reply, request, serviceRequest, traced].first { $0[name] != nil } ?? request
            #expect(example[name] != nil, "no example sets \(name)")
            for variant in [PropertyChange.remove, .setNull] {
                let changed = example.changing(name, variant)
                let schemaAccepts = Self.validator.validate(changed, against: "envelope.schema.json").isEmpty
                let entry = try #require(WireCatalog.byType[example["type"]?.stringValue ?? ""])
                let swiftAccepts = (try? entry.roundTrip(changed.encoded())) != nil
                #expect(schemaAccepts == swiftAccepts, "\(name) \(variant): schema \(schemaAccepts), Swift \(swiftAccepts)")
                #expect(schemaAccepts == !required.contains(name), "\(name) \(variant)")
            }
        }
    }

    /// Known leniency: Swift decodes a payload type without properties from `null` too. The
    /// schemas still ask for `{}`; this test notices if Swift ever changes.
    @Test("Swift accepts \"payload\": null for payloads without fields; the schema does not")
    func swiftIsLenientAboutEmptyPayloads() throws {
        let example = try Proto.example("health").changing("payload", .setNull)
        #expect((try? WireCatalog.byType["health"]!.roundTrip(example.encoded())) != nil)
        #expect(!Self.validator.validate(example, against: "envelope.schema.json").isEmpty)
    }

    // MARK: The validator is not vacuous

    static let brokenExamples: [(String, String, @Sendable (JSONValue) -> JSONValue)] = [
        ("missing required field", "auth.signIn", { $0.changingPayload("subject", .remove)! }),
        ("extra field", "auth.signIn", { $0.changingPayload("nickname", .set(.string("mina")))! }),
        ("wrong enum value", "auth.signIn", { $0.changingPayload("provider", .set(.string("facebook")))! }),
        ("wrong type", "auth.signIn.reply", { $0.changingPayload("isNewAccount", .set(.string("yes")))! }),
        ("wrong route intent", "route.intent", { $0.changingPayload("intent", .set(.string("navigate")))! }),
        ("wrong route reason", "route.intent", { $0.changingPayload("reason", .set(.string("because")))! }),
        ("wrong deletion reason", "profile.deleted", { $0.changingPayload("reason", .set(.string("gone")))! }),
        ("wrong image kind", "image.upload.reply", { $0.changingPayload("kind", .set(.string("gif")))! }),
        ("wrong username problem", "profile.checkUsername.reply", { $0.changingPayload("reason", .set(.string("rude")))! }),
        ("negative count", "image.deleteAll.reply", { $0.changingPayload("deleted", .set(.int(-1)))! }),
        ("uppercase uid", "auth.signedOut", { $0.changingPayload("uid", .set(.string("3F2B8C1E-6D4A-4B7E-9C2F-1A5E8D7B6C40")))! }),
        ("nested Profile missing username", "profile.created", { example in
            example.changingPayload("profile", .set(example["payload"]!["profile"]!.changing("username", .remove)))!
        }),
        ("nested Profile extra field", "profile.get.reply", { example in
            example.changingPayload("profile", .set(example["payload"]!["profile"]!.changing("age", .set(.int(3)))))!
        }),
        ("statistics missing a counter", "health.reply", { example in
            example.changingPayload("statistics", .set(example["payload"]!["statistics"]!.changing("lateReplies", .remove)))!
        }),
        ("error without message", "error", { $0.changingPayload("message", .remove)! }),
        ("envelope without id", "auth.signIn", { $0.changing("id", .remove) }),
        ("envelope version 2", "auth.signIn", { $0.changing("version", .set(.int(2))) }),
        ("envelope version as a string", "auth.signIn", { $0.changing("version", .set(.string("1"))) }),
        ("envelope time without milliseconds", "auth.signIn", { $0.changing("time", .set(.string("2026-11-21T05:30:00Z"))) }),
        ("envelope time not in UTC", "auth.signIn", { $0.changing("time", .set(.string("2026-11-21T14:30:00.123+09:00"))) }),
        ("envelope negative sequence", "auth.signedIn", { $0.changing("sequence", .set(.int(-1))) }),
        ("envelope payload not an object", "health", { $0.changing("payload", .set(.array([]))) }),
        ("idempotency key with a space", "onboarding.setUpProfile", { $0.changingPayload("idempotencyKey", .set(.string("my key")))! }),
        ("idempotency key too long", "profile.create", { $0.changingPayload("idempotencyKey", .set(.string(String(repeating: "k", count: 65))))! }),
        ("empty idempotency key", "image.upload", { $0.changingPayload("idempotencyKey", .set(.string("")))! }),
        ("negative events.after sequence", "events.after", { $0.changingPayload("sequence", .set(.int(-1)))! }),
        ("recorded event without envelope", "events.after.reply", { example in
            let event = example["payload"]!["events"]!.arrayValue![0].changing("envelope", .remove)
            return example.changingPayload("events", .set(.array([event])))!
        }),
        ("feed statistics missing a counter", "health.reply", { example in
            let feed = example["payload"]!["feeds"]!.arrayValue![0].changing("lost", .remove)
            return example.changingPayload("feeds", .set(.array([feed])))!
        }),
        ("route state with a wrong intent", "onboarding.intent.reply", { example in
            example.changingPayload("intent", .set(example["payload"]!["intent"]!.changing("intent", .set(.string("navigate")))))!
        }),
        ("route page state without uid", "onboarding.routes.reply", { example in
            let state = example["payload"]!["states"]!.arrayValue![0].changing("uid", .remove)
            return example.changingPayload("states", .set(.array([state])))!
        }),
    ]

    @Test("The validator rejects broken examples", arguments: brokenExamples.indices)
    func brokenExampleIsRejected(index: Int) throws {
        let (name, type, breakIt) = Self.brokenExamples[index]
        let original = try Proto.example(type)
        let broken = breakIt(original)
        #expect(broken != original, "\(name): the mutation changed nothing")
        let errors = Self.validator.validate(broken, against: "envelope.schema.json")
            + Self.validator.validate(broken["payload"] ?? .null, against: Proto.schemaFile(for: type))
        #expect(!errors.isEmpty, "\(name) was accepted")
    }

    @Test("auth.signIn's subject pattern refuses exactly what auth refuses in every mode: a control character anywhere")
    func signInSubjectPattern() throws {
        let controls = Array(0x00...0x1F) + Array(0x7F...0x9F)
        var subjects = controls.map { "a\(Character(Unicode.Scalar(UInt8($0))))b" }
        subjects += controls.map { "trailing\(Character(Unicode.Scalar(UInt8($0))))" }
        subjects += ["", "minji", "민지", "a b", " padded ", "\u{A0}", "line\u{2028}separator", "😀", "e\u{301}", "\u{FEFF}bom"]
        for subject in subjects {
            let payload = JSONValue.object(["provider": .string("kakao"), "subject": .string(subject)])
            let schemaAccepts = Self.validator.validate(payload, against: "auth.signIn.schema.json").isEmpty
            #expect(schemaAccepts == (SignIn.subjectProblem(subject) == nil), "\(subject.debugDescription)")
        }
        let nul = try #require(SignIn.subjectProblem("nul\u{0}inside"))
        #expect(nul.code == .invalidRequest && nul.message.contains("U+0000"))
        #expect(SignIn.subjectProblem("c1\u{85}")?.message.contains("U+0085") == true)
    }

    @Test("The validator reads $ as ECMA-262 does: the end of the text, not before a last line break")
    func patternEnd() {
        let validator = SchemaValidator(documents: ["x.schema.json": .object(["pattern": .string("^[a-z]*$")])])
        #expect(validator.validate(.string("abc"), against: "x.schema.json").isEmpty)
        #expect(!validator.validate(.string("abc\n"), against: "x.schema.json").isEmpty)
        #expect(SchemaValidator.ecmaEnd(#"^[$]\$x$"#) == #"^[$]\$x\z"#)
    }

    @Test("The validator refuses schema keywords it does not implement")
    func unsupportedKeywordsAreErrors() {
        let validator = SchemaValidator(documents: [
            "x.schema.json": .object(["oneOf": .array([.object(["type": .string("string")])])]),
        ])
        #expect(!validator.validate(.int(1), against: "x.schema.json").isEmpty)
    }

    // MARK: Optionals: Swift omits nil, other clients may send null

    static let nullPayloads: [(String, String)] = [
        ("auth.signIn", #"{"provider":"google","subject":"1170","idToken":null}"#),
        ("auth.signIn", #"{"provider":"naver","subject":"","idToken":null,"accessToken":null,"nonce":null,"authorizationCode":null}"#),
        ("auth.signOut", #"{"everywhere":null}"#),
        ("auth.signOut", #"{}"#),
        ("profile.get.reply", #"{"profile":null}"#),
        ("profile.get.reply", #"{}"#),
        ("profile.update", #"{"username":null,"imagePath":null}"#),
        ("profile.update", #"{}"#),
        ("profile.create", #"{"username":"mina","imagePath":null}"#),
        ("profile.checkUsername.reply", #"{"username":"mina","available":true,"reason":null}"#),
        ("onboarding.check.reply", #"{"uid":"3f2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40","hasProfile":true,"intent":null}"#),
        ("onboarding.setUpProfile", #"{"username":"mina","contentType":null}"#),
        ("image.upload", #"{"contentType":null}"#),
        ("image.upload", #"{"contentType":null,"idempotencyKey":null}"#),
        ("profile.create", #"{"username":"mina","idempotencyKey":null}"#),
        ("onboarding.setUpProfile", #"{"username":"mina","idempotencyKey":null}"#),
        ("image.deleteAll", #"{"keep":null}"#),
        ("image.deleteAll", #"{}"#),
        ("events.after", #"{"sequence":0,"limit":null}"#),
        ("events.after.reply", #"{"events":[],"firstSequence":0,"lastSequence":0}"#),
        ("onboarding.intent.reply", #"{"uid":"3f2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40","intent":null,"sequence":null,"time":null}"#),
        ("onboarding.intent.reply", #"{"uid":"3f2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40"}"#),
        ("onboarding.routes", #"{"afterUID":null,"limit":null}"#),
        ("onboarding.routes.reply", #"{"states":[],"nextUID":null}"#),
        ("error", #"{"code":"overloaded","message":"Try again shortly.","reason":null}"#),
    ]

    @Test("Payloads with null or absent optionals are valid and decode", arguments: nullPayloads)
    func nullOptionals(type: String, payload: String) throws {
        let entry = try #require(WireCatalog.byType[type])
        let payloadJSON = try JSONValue.parse(Data(payload.utf8))
        #expect(Self.validator.validate(payloadJSON, against: Proto.schemaFile(for: type)) == [])
        var envelope = try #require(Proto.example(type).objectValue)
        envelope["payload"] = payloadJSON
        envelope["correlationId"] = .null
        let reencoded = try JSONValue.parse(entry.roundTrip(JSONValue.object(envelope).encoded()))
        // Swift writes no nulls: it leaves the field out.
        #expect(reencoded["correlationId"] == nil)
        #expect(reencoded["payload"]?.objectValue?.values.contains(.null) == false)
        #expect(Self.validator.validate(reencoded["payload"] ?? .null, against: Proto.schemaFile(for: type)) == [])
    }

    // MARK: Enums and codes

    static func schemaEnum(_ name: String) -> [String] {
        Proto.schema("common.schema.json")["$defs"]?[name]?["enum"]?.arrayValue?.compactMap(\.stringValue) ?? []
    }

    @Test("Schema enums list exactly the Swift cases")
    func enumsAgree() {
        #expect(Self.schemaEnum("Provider") == Provider.allCases.map(\.rawValue))
        #expect(Self.schemaEnum("ImageKind") == ImageKind.allCases.map(\.rawValue))
        #expect(Self.schemaEnum("UsernameProblem") == UsernameProblem.allCases.map(\.rawValue))
        #expect(Self.schemaEnum("RouteIntentKind") == RouteIntent.Kind.allCases.map(\.rawValue))
        #expect(Self.schemaEnum("RouteIntentReason") == RouteIntent.Reason.allCases.map(\.rawValue))
        // DeletionReason is not CaseIterable; the switch fails to compile when a case is added.
        func listed(_ reason: DeletionReason) -> Bool {
            switch reason {
            case .request, .withdrawal: true
            }
        }
        let reasons: [DeletionReason] = [.request, .withdrawal]
        #expect(reasons.allSatisfy(listed))
        #expect(Self.schemaEnum("DeletionReason") == reasons.map(\.rawValue))
    }

    /// Codes a service sends on the wire.
    static let sentCodes: [ErrorCode] = [
        .invalidMessage, .unsupportedVersion, .unknownType, .unexpectedFrames, .messageTooLarge, .overloaded,
        .internalError, .invalidRequest, .unauthenticated, .forbidden, .invalidUsername, .usernameTaken, .profileExists,
        .profileNotFound, .imageRejected, .imageNotFound, .storeUnavailable, .dependencyUnavailable, .timeout,
    ]
    /// Codes a Swift caller's own bus raises; never on the wire, but a client in another
    /// language has its own equivalents. (`timeout` is also raised locally.)
    static let localCodes: [ErrorCode] = [.noResponder, .closed, .addressInUse, .invalidEndpoint]

    @Test("Every error code is in the README, and every sent one in error.schema.json")
    func errorCodesAreDocumented() throws {
        let readme = try Proto.text("proto/README.md")
        for code in Self.sentCodes + Self.localCodes {
            #expect(readme.contains("`\(code.rawValue)`"), "README lacks \(code)")
        }
        let listed = Proto.schema("error.schema.json")["properties"]?["code"]?["examples"]?.arrayValue?
            .compactMap(\.stringValue) ?? []
        #expect(Set(listed) == Set(Self.sentCodes.map(\.rawValue)))
        for code in Self.sentCodes {
            #expect(Self.validator.validate(.string(code.rawValue), reference: "error.schema.json#/properties/code") == [])
        }
    }

    @Test("Where the endpoints are described, both READMEs say that without CURVE anyone who can connect reads the publishers")
    func unauthenticatedBusIsSaid() throws {
        /// The text from `heading` to the next heading.
        func section(_ file: String, _ heading: String) throws -> String {
            let text = try Proto.text(file)
            let start = try #require(text.range(of: "\n\(heading)\n"), "\(file) has no \(heading)")
            let rest = text[start.upperBound...]
            return String(rest[..<(rest.range(of: "\n#")?.lowerBound ?? rest.endIndex)])
        }
        let sections = [
            try section("proto/README.md", "## Transport and endpoints"),
            try section("README.md", "## The HTTP gateway: what apps talk to"),
        ]
        for text in sections {
            #expect(text.contains("any local process"), "\(text.prefix(300))")
            #expect(text.contains("ONBOARDING_CURVE=false"), "says when the publishers are open to anyone")
            for what in ["route intents", "usernames", "image paths"] {
                #expect(text.contains(what), "does not say that \(what) can be read")
            }
        }
    }

    @Test("Every message type and schema file is named in the README")
    func readmeNamesEveryMessage() throws {
        let readme = try Proto.text("proto/README.md")
        for type in WireCatalog.types where !type.hasSuffix(".reply") {
            #expect(readme.contains("`\(type)`"), "README lacks \(type)")
        }
        // Reply schemas are named by the rule `<type>.reply.schema.json`.
        #expect(readme.contains("`<type>.reply.schema.json`"))
        for type in Proto.schemaTypes where !type.hasSuffix(".reply") {
            #expect(readme.contains(Proto.schemaFile(for: type)), "README lacks \(type).schema.json")
        }
    }

    // MARK: What Swift makes by default

    @Test("Envelopes Swift makes with default headers validate")
    func swiftDefaultsValidate() throws {
        let envelope = Envelope(
            header: EnvelopeHeader(type: SignIn.type, source: "onboarding-client"),
            payload: SignIn(provider: .naver, subject: "n-2718"))
        let json = try JSONValue.parse(envelope.encoded())
        #expect(Self.validator.validate(json, against: "envelope.schema.json") == [])
        #expect(Self.validator.validate(json["payload"] ?? .null, against: "auth.signIn.schema.json") == [])
        #expect(Self.validator.validate(.string(Timestamp.now()), reference: "common.schema.json#/$defs/Timestamp") == [])
        #expect(Self.validator.validate(.string(Timestamp.format(Date(timeIntervalSince1970: 0))), reference: "common.schema.json#/$defs/Timestamp") == [])
        #expect(Self.validator.validate(.string(UUID().uuidString.lowercased()), reference: "common.schema.json#/$defs/Uid") == [])
    }
}

enum PropertyChange: CustomStringConvertible, Sendable {
    case remove
    case setNull
    case set(JSONValue)

    var description: String {
        switch self {
        case .remove: "left out"
        case .setNull: "null"
        case .set(let value): "= \(value)"
        }
    }
}

extension JSONValue {
    /// This object with `key` removed or replaced.
    func changing(_ key: String, _ change: PropertyChange) -> JSONValue {
        guard var members = objectValue else { return self }
        switch change {
        case .remove: members[key] = nil
        case .setNull: members[key] = .null
        case .set(let value): members[key] = value
        }
        return .object(members)
    }

    /// This envelope with its payload's `key` removed or replaced; `nil` when there is no payload.
    func changingPayload(_ key: String, _ change: PropertyChange) -> JSONValue? {
        guard let payload = self["payload"] else { return nil }
        return changing("payload", .set(payload.changing(key, change)))
    }
}
