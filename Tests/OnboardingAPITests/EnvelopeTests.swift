import Foundation
import Messaging
import FuzzKit
import OnboardingAPI
import Testing

@Suite("Envelope")
struct EnvelopeTests {
    @Test("Every header field survives a round trip, beside the payload")
    func headerRoundTrip() throws {
        let header = EnvelopeHeader(
            version: 1, id: "5a0c1d2e-3f40-4a5b-8c6d-7e8f90a1b2c3", type: RouteIntent.type,
            source: ServiceName.orchestrator, sequence: 42, time: "2026-11-21T05:30:00.123Z",
            correlationId: "7c9e6679-7425-40de-944b-e07fc1f90001", uid: "3f2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40",
            sessionToken: "token")
        let intent = RouteIntent(intentId: "i-1", uid: "3f2b8c1e-6d4a-4b7e-9c2f-1a5e8d7b6c40", intent: .dismiss, reason: .profileCreated)
        let data = try Envelope(header: header, payload: intent).encoded()
        let decoded = try WireFormat.decoder().decode(Envelope<RouteIntent>.self, from: data)
        #expect(decoded.header == header)
        #expect(decoded.payload == intent)

        let message = try Message(body: data)
        #expect(message.header == header)
        #expect(try message.payload(as: RouteIntent.self) == intent)
        // Header fields sit at the top level, beside `payload`.
        let json = try JSONValue.parse(data)
        #expect(json["sequence"] == .int(42))
        #expect(json["payload"]?["intent"] == .string("dismiss"))
    }

    @Test("Absent optional header fields are left out, not written as null")
    func optionalsAreOmitted() throws {
        let data = try Envelope(header: EnvelopeHeader(type: HealthCheck.type, source: "tap"), payload: HealthCheck()).encoded()
        let json = try JSONValue.parse(data)
        #expect(json["correlationId"] == nil && json["uid"] == nil && json["sessionToken"] == nil)
        #expect(json["payload"] == .object([:]))
        #expect(json["version"] == .int(1) && json["sequence"] == .int(0))
    }

    @Test("Unknown top-level fields are ignored")
    func unknownFieldsIgnored() throws {
        let body = #"{"version":1,"id":"5a0c1d2e-3f40-4a5b-8c6d-7e8f90a1b2c3","type":"health","source":"x","sequence":0,"time":"2026-11-21T05:30:00.123Z","priority":"high","payload":{}}"#
        let message = try Message(body: Data(body.utf8))
        #expect(message.header.type == "health")
    }

    static let malformed: [String] = [
        "not json",
        "{",
        "[]",
        #"{"version":1}"#,
        #"{"version":"1","id":"a","type":"health","source":"x","sequence":0,"time":"t","payload":{}}"#,
        #"{"version":1,"id":"a","type":"health","source":"x","sequence":-1,"time":"t","payload":{}}"#,
    ]

    @Test("A body that is not a JSON envelope is invalidMessage", arguments: malformed)
    func malformedIsInvalidMessage(body: String) {
        let error = #expect(throws: ServiceError.self) {
            _ = try Message(body: Data(body.utf8))
        }
        #expect(error?.code == .invalidMessage)
    }

    @Test("Version 2 is unsupportedVersion")
    func version2IsUnsupported() {
        let body = #"{"version":2,"id":"a","type":"health","source":"x","sequence":0,"time":"2026-11-21T05:30:00.123Z","payload":{}}"#
        let error = #expect(throws: ServiceError.self) {
            _ = try Message(body: Data(body.utf8))
        }
        #expect(error?.code == .unsupportedVersion)
    }

    @Test("A payload that does not fit its type is invalidMessage, naming the field")
    func badPayloadIsInvalidMessage() throws {
        let body = #"{"version":1,"id":"a","type":"auth.signIn","source":"x","sequence":0,"time":"2026-11-21T05:30:00.123Z","payload":{"provider":"facebook","subject":"1"}}"#
        let message = try Message(body: Data(body.utf8))
        let error = #expect(throws: ServiceError.self) {
            _ = try message.payload(as: SignIn.self)
        }
        #expect(error?.code == .invalidMessage)
        #expect(error?.message.contains("provider") == true)
    }

    @Test("An error reply carries a ServiceError and answers the request's id")
    func errorReply() throws {
        let request = try Message(body: Proto.exampleData("onboarding.setUpProfile"))
        let reply = request.errorReply(.username(.duplicated), source: ServiceName.orchestrator)
        let message = try Message(body: reply.body)
        #expect(message.header.type == "error")
        #expect(message.header.correlationId == request.header.id)
        #expect(message.serviceError == ServiceError(.usernameTaken, "Someone else already has this username.", reason: "duplicated"))
        #expect(Proto.validator.validate(try JSONValue.parse(reply.body), against: "envelope.schema.json") == [])
    }
}

@Suite("The hot path's encoder")
struct WireEncoderTests {
    struct Mixed: Codable, Sendable {
        var text: String
        var optional: String?
        var missing: Int?
        var flag: Bool
        var numbers: [Int64]
        var nested: [String: [UInt8]]
        var provider: Provider
        var small: Int8
        var big: UInt64
    }

    @Test("random strings, optionals, arrays, dictionaries and enums encode to Foundation's bytes")
    func matchesFoundation() async throws {
        var random = FuzzRandom(seed: 20261123)
        for index in 0..<500 {
            await letOtherTestsRun(every: 25, at: index)
            let value = Mixed(
                text: FuzzValues.string(&random), optional: random.next() % 2 == 0 ? nil : FuzzValues.string(&random),
                missing: nil, flag: random.next() % 2 == 0,
                numbers: (0..<Int(random.next() % 4)).map { _ in Int64(bitPattern: random.next()) },
                nested: [FuzzValues.string(&random): [UInt8(truncatingIfNeeded: random.next())], "b": []],
                provider: Provider.allCases[Int(random.next() % UInt64(Provider.allCases.count))],
                small: Int8(truncatingIfNeeded: random.next()), big: random.next())
            func maybe() -> String? { random.next() % 2 == 0 ? nil : FuzzValues.string(&random) }
            let header = EnvelopeHeader(
                version: Int(truncatingIfNeeded: random.next()), id: FuzzValues.string(&random), type: FuzzValues.string(&random),
                source: "test\u{1}\"\\/é", sequence: random.next(), time: FuzzValues.string(&random), correlationId: maybe(),
                uid: maybe(), sessionToken: maybe(), serviceToken: maybe(), traceparent: maybe(), tracestate: maybe())
            let envelope = Envelope(header: header, payload: value)
            let foundation = try WireFormat.encoder().encode(envelope)
            for wire in [try WireEncoder.encode(envelope), try envelope.encoded()] {
                #expect(wire == foundation, "\(String(decoding: wire, as: UTF8.self)) vs \(String(decoding: foundation, as: UTF8.self))")
            }
        }
    }

    @Test("the payloads that write themselves (WireWritable) write Foundation's bytes, alone and in envelopes")
    func writablePayloads() async throws {
        var random = FuzzRandom(seed: 20261125)
        func check<Payload: Codable & Sendable & WireWritable>(_ payload: Payload) throws {
            let alone = try WireEncoder.encode(payload)
            #expect(alone == (try WireFormat.encoder().encode(payload)), "\(String(decoding: alone, as: UTF8.self))")
            let envelope = Envelope(header: EnvelopeHeader(type: "t", source: "s", correlationId: "c"), payload: payload)
            #expect(try envelope.encoded() == WireFormat.encoder().encode(envelope))
        }
        func provider() -> Provider { Provider.allCases[Int(random.next() % UInt64(Provider.allCases.count))] }
        for index in 0..<300 {
            await letOtherTestsRun(every: 10, at: index)
            let uid = FuzzValues.string(&random)
            try check(SignInResult(uid: uid, sessionToken: FuzzValues.string(&random), provider: provider(), isNewAccount: random.next() % 2 == 0))
            try check(SignedIn(
                uid: uid, provider: provider(), isNewAccount: random.next() % 2 == 0,
                sessions: random.next() % 3 == 0 ? nil : Int(truncatingIfNeeded: random.next())))
            try check(AccountResult(uid: uid))
            try check(RouteIntent(
                intentId: FuzzValues.string(&random), uid: uid, intent: RouteIntent.Kind.allCases[Int(random.next() % 2)],
                reason: RouteIntent.Reason.allCases[Int(random.next() % UInt64(RouteIntent.Reason.allCases.count))]))
        }
    }

    @Test("an envelope whose payload it does not handle is still Foundation's bytes")
    func envelopeFallsBack() throws {
        struct Other: Codable, Sendable { var ratio: Double; var name: String }
        let envelope = Envelope(header: EnvelopeHeader(type: "t", source: "s", uid: "u"), payload: Other(ratio: 0.1, name: "x"))
        #expect(try envelope.encoded() == WireFormat.encoder().encode(envelope))
    }

    @Test("timestamps are RFC 3339 in UTC with milliseconds, as Foundation formats them")
    func timestamps() {
        var random = FuzzRandom(seed: 20261124)
        let style = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
        for _ in 0..<2000 {
            // Whole milliseconds from 1970 to 2100, so rounding cannot differ.
            let date = Date(timeIntervalSince1970: Double(random.next() % 4_102_444_800_000) / 1000)
            #expect(Timestamp.format(date) == style.format(date), "\(date.timeIntervalSince1970)")
        }
    }

    @Test("values it does not handle (a Double, a Date) are left to Foundation, with the same result")
    func fallsBack() throws {
        struct Other: Codable { var ratio: Double; var when: Date; var name: String }
        let value = Other(ratio: 0.1, when: Date(timeIntervalSince1970: 12.5), name: "x")
        #expect(try WireEncoder.encode(value) == WireFormat.encoder().encode(value))
    }
}

@Suite("Identifiers")
struct IdentifierTests {
    @Test("random and time-ordered ids are lowercase UUIDs of versions 4 and 7")
    func format() throws {
        for _ in 0..<1000 {
            let random = Identifier.random()
            let ordered = Identifier.timeOrdered()
            for (id, version) in [(random, "4"), (ordered, "7")] {
                #expect(id.count == 36)
                #expect(id == id.lowercased())
                let parsed = try #require(UUID(uuidString: id), "\(id)")
                #expect(parsed.uuidString.lowercased() == id)
                #expect(id[id.index(id.startIndex, offsetBy: 14)] == Character(version))
                #expect("89ab".contains(id[id.index(id.startIndex, offsetBy: 19)]))
            }
        }
        #expect(Set((0..<10_000).map { _ in Identifier.random() }).count == 10_000)
    }

    @Test("secure random bytes are handed out once each, across the pool's 4 KiB refills")
    func secureRandom() {
        var seen: Set<[UInt8]> = []
        for count in [1, 7, 16, 32, 4095, 4096, 5000] {
            for _ in 0..<20 {
                let bytes = SecureRandom.bytes(count: count)
                #expect(bytes.count == count)
                if count >= 16 { #expect(seen.insert(bytes).inserted) }
            }
        }
        // 64 KiB of output: every byte value appears, none far more often than the others.
        let sample = SecureRandom.bytes(count: 65_536)
        var counts = [Int](repeating: 0, count: 256)
        for byte in sample { counts[Int(byte)] += 1 }
        #expect(counts.min()! > 150 && counts.max()! < 370, "\(counts.min()!)...\(counts.max()!)")
    }

    @Test("time-ordered ids sort by the millisecond they were made in")
    func ordering() {
        let earlier = Identifier.timeOrdered(now: Date(timeIntervalSince1970: 1_800_000_000))
        let later = Identifier.timeOrdered(now: Date(timeIntervalSince1970: 1_800_000_000.002))
        #expect(earlier < later)
        #expect(earlier.hasPrefix("01a3185c"))  // 1,800,000,000,000 ms = 0x01a3185c5000
    }
}

@Suite("Trace context on the bus")
struct TraceContextTests {
    @Test("a traceparent's sampled flag is read from its last hex digit; one that cannot be read is not sampled")
    func sampled() {
        #expect(Traces.isSampled("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
        #expect(!Traces.isSampled("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"))
        #expect(Traces.isSampled("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0b"))
        #expect(!Traces.isSampled("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A"))
        #expect(!Traces.isSampled(""))
        #expect(!Traces.isSampled("x"))
        #expect(!Traces.isSampled("00-zz"))
    }

    @Test("only W3C's version 00 form is read: 55 characters, lowercase hex, ids not all zeros")
    func wellFormed() {
        #expect(Traces.isWellFormed("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
        #expect(!Traces.isWellFormed("00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"))
        #expect(!Traces.isWellFormed("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
        #expect(!Traces.isWellFormed("00-00000000000000000000000000000000-00f067aa0ba902b7-01"))
        #expect(!Traces.isWellFormed("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"))
        #expect(!Traces.isWellFormed("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"))
        #expect(!Traces.isWellFormed("x1"))
        #expect(!Traces.isWellFormed("00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01"))
    }

    @Test("while tracing is off, nothing is read from an envelope or written into one")
    func off() {
        let header = EnvelopeHeader(type: "t", source: "s", traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        #expect(Traces.context(of: header) == nil)
        var written = EnvelopeHeader(type: "t", source: "s")
        Traces.inject(into: &written)
        #expect(written.traceparent == nil && written.tracestate == nil)
    }
}
