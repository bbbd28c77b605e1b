import Foundation
import FuzzKit
import Messaging
import OnboardingAPI
import OnboardingClient
import OnboardingTesting
import Synchronization
import Testing

/// Fuzzes every endpoint of the whole system, running in this process on an ``InProcessBus``.
///
/// Requests are made from `proto/examples` (so every request type the wire knows is covered, new
/// ones included, with no list here to keep up to date): the example's payload mutated, its
/// envelope mutated, sessions and service tokens right, wrong or missing, random binary frames,
/// unknown types and bytes that are not JSON at all. Which service answers which type is found
/// out at the start by asking each one.
///
/// Every request must be answered (no timeout) with either the success reply of its type, shaped
/// as its reply schema says, or an `error` reply with a code `error.schema.json` documents; a
/// request that needs a credential succeeds only with a valid one, and one made with a session
/// acts for that session's person whatever `uid` says. Afterwards every service still answers
/// `health`, and a new person can sign in and set up a profile.
///
/// Deterministic inputs for a seed (`FUZZ_SEED`, `FUZZ_ITERATIONS`, `FUZZ_TRACE`; see
/// ``FuzzSettings``); the services' own state (sessions, profiles) makes replies vary.
@Suite("Fuzz: every endpoint of the running system", .timeLimit(.minutes(30)))
struct EndpointFuzzTests {
    static let settings = FuzzSettings.fromEnvironment("endpoints", defaultIterations: 2_000, defaultSeed: 0xE4D9_0147)

    @Test("Mutated requests to every endpoint get a typed reply, and the system keeps working")
    func fuzzEndpoints() async throws {
        let settings = Self.settings
        print("[fuzz] \(settings)")
        let contract = try WireContract.load()
        try await InProcessSystem.run { system in
            let fuzzer = EndpointFuzzer(
                bus: system.bus, endpoints: system.endpoints, contract: contract, settings: settings,
                serviceToken: system.serviceToken)
            try await fuzzer.discoverRoutes()
            try await fuzzer.run()
            let report = fuzzer.report
            print("[fuzz] endpoints: \(report.summary)")
            #expect(report.failures.isEmpty, "\(report.failures.count) failing cases; first: \(report.failures.prefix(10))")
            if settings.iterations >= 1_000 {
                #expect(report.succeeded > 0, "no request succeeded: the fuzzer only scratches the surface")
            }

            // The system still works.
            for (name, endpoint) in system.endpoints.rpcEndpoints {
                let health = try await system.bus.call(HealthCheck(), to: endpoint, source: "fuzz-after")
                #expect(health.status == "ok", "\(name) answers health after fuzzing")
            }
            let app = system.endpoints.client(system.bus, name: "after-fuzzing")
            let signedIn = try await app.signIn(provider: .kakao, subject: "after-fuzzing-\(UUID().uuidString)")
            #expect(try await app.checkNow().intent == .presentProfileSetup)
            let username = "af\(Int.random(in: 100_000...999_999))"
            let profile = try await app.setUpProfile(username: username, image: pngBytes, contentType: "image/png")
            #expect(profile.uid == signedIn.uid && profile.username == username)
            #expect(try await app.profile() == profile)
        }
    }
}

// MARK: - What proto/ says

/// The request types, their examples and reply shapes, and the error codes, read from `proto/`.
struct WireContract: Sendable {
    struct RequestType: Sendable {
        var type: String
        var example: FuzzJSON
        /// The reply payload's declared and required properties (`<type>.reply.schema.json`).
        var replyProperties: Set<String>
        var replyRequired: Set<String>
        /// The example carries a session or the service token: the request needs a credential.
        var needsCredential: Bool
        /// The example carries a session: with a valid one, the request acts for its person.
        var takesSession: Bool
    }

    var requests: [RequestType]
    /// Every other type the wire knows (replies, events, `error`): not requests.
    var otherTypes: [String]
    /// The codes a service sends (`error.schema.json`).
    var errorCodes: Set<String>
    /// Values in the examples that stand for the caller: replaced by the fuzzer's own.
    var exampleUIDs: Set<String>
    var exampleSessionTokens: Set<String>

    static let packageRoot: URL = {
        var folder = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while folder.path != "/" {
            if FileManager.default.fileExists(atPath: folder.appendingPathComponent("Package.swift").path) { return folder }
            folder.deleteLastPathComponent()
        }
        fatalError("No Package.swift above \(#filePath)")
    }()

    static func load() throws -> WireContract {
        let proto = packageRoot.appendingPathComponent("proto")
        func json(_ folder: String, _ file: String) throws -> FuzzJSON {
            try FuzzJSON.parse(Data(contentsOf: proto.appendingPathComponent(folder).appendingPathComponent(file)))
        }
        let files = try FileManager.default.contentsOfDirectory(atPath: proto.appendingPathComponent("examples").path)
        let types = files.filter { $0.hasSuffix(".json") }.map { String($0.dropLast(".json".count)) }.sorted()
        let typeSet = Set(types)
        var requests: [RequestType] = []
        for type in types where typeSet.contains(type + ".reply") {
            let example = try json("examples", type + ".json")
            let replySchema = try json("schemas", type + ".reply.schema.json")
            requests.append(RequestType(
                type: type, example: example,
                replyProperties: Set(replySchema["properties"]?.keys ?? []),
                replyRequired: Set(replySchema["required"]?.arrayValue?.compactMap(\.stringValue) ?? []),
                needsCredential: example["sessionToken"] != nil || example["serviceToken"] != nil,
                takesSession: example["sessionToken"] != nil))
        }
        let requestTypes = Set(requests.map(\.type))
        let errorSchema = try json("schemas", "error.schema.json")
        let codes = errorSchema["properties"]?["code"]?["examples"]?.arrayValue?.compactMap(\.stringValue) ?? []
        let examples = try types.map { try json("examples", $0 + ".json") }
        return WireContract(
            requests: requests, otherTypes: types.filter { !requestTypes.contains($0) }, errorCodes: Set(codes),
            exampleUIDs: Set(examples.compactMap { $0["uid"]?.stringValue }),
            exampleSessionTokens: Set(examples.compactMap { $0["sessionToken"]?.stringValue }))
    }
}

// MARK: - The fuzzer

/// Generates, sends and judges the requests. Threading: any task; state behind mutexes.
final class EndpointFuzzer: Sendable {
    struct Person: Sendable {
        var uid: String
        var sessionToken: String
    }

    struct Report: Sendable {
        var sent: [String: Int] = [:]
        var outcomes: [String: [String: Int]] = [:]
        var succeeded = 0
        var failures: [String] = []

        var summary: String {
            let total = sent.values.reduce(0, +)
            let lines = sent.keys.sorted().map { type in
                let outcomes = (outcomes[type] ?? [:]).sorted { $0.value > $1.value }.map { "\($0.key) \($0.value)" }
                return "  \(type): \(sent[type]!) (\(outcomes.joined(separator: ", ")))"
            }
            return "\(total) requests, \(succeeded) succeeded, \(failures.count) failing\n" + lines.joined(separator: "\n")
        }
    }

    /// How a case was built, for judging its reply and for failure messages.
    struct Built: Sendable {
        var index: Int
        var endpoint: Endpoint
        var body: Data
        var attachment: Data?
        var steps: [String]
        /// What was made from a request type's example (nil: garbage or an unknown type).
        var requestType: WireContract.RequestType?
        /// The person whose valid session the envelope carries, if any.
        var sessionOf: Person?
        var validServiceToken: Bool
    }

    let bus: InProcessBus
    let endpoints: SystemEndpoints
    let contract: WireContract
    let settings: FuzzSettings
    let serviceToken: String
    /// Which endpoints answer each request type (found by ``discoverRoutes()``).
    private let routes = Mutex<[String: [Endpoint]]>([:])
    /// Request types that refuse a binary frame (found by ``discoverRoutes()``): most cases send
    /// them none, so that their handlers are reached.
    private let takeNoFrame = Mutex<Set<String>>([])
    private let people = Mutex<[Person]>([])
    private let state = Mutex(Report())
    static let peopleCount = 4
    static let batchSize = 32
    static let timeout: Duration = .seconds(10)
    /// Codes the bus itself answers for requests it cannot hand to a service.
    static let busCodes: Set<ErrorCode> = [.invalidMessage, .unsupportedVersion, .messageTooLarge, .unexpectedFrames]

    init(bus: InProcessBus, endpoints: SystemEndpoints, contract: WireContract, settings: FuzzSettings, serviceToken: String) {
        self.bus = bus
        self.endpoints = endpoints
        self.contract = contract
        self.settings = settings
        self.serviceToken = serviceToken
    }

    var report: Report { state.withLock { $0 } }

    private var allEndpoints: [Endpoint] { endpoints.rpcEndpoints.map(\.1) }

    // MARK: Set-up

    /// Signs the fuzzer's people in (again): fresh sessions, whatever the last batch did to them.
    private func signInPeople() async throws {
        var signedIn: [Person] = []
        for number in 0..<Self.peopleCount {
            let app = endpoints.client(bus, name: "fuzz")
            let result = try await app.signIn(provider: .google, subject: "fuzz-person-\(number)")
            signedIn.append(Person(uid: result.uid, sessionToken: result.sessionToken))
        }
        people.withLock { $0 = signedIn }
    }

    /// Asks every endpoint about every request type with the example as it is (and valid
    /// credentials): an endpoint answers a type when the reply is not `unknownType`. Then asks
    /// each with a binary frame: `unexpectedFrames` means the type takes none.
    func discoverRoutes() async throws {
        let app = endpoints.client(bus, name: "fuzz-discovery")
        let me = try await app.signIn(provider: .apple, subject: "fuzz-discovery")
        var found: [String: [Endpoint]] = [:]
        var noFrame: Set<String> = []
        for request in contract.requests {
            var envelope = request.example.setting("uid", .string(me.uid))
            envelope.set("sessionToken", .string(me.sessionToken))
            envelope.set("serviceToken", .string(serviceToken))
            func ask(_ endpoint: Endpoint, attachment: Data? = nil) async throws -> ErrorCode? {
                let body = envelope.setting("id", .string(UUID().uuidString.lowercased())).data
                let reply = try await bus.request(OutgoingMessage(body: body, attachment: attachment), to: endpoint, timeout: Self.timeout)
                return reply.serviceError?.code
            }
            for endpoint in allEndpoints where try await ask(endpoint) != .unknownType {
                found[request.type, default: []].append(endpoint)
                if try await ask(endpoint, attachment: Data(FuzzValues.imageHeads[0] + [0, 0])) == .unexpectedFrames {
                    noFrame.insert(request.type)
                }
            }
        }
        routes.withLock { $0 = found }
        takeNoFrame.withLock { $0 = noFrame }
        let table = contract.requests.map { "\($0.type) → \(found[$0.type]?.map(\.rawValue).joined(separator: ", ") ?? "none")" }
        print("[fuzz] endpoints: routes found: \(table.joined(separator: "; "))")
    }

    // MARK: Running

    func run() async throws {
        var next = 0
        while next < settings.iterations {
            try await signInPeople()
            let batch = next..<min(settings.iterations, next + Self.batchSize)
            let people = self.people.withLock { $0 }
            let routes = self.routes.withLock { $0 }
            let takeNoFrame = self.takeNoFrame.withLock { $0 }
            await withTaskGroup(of: Void.self) { group in
                for index in batch {
                    let built = build(index, people: people, routes: routes, takeNoFrame: takeNoFrame)
                    settings.traceCase(index, "\(built.steps.joined(separator: "; ")) → \(built.endpoint)")
                    group.addTask { await self.send(built) }
                }
            }
            next = batch.upperBound
        }
    }

    private func send(_ built: Built) async {
        let label = built.requestType?.type ?? "(other)"
        let (outcome, problems): (String, [String])
        do {
            let reply = try await bus.request(
                OutgoingMessage(body: built.body, attachment: built.attachment), to: built.endpoint, timeout: Self.timeout)
            (outcome, problems) = judge(reply, built)
        } catch {
            (outcome, problems) = ("no reply", ["no reply: \(error)"])
        }
        state.withLock { report in
            report.sent[label, default: 0] += 1
            report.outcomes[label, default: [:]][outcome, default: 0] += 1
            if outcome == "ok" { report.succeeded += 1 }
            if !problems.isEmpty {
                report.failures.append("""
                    \(settings.label(built.index)) [\(built.steps.joined(separator: "; "))] to \(built.endpoint): \
                    \(problems.joined(separator: "; ")); body \(fuzzPreview(built.body, limit: 300))
                    """)
            }
        }
    }

    /// Checks a reply against the request; returns the outcome's name and any problems.
    private func judge(_ reply: Message, _ built: Built) -> (String, [String]) {
        var problems: [String] = []
        let sent = try? Message(body: built.body)
        let correlation = reply.header.correlationId
        // A request that could not be read is still named by its id when one can be read alone.
        if let correlation, correlation != (sent?.header.id ?? Message.requestID(in: built.body)) {
            problems.append("the reply answers \(correlation), not the request")
        }
        if reply.header.type == ServiceError.messageType {
            let error: ServiceError
            do throws(ServiceError) {
                error = try reply.payload(as: ServiceError.self)
            } catch {
                return ("unreadable error", ["an error reply whose payload is not an error: \(error)"])
            }
            if !contract.errorCodes.contains(error.code.rawValue) {
                problems.append("undocumented error code \(error.code): \(error.message)")
            }
            if error.message.isEmpty { problems.append("an error without a message") }
            if sent == nil, !Self.busCodes.contains(error.code) {
                problems.append("a request the bus cannot read was answered with \(error.code)")
            }
            if correlation == nil, !Self.busCodes.contains(error.code) {
                problems.append("the \(error.code) reply does not name the request")
            }
            return (error.code.rawValue, problems)
        }

        // A success: only to a request that was read, of a type that has a reply.
        guard let sent else {
            return ("ok", ["a request that is not an envelope was answered with \(reply.header.type)"])
        }
        guard let request = contract.requests.first(where: { $0.type == sent.header.type }) else {
            return ("ok", ["\(sent.header.type) is no request type, yet it was answered with \(reply.header.type)"])
        }
        if reply.header.type != request.type + ".reply" {
            problems.append("\(request.type) was answered with \(reply.header.type)")
        }
        if correlation == nil { problems.append("the reply does not name the request") }
        if let payload = try? FuzzJSON.parse(reply.body)["payload"], payload.kind == .object {
            let keys = Set(payload.keys)
            if !keys.isSubset(of: request.replyProperties) {
                problems.append("reply fields \(keys.subtracting(request.replyProperties).sorted()) are not in its schema")
            }
            if !request.replyRequired.isSubset(of: keys) {
                problems.append("reply lacks \(request.replyRequired.subtracting(keys).sorted())")
            }
        } else {
            problems.append("the reply has no payload object")
        }
        // Access: a request that needs a credential succeeds only with a valid one, and one with a
        // valid session acts for that session's person whatever its uid says.
        if request.needsCredential, built.sessionOf == nil, !built.validServiceToken {
            problems.append("\(request.type) succeeded without a valid session or service token")
        }
        if request.takesSession, let person = built.sessionOf, reply.header.uid != person.uid {
            problems.append("\(request.type) with \(person.uid)'s session acted for \(reply.header.uid ?? "nobody")")
        }
        return ("ok", problems)
    }

    // MARK: Making requests

    /// Builds case `index` from its own random stream.
    private func build(_ index: Int, people: [Person], routes: [String: [Endpoint]], takeNoFrame: Set<String>) -> Built {
        var random = FuzzRandom(seed: settings.seed, case: index)
        let person = random.pick(people)
        let other = random.pick(people)
        var built = Built(
            index: index, endpoint: random.pick(allEndpoints), body: Data(), steps: [], requestType: nil,
            sessionOf: nil, validServiceToken: false)

        switch random.weighted([(86, 0), (6, 1), (8, 2)]) {
        case 1:
            // A type nobody answers as a request, on any endpoint.
            let request = random.pick(contract.requests)
            let type = random.chance(0.5)
                ? random.pick(contract.otherTypes + ["", "HEALTH", "health ", "no.such.type", "profile.get\u{0}", "auth.", "."])
                : FuzzValues.string(&random)
            var envelope = request.example.setting("type", .string(type))
            envelope.set("id", .string(random.uuid()))
            built.body = envelope.data
            built.steps = ["type \(fuzzPreview(Array(type.utf8), limit: 40)) on \(request.type)'s example"]
        case 2:
            // Not an envelope at all.
            let request = random.pick(contract.requests)
            var bytes = request.example.bytes
            switch random.int(0..<4) {
            case 0:
                bytes = random.bytes(random.size(upTo: 2_000))
                built.steps = ["\(bytes.count) random bytes"]
            case 1:
                bytes = Array(bytes[..<random.int(0..<bytes.count)])
                built.steps = ["\(request.type) cut to \(bytes.count) bytes"]
            case 2:
                bytes = Array(repeating: UInt8(ascii: "["), count: FuzzValues.nestingDepth(&random))
                built.steps = ["\(bytes.count) open brackets"]
            default:
                built.steps = (0..<random.int(1...3)).map { _ in FuzzValues.mutate(&bytes, &random) }
            }
            built.body = Data(bytes)
        default:
            let request = random.pick(contract.requests)
            built.requestType = request
            if let answering = routes[request.type], !answering.isEmpty, random.chance(0.9) {
                built.endpoint = random.pick(answering)
            }
            built.steps = ["\(request.type)"]
            built.body = makeRequest(request, person: person, other: other, &random, &built)
        }
        if random.chance(takeNoFrame.contains(built.requestType?.type ?? "") ? 0.05 : 0.6) {
            built.attachment = random.chance(0.005)
                ? Data(count: 11 * 1024 * 1024)  // beyond every endpoint's limit
                : FuzzValues.attachment(&random)
            built.steps.append("attachment of \(built.attachment!.count) bytes")
        }
        return built
    }

    private func makeRequest(
        _ request: WireContract.RequestType, person: Person, other: Person, _ random: inout FuzzRandom, _ built: inout Built
    ) -> Data {
        var envelope = request.example
        envelope.set("id", .string(random.uuid()))
        envelope.set("time", .string(Timestamp.now()))
        for key in ["sessionToken", "serviceToken", "uid"] { envelope.set(key, nil) }

        // Credentials: mostly right, often wrong.
        let sessions: [(weight: Int, value: (String, FuzzJSON?))] = [
            (45, ("own session", .string(person.sessionToken))), (5, ("another's session", .string(other.sessionToken))),
            (25, ("no session", nil)), (8, ("forged session", .string(random.uuid()))), (4, ("empty session", .string(""))),
            (6, ("odd session", .string(FuzzValues.string(&random)))), (3, ("null session", .null)),
            (4, ("session of the wrong kind", FuzzValues.value(notOf: .string, &random))),
        ]
        let session = random.weighted(sessions)
        let services: [(weight: Int, value: (String, FuzzJSON?))] = [
            (40, ("service token", .string(serviceToken))), (35, ("no service token", nil)),
            (10, ("forged service token", .string(random.uuid()))), (4, ("empty service token", .string(""))),
            (4, ("service token with a suffix", .string(serviceToken + " "))), (4, ("odd service token", .string(FuzzValues.string(&random)))),
            (3, ("service token of the wrong kind", FuzzValues.value(notOf: .string, &random))),
        ]
        let service = random.weighted(services)
        let uids: [(weight: Int, value: (String, FuzzJSON?))] = [
            (50, ("own uid", .string(person.uid))), (18, ("no uid", nil)), (10, ("random uid", .string(random.uuid()))),
            (5, ("another's uid", .string(other.uid))), (4, ("empty uid", .string(""))),
            (10, ("odd uid", .string(FuzzValues.string(&random)))), (3, ("uid of the wrong kind", FuzzValues.value(notOf: .string, &random))),
        ]
        let uid = random.weighted(uids)
        if let value = session.1 { envelope.set("sessionToken", value) }
        if let value = service.1 { envelope.set("serviceToken", value) }
        if let value = uid.1 { envelope.set("uid", value) }
        built.steps += [session.0, service.0, uid.0]
        if case .string(person.sessionToken)? = session.1 { built.sessionOf = person }
        if case .string(other.sessionToken)? = session.1 { built.sessionOf = other }
        if case .string(serviceToken)? = service.1 { built.validServiceToken = true }

        // The payload: the example's, speaking of the caller, then (often) mutated.
        let callerUID = uid.1?.stringValue ?? person.uid
        var payload = (envelope["payload"] ?? .object([])).mappingStrings { text in
            var text = text
            for exampleUID in contract.exampleUIDs { text = text.replacingOccurrences(of: exampleUID, with: callerUID) }
            for token in contract.exampleSessionTokens { text = text.replacingOccurrences(of: token, with: person.sessionToken) }
            return text
        }
        if random.chance(0.55) {
            for _ in 0..<random.int(1...3) {
                built.steps.append(mutatePayload(&payload, &random))
            }
        }
        envelope.set("payload", payload)

        // The envelope itself, sometimes.
        var bytes: [UInt8]
        if random.chance(0.12) {
            let key = random.pick(envelope.keys)
            switch random.int(0..<7) {
            case 0:
                envelope.set(key, nil)
                built.steps.append("no \(key)")
            case 1:
                envelope.set(key, FuzzValues.value(notOf: envelope[key]?.kind ?? .null, &random))
                built.steps.append("\(key) of the wrong kind")
            case 2:
                let version = random.pick(["0", "2", "-1", "1.5", "1e400", "9223372036854775808"])
                envelope.set("version", .number(version))
                built.steps.append("version \(version)")
            case 3:
                envelope.set(FuzzValues.string(&random), FuzzValues.value(&random, depth: 3))
                built.steps.append("an unknown field")
            case 4:
                envelope.set("padding", .string(String(repeating: "x", count: 70 * 1024)))
                built.steps.append("an envelope over 64 KiB")
            case 5:
                envelope.append(key, FuzzValues.value(&random))
                built.steps.append("\(key) twice")
            default:
                envelope.set("zz", FuzzValues.nesting(depth: FuzzValues.nestingDepth(&random), objects: random.chance(0.5), closed: random.chance(0.5)))
                built.steps.append("deep nesting")
            }
        }
        bytes = envelope.bytes
        if random.chance(0.04) {
            built.steps.append(FuzzValues.mutate(&bytes, &random))
        }
        return Data(bytes)
    }

    /// One change to a payload; returns what it did.
    private func mutatePayload(_ payload: inout FuzzJSON, _ random: inout FuzzRandom) -> String {
        let paths = payload.paths()
        switch random.int(0..<8) {
        case 0 where !paths.isEmpty:
            let path = random.pick(paths)
            payload = payload.replacing(path, with: nil)
            return "payload\(path.pathText.dropFirst()) removed"
        case 1 where !paths.isEmpty:
            let path = random.pick(paths)
            payload = payload.replacing(path, with: .null)
            return "payload\(path.pathText.dropFirst()) null"
        case 2 where !paths.isEmpty:
            let path = random.pick(paths)
            payload = payload.replacing(path, with: FuzzValues.value(notOf: payload.value(at: path)?.kind ?? .null, &random))
            return "payload\(path.pathText.dropFirst()) of the wrong kind"
        case 3...4 where !payload.paths(where: { $0.kind == .string }).isEmpty:
            let path = random.pick(payload.paths { $0.kind == .string })
            let value = FuzzValues.string(&random)
            payload = payload.replacing(path, with: .string(value))
            return "payload\(path.pathText.dropFirst()) = \(fuzzPreview(Array(value.utf8), limit: 30))"
        case 5 where !payload.paths(where: { $0.kind == .number }).isEmpty:
            let path = random.pick(payload.paths { $0.kind == .number })
            let value = FuzzValues.number(&random)
            payload = payload.replacing(path, with: .number(value))
            return "payload\(path.pathText.dropFirst()) = \(value)"
        case 6:
            let key = FuzzValues.string(&random)
            payload.set(key, FuzzValues.value(&random))
            return "payload + unknown field"
        default:
            payload = random.chance(0.5) ? .object([]) : FuzzValues.value(&random)
            return "payload = \(payload.kind)"
        }
    }
}
