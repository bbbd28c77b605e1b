import Foundation
import FuzzKit
import Messaging
import OnboardingAPI
import Testing

/// Fuzzes the one path every received byte goes through: `Message(body:)` (the envelope header)
/// and `Message.payload(as:)` (the typed payload), with a corpus generated from `proto/examples`.
///
/// Whatever the input, decoding must not crash and must either succeed or throw a
/// ``ServiceError`` with a code the wire documents (`invalidMessage`, `unsupportedVersion`).
/// Where the mutation decides the outcome (a missing required field, a wrong version, an unknown
/// field) the outcome is checked too. The run is deterministic for a seed; see ``FuzzSettings``
/// (`FUZZ_SEED`, `FUZZ_ITERATIONS`).
@Suite("Fuzz: the envelope decoder")
struct EnvelopeFuzzTests {
    static let settings = FuzzSettings.fromEnvironment("envelope decoder", defaultIterations: 3_000, defaultSeed: 0xE17E_10FE)

    @Test("Malformed envelopes never crash the decoder and are refused with typed errors")
    func fuzzDecoder() async throws {
        let settings = Self.settings
        print("[fuzz] \(settings)")
        let corpus = try DecoderCorpus()
        var tally = DecoderTally()
        var failing: [Int] = []
        for index in 0..<settings.iterations {
            await letOtherTestsRun(every: 50, at: index)
            var random = FuzzRandom(seed: settings.seed, case: index)
            let fuzzCase = corpus.makeCase(&random)
            let entry = try #require(WireCatalog.byType[fuzzCase.type])
            settings.traceCase(index, "\(fuzzCase.strategy) of \(fuzzCase.type) [\(fuzzCase.steps.joined(separator: "; "))] \(fuzzPreview(fuzzCase.bytes, limit: 80))")
            let started = ContinuousClock.now
            let (outcome, problems) = DecoderOracle.check(fuzzCase, entry: entry)
            tally.count(fuzzCase.strategy, outcome, ContinuousClock.now - started)
            guard !problems.isEmpty else { continue }
            failing.append(index)
            if failing.count <= 10 {
                Issue.record("""
                    \(settings.label(index)), \(fuzzCase.strategy) of \(fuzzCase.type) [\(fuzzCase.steps.joined(separator: "; "))], \
                    expected \(fuzzCase.expected): \(problems.joined(separator: "; "))
                      input: \(fuzzPreview(fuzzCase.bytes))
                    """)
            }
        }
        print("[fuzz] envelope decoder: \(tally)")
        #expect(failing.isEmpty, "\(failing.count) failing cases, first \(failing.prefix(20))")
        if settings.iterations >= 1_000 {
            // The corpus reaches every outcome (or it tests less than it claims).
            for outcome in DecoderOutcome.allCases {
                #expect(tally.outcomes[outcome, default: 0] > 0, "no case ended \(outcome)")
            }
        }
    }

    /// Inputs found by fuzzing, kept as plain regression cases.
    @Test("Found by fuzzing: a body ending in the bracket that nests too deep is invalidMessage, not a crash",
          arguments: [512, 513, 514, 1_000])
    func nestingLimitAtTheEnd(depth: Int) throws {
        // JSONDecoder (swift-foundation) traps when the bracket that exceeds its nesting limit
        // (512) is the body's last byte; Message must refuse such a body before decoding it.
        let bodies = [
            Data(repeating: UInt8(ascii: "["), count: depth),
            Data(#"{"version":1,"x":"#.utf8) + Data(repeating: UInt8(ascii: "["), count: depth),
        ]
        for body in bodies {
            do throws(ServiceError) {
                _ = try Message(body: body)
                Issue.record("\(body.count) bytes of unfinished nesting were accepted")
            } catch {
                #expect(error.code == .invalidMessage)
            }
        }
    }
}

// MARK: - Cases

/// What a case's input must do.
enum DecoderExpectation: CustomStringConvertible, Sendable {
    /// Both the header and the payload decode.
    case accepted
    /// `Message(body:)` throws this code.
    case headerRejected(ErrorCode)
    /// The header decodes; the payload is `invalidMessage`.
    case payloadRejected
    /// Only the invariants: no crash, a typed error with a documented code.
    case anything

    var description: String {
        switch self {
        case .accepted: "accepted"
        case .headerRejected(let code): "header \(code)"
        case .payloadRejected: "payload invalidMessage"
        case .anything: "anything typed"
        }
    }
}

enum DecoderOutcome: String, CaseIterable, Sendable {
    case accepted, invalidMessage, unsupportedVersion, payloadRejected
}

struct DecoderCase: Sendable {
    var strategy: String
    /// The example the input was made from.
    var type: String
    var steps: [String] = []
    var bytes: [UInt8]
    var expected: DecoderExpectation
}

struct DecoderTally: CustomStringConvertible {
    var outcomes: [DecoderOutcome: Int] = [:]
    var strategies: [String: Int] = [:]
    var time: [String: Duration] = [:]

    mutating func count(_ strategy: String, _ outcome: DecoderOutcome, _ duration: Duration) {
        outcomes[outcome, default: 0] += 1
        strategies[strategy, default: 0] += 1
        time[strategy, default: .zero] += duration
    }

    var description: String {
        let total = outcomes.values.reduce(0, +)
        let byOutcome = DecoderOutcome.allCases.map { "\($0.rawValue) \(outcomes[$0, default: 0])" }.joined(separator: ", ")
        let byStrategy = strategies.sorted { $0.key < $1.key }.map { strategy, count in
            "\(strategy) \(count) (\(time[strategy, default: .zero].formatted(.units(allowed: [.milliseconds], width: .narrow))))"
        }.joined(separator: ", ")
        return "\(total) cases: \(byOutcome). Strategies: \(byStrategy)"
    }
}

/// The examples and what their schemas say, and the generator of cases from them.
struct DecoderCorpus {
    struct Example {
        var type: String
        var json: FuzzJSON
        /// Required payload properties, from `<type>.schema.json`.
        var requiredPayload: Set<String>
        /// Every declared payload property.
        var declaredPayload: Set<String>
    }

    let examples: [Example]
    /// Required envelope fields, from `envelope.schema.json`.
    let requiredHeader: Set<String>
    /// Every declared envelope field.
    let declaredHeader: Set<String>

    init() throws {
        examples = try Proto.exampleTypes.map { type in
            let schema = Proto.schema(Proto.schemaFile(for: type))
            return Example(
                type: type, json: try FuzzJSON.parse(Proto.exampleData(type)),
                requiredPayload: Set(schema["required"]?.arrayValue?.compactMap(\.stringValue) ?? []),
                declaredPayload: Set(schema["properties"]?.objectValue?.keys.map { $0 } ?? []))
        }
        let envelope = Proto.schema("envelope.schema.json")
        requiredHeader = Set(envelope["required"]?.arrayValue?.compactMap(\.stringValue) ?? [])
        declaredHeader = Set(envelope["properties"]?.objectValue?.keys.map { $0 } ?? [])
    }

    typealias Strategy = (inout FuzzRandom, Example) -> DecoderCase

    /// The strategies and how often each is used.
    var strategies: [(weight: Int, value: (name: String, make: Strategy))] {
        [
            (5, ("random bytes", randomBytes)),
            (7, ("truncated", truncated)),
            (10, ("byte mutations", byteMutations)),
            (6, ("invalid UTF-8 in a string", { random, example in self.rawBytesInString(&random, example, FuzzValues.invalidUTF8) })),
            (5, ("raw control character in a string", { random, example in
                self.rawBytesInString(&random, example, (0..<0x20).map { [UInt8($0)] })
            })),
            (6, ("odd header string", oddHeaderString)),
            (6, ("header field removed or null", headerFieldRemoved)),
            (7, ("header field of the wrong kind", headerFieldWrongKind)),
            (6, ("version", version)),
            (4, ("sequence", sequence)),
            (7, ("unknown fields", unknownFields)),
            (8, ("payload field removed, null or wrong kind", payloadField)),
            (5, ("nested payload value changed", nestedPayload)),
            (6, ("deep nesting", deepNesting)),
            (3, ("not an object", notAnObject)),
            (2, ("whitespace", whitespace)),
            (2, ("duplicate header key", duplicateKey)),
            (7, ("mixed", mixed)),
        ]
    }

    func makeCase(_ random: inout FuzzRandom) -> DecoderCase {
        let example = random.pick(examples)
        let strategy = random.weighted(strategies)
        var fuzzCase = strategy.make(&random, example)
        fuzzCase.strategy = strategy.name
        return fuzzCase
    }

    // MARK: Strategies

    private func make(_ example: Example, _ json: FuzzJSON, _ expected: DecoderExpectation, _ steps: [String]) -> DecoderCase {
        DecoderCase(strategy: "", type: example.type, steps: steps, bytes: json.bytes, expected: expected)
    }

    private func randomBytes(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        let count = random.pick([0, 1, 2, 3, 8, 64, 512, random.size(upTo: 70_000)])
        let bytes: [UInt8]
        if random.chance(0.5) {
            bytes = random.bytes(count)
        } else {
            let alphabet = Array(#"{}[]":,0123456789.eE+- truefalsn\u"#.utf8)
            bytes = (0..<count).map { _ in random.pick(alphabet) }
        }
        // A JSON envelope needs its fields; no random bytes have them.
        return DecoderCase(strategy: "", type: example.type, steps: ["\(count) bytes"], bytes: bytes, expected: .headerRejected(.invalidMessage))
    }

    private func truncated(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        let whole = example.json.bytes
        let length = random.int(0..<whole.count)
        var bytes = Array(whole[..<length])
        var steps = ["cut to \(length) of \(whole.count) bytes"]
        if random.chance(0.3) {
            // An unfinished document that ends inside deep nesting.
            let depth = FuzzValues.nestingDepth(&random)
            bytes += [UInt8](repeating: UInt8(ascii: random.chance(0.8) ? "[" : "{"), count: depth)
            steps.append("then \(depth) open brackets")
        }
        return DecoderCase(strategy: "", type: example.type, steps: steps, bytes: bytes, expected: .headerRejected(.invalidMessage))
    }

    private func byteMutations(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        var bytes = example.json.bytes
        let steps = (0..<random.int(1...4)).map { _ in FuzzValues.mutate(&bytes, &random) }
        return DecoderCase(strategy: "", type: example.type, steps: steps, bytes: bytes, expected: .anything)
    }

    /// Splices `sequences` raw into a string value (or key) anywhere in the document: not JSON.
    private func rawBytesInString(_ random: inout FuzzRandom, _ example: Example, _ sequences: [[UInt8]]) -> DecoderCase {
        let inner = random.pick(sequences)
        let paths = example.json.paths { $0.kind == .string }
        let path = random.pick(paths)
        let original = example.json.value(at: path)?.stringValue ?? ""
        let cut = original.utf8.count == 0 ? 0 : random.int(0...original.utf8.count)
        let prefix = String(decoding: Array(original.utf8)[..<cut], as: UTF8.self)
        let suffix = String(decoding: Array(original.utf8)[cut...], as: UTF8.self)
        // Only splice at a character boundary, so the rest stays valid UTF-8.
        let safePrefix = prefix.utf8.count == cut ? prefix : ""
        let json = example.json.replacing(path, with: FuzzValues.rawString(safePrefix, inner, suffix))
        // The decoder reads (and checks) strings only when it decodes them: a bad string in the
        // payload passes the header and fails the payload.
        let expected: DecoderExpectation = path.first == .key("payload") ? .payloadRejected : .headerRejected(.invalidMessage)
        return make(example, json, expected, ["\(fuzzPreview(inner)) into \(path.pathText)"])
    }

    /// Header strings are free-form for the decoder: any valid JSON string is accepted.
    private func oddHeaderString(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        let keys = example.json.keys.filter { example.json[$0]?.kind == .string }
        let key = random.pick(keys)
        let value = random.chance(0.1)
            ? String(repeating: random.pick(["a", "\u{0}", "가", "\\"]), count: random.pick([10_000, 70_000, 200_000]))
            : FuzzValues.string(&random)
        let json = example.json.setting(key, .string(value))
        return make(example, json, .accepted, ["\(key) = \(fuzzPreview(Array(value.utf8), limit: 40))"])
    }

    private func headerFieldRemoved(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        let key = random.pick(example.json.keys)
        let remove = random.chance(0.5)
        let json = example.json.setting(key, remove ? nil : .null)
        let expected: DecoderExpectation =
            if !requiredHeader.contains(key) { .accepted }
            else if key == "payload" { remove ? .payloadRejected : .anything }  // a fieldless payload decodes from null
            else { .headerRejected(.invalidMessage) }
        return make(example, json, expected, ["\(key) \(remove ? "removed" : "null")"])
    }

    private func headerFieldWrongKind(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        let key = random.pick(example.json.keys)
        let kind = example.json[key]?.kind ?? .null
        let json = example.json.setting(key, FuzzValues.value(notOf: kind, &random))
        // A payload type without fields decodes from anything; every header field has one kind.
        let expected: DecoderExpectation = key == "payload" ? .anything : .headerRejected(.invalidMessage)
        return make(example, json, expected, ["\(key): \(kind) → \(json[key]?.kind ?? .null)"])
    }

    private func version(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        let table: [(String, DecoderExpectation)] = [
            ("1", .accepted), ("1.0", .accepted), ("1e0", .accepted),
            ("0", .headerRejected(.unsupportedVersion)), ("2", .headerRejected(.unsupportedVersion)),
            ("-1", .headerRejected(.unsupportedVersion)), ("-0", .headerRejected(.unsupportedVersion)),
            ("9223372036854775807", .headerRejected(.unsupportedVersion)),
            ("-9223372036854775808", .headerRejected(.unsupportedVersion)),
            ("1.5", .headerRejected(.invalidMessage)), ("9223372036854775808", .headerRejected(.invalidMessage)),
            ("1e400", .headerRejected(.invalidMessage)), ("18446744073709551616", .headerRejected(.invalidMessage)),
        ]
        var (literal, expected) = random.pick(table)
        if random.chance(0.3) {
            let value = Int64.random(in: .min ... .max, using: &random)
            (literal, expected) = (String(value), value == 1 ? .accepted : .headerRejected(.unsupportedVersion))
        }
        return make(example, example.json.setting("version", .number(literal)), expected, ["version \(literal)"])
    }

    private func sequence(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        let table: [(String, DecoderExpectation)] = [
            ("0", .accepted), ("-0", .accepted), ("1.0", .accepted), ("18446744073709551615", .accepted),
            ("9223372036854775808", .accepted), ("-1", .headerRejected(.invalidMessage)),
            ("18446744073709551616", .headerRejected(.invalidMessage)), ("1.5", .headerRejected(.invalidMessage)),
            ("1e400", .headerRejected(.invalidMessage)), ("-9223372036854775808", .headerRejected(.invalidMessage)),
        ]
        var (literal, expected) = random.pick(table)
        if random.chance(0.3) {
            (literal, expected) = (String(random.next()), .accepted)
        }
        return make(example, example.json.setting("sequence", .number(literal)), expected, ["sequence \(literal)"])
    }

    /// Fields nobody declared are ignored, in the envelope and in the payload.
    private func unknownFields(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        var json = example.json
        var steps: [String] = []
        for _ in 0..<random.int(1...4) {
            let inPayload = random.chance(0.5) && json["payload"]?.kind == .object
            let taken = inPayload ? example.declaredPayload.union(json["payload"]?.keys ?? []) : declaredHeader.union(json.keys)
            let key = random.chance(0.2) ? random.pick(["", "__proto__", "constructor", "\u{0}", "Version", "PAYLOAD", "🙂"]) : FuzzValues.string(&random)
            guard !taken.contains(key) else { continue }
            let value: FuzzJSON = random.chance(0.1)
                ? FuzzValues.nesting(depth: random.int(1...400), objects: random.chance(0.5), closed: true)
                : FuzzValues.value(&random, depth: 3)
            if inPayload {
                json = json.replacing([.key("payload"), .key(key)], with: value)
            } else {
                json.set(key, value)
            }
            steps.append("+\(inPayload ? "payload." : "")\(fuzzPreview(Array(key.utf8), limit: 30))")
        }
        return make(example, json, .accepted, steps)
    }

    private func payloadField(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        let keys = example.json["payload"]?.keys ?? []
        guard !keys.isEmpty else { return unknownFields(&random, example) }
        let key = random.pick(keys)
        let required = example.requiredPayload.contains(key)
        let path: [FuzzJSON.Step] = [.key("payload"), .key(key)]
        switch random.int(0..<3) {
        case 0:
            return make(example, example.json.replacing(path, with: nil), required ? .payloadRejected : .accepted, ["payload.\(key) removed"])
        case 1:
            return make(example, example.json.replacing(path, with: .null), required ? .payloadRejected : .accepted, ["payload.\(key) null"])
        default:
            let kind = example.json.value(at: path)?.kind ?? .null
            let json = example.json.replacing(path, with: FuzzValues.value(notOf: kind, &random))
            return make(example, json, .payloadRejected, ["payload.\(key): \(kind) → \(json.value(at: path)?.kind ?? .null)"])
        }
    }

    private func nestedPayload(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        let paths = example.json.paths().filter { $0.count >= 2 && $0.first == .key("payload") }
        guard !paths.isEmpty else { return payloadField(&random, example) }
        let path = random.pick(paths)
        let replacement: FuzzJSON? = random.chance(0.3) ? nil : FuzzValues.value(&random)
        let json = example.json.replacing(path, with: replacement)
        return make(example, json, .anything, ["\(path.pathText) \(replacement == nil ? "removed" : "= \(replacement!.kind)")"])
    }

    private func deepNesting(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        let depth = FuzzValues.nestingDepth(&random)
        let objects = random.chance(0.4)
        let closed = random.chance(0.6)
        let nesting = FuzzValues.nesting(depth: depth, objects: objects, closed: closed)
        let what = "\(depth) nested \(objects ? "objects" : "arrays")\(closed ? "" : ", unclosed")"
        switch random.int(0..<3) {
        case 0:
            return make(example, nesting, .headerRejected(.invalidMessage), ["the body is \(what)"])
        default:
            let inPayload = random.chance(0.5)
            let path: [FuzzJSON.Step] = inPayload ? [.key("payload"), .key("zz")] : [.key("zz")]
            let json = example.json.replacing(path, with: nesting)
            let levels = path.count + depth  // the envelope (and payload) objects count too
            let expected: DecoderExpectation =
                !closed ? .headerRejected(.invalidMessage)
                : levels <= 500 ? .accepted
                : levels >= 520 ? .headerRejected(.invalidMessage) : .anything
            return make(example, json, expected, ["\(path.pathText) is \(what)"])
        }
    }

    private func notAnObject(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        let kind = random.pick([FuzzJSON.Kind.null, .bool, .number, .string, .array])
        var value = FuzzValues.value(of: kind, &random)
        if kind == .array, random.chance(0.5) { value = .array([example.json]) }
        return make(example, value, .headerRejected(.invalidMessage), ["a top-level \(kind)"])
    }

    private func whitespace(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        let blanks = Array(" \t\r\n".utf8)
        let before = (0..<random.int(0...50)).map { _ in random.pick(blanks) }
        let after = (0..<random.int(0...50)).map { _ in random.pick(blanks) }
        return DecoderCase(strategy: "", type: example.type, steps: ["\(before.count) before, \(after.count) after"],
                           bytes: before + example.json.bytes + after, expected: .accepted)
    }

    private func duplicateKey(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        var json = example.json
        let key = random.pick(json.keys)
        json.append(key, random.chance(0.5) ? FuzzValues.value(&random) : json[key] ?? .null)
        return make(example, json, .anything, ["\(key) twice"])
    }

    private func mixed(_ random: inout FuzzRandom, _ example: Example) -> DecoderCase {
        var json = example.json
        var steps: [String] = []
        for _ in 0..<random.int(2...4) {
            let paths = json.paths()
            guard !paths.isEmpty else { break }
            let path = random.pick(paths)
            switch random.int(0..<3) {
            case 0:
                json = json.replacing(path, with: nil)
                steps.append("\(path.pathText) removed")
            case 1:
                json = json.replacing(path, with: FuzzValues.value(&random))
                steps.append("\(path.pathText) replaced")
            default:
                json = json.replacing(path, with: .string(FuzzValues.string(&random)))
                steps.append("\(path.pathText) = a string")
            }
        }
        var bytes = json.bytes
        if random.chance(0.4) { steps.append(FuzzValues.mutate(&bytes, &random)) }
        return DecoderCase(strategy: "", type: example.type, steps: steps, bytes: bytes, expected: .anything)
    }
}

// MARK: - Oracle

enum DecoderOracle {
    /// Decodes the case as a service would and lists what went wrong.
    static func check(_ fuzzCase: DecoderCase, entry: WireCatalog.Entry) -> (DecoderOutcome, [String]) {
        var problems: [String] = []
        let body = Data(fuzzCase.bytes)
        let message: Message
        do throws(ServiceError) {
            message = try Message(body: body)
        } catch {
            problems += checkError(error, allowed: [.invalidMessage, .unsupportedVersion], where: "header")
            switch fuzzCase.expected {
            case .headerRejected(let code) where code == error.code: break
            case .anything: break
            default: problems.append("expected \(fuzzCase.expected), the header was refused: \(error)")
            }
            return (error.code == .unsupportedVersion ? .unsupportedVersion : .invalidMessage, problems)
        }

        if message.header.version != EnvelopeHeader.currentVersion {
            problems.append("a message of version \(message.header.version) was accepted")
        }
        _ = message.serviceError
        // A reply to whatever was read can always be made and read back.
        let reply = message.errorReply(ServiceError(.internalError, "fuzz"), source: "fuzz")
        if (try? Message(body: reply.body))?.header.correlationId != message.header.id {
            problems.append("the error reply to it does not carry its id")
        }

        do throws(ServiceError) {
            try entry.decodePayload(message)
        } catch {
            problems += checkError(error, allowed: [.invalidMessage], where: "payload")
            switch fuzzCase.expected {
            case .payloadRejected, .anything: break
            default: problems.append("expected \(fuzzCase.expected), the payload was refused: \(error)")
            }
            return (.payloadRejected, problems)
        }
        switch fuzzCase.expected {
        case .accepted, .anything: break
        default: problems.append("expected \(fuzzCase.expected), it was accepted")
        }
        // What was accepted re-encodes, and the re-encoding is stable.
        do {
            let once = try entry.roundTrip(body)
            let twice = try entry.roundTrip(once)
            if once != twice { problems.append("re-encoding is not stable") }
        } catch {
            problems.append("accepted, but it does not round-trip: \(error)")
        }
        return (.accepted, problems)
    }

    /// A refusal must carry a documented code and a message, and survive the trip as an error reply.
    private static func checkError(_ error: ServiceError, allowed: Set<ErrorCode>, where part: String) -> [String] {
        var problems: [String] = []
        if !allowed.contains(error.code) { problems.append("\(part): code \(error.code) is not one of \(allowed.map(\.rawValue).sorted())") }
        if error.message.isEmpty { problems.append("\(part): an error without a message") }
        let reply = Message.errorReply(error, correlationId: nil, source: "fuzz")
        if (try? Message(body: reply.body))?.serviceError != error {
            problems.append("\(part): the error does not survive an error reply")
        }
        return problems
    }
}
