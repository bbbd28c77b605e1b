import CZeroMQ
import Foundation
import FuzzKit
import Messaging
import Testing
import ZeroMQMessaging

/// Fuzzes the ZeroMQ request framing: raw multipart messages from a plain DEALER socket (as any
/// client in any language can send) to a ``ZeroMQBus`` request server. Routing frames, a missing
/// or misplaced delimiter, empty frames, too many frames, oversized frames, and envelopes that are
/// valid, mutated or not JSON at all.
///
/// The reply to each is predicted from the documented framing rules (proto/README.md, "Requests
/// and replies") and checked frame by frame: the routing frames come back unchanged, then the
/// delimiter, then a typed error or the echo. The server stays up throughout, even after a frame
/// beyond its transport cap (which drops that connection, unanswered), and counts exactly the
/// requests its bus refused. Deterministic for a seed (`FUZZ_SEED`, `FUZZ_ITERATIONS`).
@Suite("Fuzz: ZeroMQ request framing", .timeLimit(.minutes(30)))
struct ZeroMQFramingFuzzTests {
    static let settings = FuzzSettings.fromEnvironment("zeromq framing", defaultIterations: 1_500, defaultSeed: 0x2E20_F4A3)
    static let limits = MessageLimits(maxEnvelopeBytes: 4096, maxAttachmentBytes: 1024)

    @Test("Raw multipart garbage gets the reply the framing rules predict, and the server stays up")
    func fuzzFraming() async throws {
        let settings = Self.settings
        print("[fuzz] \(settings)")
        try await withHarness(.zeroMQ) { buses in
            let (endpoint, _) = try await buses.startServer(limits: Self.limits, handler: echoHandler)
            let cases = (0..<settings.iterations).map { index in
                var random = FuzzRandom(seed: settings.seed, case: index)
                return FramingCase.make(&random)
            }
            let replies = await rawDealerSession(endpoint, cases.map(\.frames), beyondCap: Self.limits.transportCap + 1) { index in
                settings.traceCase(index, cases[index].steps.joined(separator: "; "))
            }

            var failing: [String] = []
            var outcomes: [String: Int] = [:]
            var refusedByBus = 0
            for (index, (fuzzCase, reply)) in zip(cases, replies).enumerated() {
                let expected = FramingModel.expect(fuzzCase.frames, limits: Self.limits)
                if expected.refusedByBus { refusedByBus += 1 }
                outcomes[expected.name, default: 0] += 1
                let problems = FramingModel.check(reply, expected)
                if !problems.isEmpty {
                    failing.append("\(settings.label(index)) [\(fuzzCase.steps.joined(separator: "; "))]: \(problems.joined(separator: "; "))")
                }
            }
            print("[fuzz] zeromq framing: \(cases.count) cases: \(outcomes.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))")
            #expect(failing.isEmpty, "\(failing.count) failing cases; first: \(failing.prefix(10))")

            // Still up, and it counted what its bus refused (the connection it dropped sent nothing
            // it could count).
            let reply = try await buses.client.request(try echoRequest("still here", number: 7), to: endpoint, timeout: .seconds(10))
            #expect(try reply.payload(as: Echo.self) == Echo(text: "still here", number: 7))
            #expect(buses.server.statistics.rejectedRequests == refusedByBus)
        }
    }
}

/// One raw request: the frames a DEALER sends (the server's ROUTER adds the peer's identity).
struct FramingCase: Sendable {
    var frames: [Data]
    var steps: [String]

    static func make(_ random: inout FuzzRandom) -> FramingCase {
        var steps: [String] = []
        func nonEmpty(_ count: Int) -> Data { Data(random.bytes(max(1, count))) }
        var frames: [Data] = []

        let several = random.int(2...4)
        let routing = random.weighted([(5, 0), (3, 1), (2, several)])
        for _ in 0..<routing { frames.append(nonEmpty(random.int(1...32))) }
        if routing > 0 { steps.append("\(routing) routing frames") }

        guard random.chance(0.88) else {
            // No delimiter: only non-empty frames.
            let more = random.int(routing == 0 ? 1...3 : 0...3)
            for _ in 0..<more { frames.append(random.chance(0.5) ? (try? echoRequest("x").body) ?? nonEmpty(4) : nonEmpty(random.int(1...200))) }
            steps.append("no delimiter")
            return FramingCase(frames: frames, steps: steps)
        }
        frames.append(Data())

        let valid = (try? echoRequest(FuzzValues.string(&random), number: random.int(-5...5)).body) ?? Data()
        let body: Data?
        switch random.int(0..<20) {
        case 0..<8: body = valid; steps.append("an echo request")
        case 8: body = (try? OutgoingMessage(Envelope(header: EnvelopeHeader(type: "test.echo", source: "t"), payload: Empty())).body); steps.append("a payload that is not an echo")
        case 9: body = (try? echoRequest("v2", version: 2).body); steps.append("version 2")
        case 10..<13:
            var bytes = [UInt8](valid)
            steps += (0..<random.int(1...3)).map { _ in FuzzValues.mutate(&bytes, &random) }
            body = Data(bytes)
        case 13: body = Data(random.bytes(random.size(upTo: 3000))); steps.append("random bytes")
        case 14: body = Data(); steps.append("an empty envelope frame")
        case 15: body = Data(repeating: UInt8(ascii: " "), count: random.int(4097...20_000)); steps.append("an envelope over the limit")
        case 16: body = Data(repeating: UInt8(ascii: "["), count: FuzzValues.nestingDepth(&random)); steps.append("open brackets")
        case 17: body = Data([UInt8](valid) + FuzzValues.invalidUTF8[random.int(0..<FuzzValues.invalidUTF8.count)]); steps.append("trailing invalid UTF-8")
        default: body = nil; steps.append("nothing after the delimiter")
        }
        guard let body else { return FramingCase(frames: frames, steps: steps) }
        frames.append(body)

        switch random.int(0..<10) {
        case 0..<5: break
        case 5..<9:
            let size = random.size(upTo: 1024)
            frames.append(Data(random.bytes(size)))
            steps.append("a binary frame of \(size)")
        default:
            let size = random.int(1025...8_000)
            frames.append(Data(random.bytes(size)))
            steps.append("a binary frame of \(size), over the limit")
        }
        if frames.count > routing + 2, random.chance(0.25) {
            let (few, many) = (random.int(1...3), random.int(4...60))
            let extra = random.weighted([(6, few), (1, many)])
            for _ in 0..<extra { frames.append(random.chance(0.3) ? Data() : Data(random.bytes(random.size(upTo: 2000)))) }
            steps.append("\(extra) more frames")
        }
        return FramingCase(frames: frames, steps: steps)
    }
}

/// The documented framing rules, as a prediction of each reply.
enum FramingModel {
    enum Answer {
        case error(ErrorCode)
        case echo(Echo, attachment: Data?)
    }

    struct Expected {
        /// The frames the reply starts with before its delimiter.
        var route: [Data]
        var answer: Answer
        /// The request id that comes back as `correlationId` (`nil`: none).
        var correlationId: String?
        /// The server's bus refuses it itself (counted in `rejectedRequests`).
        var refusedByBus: Bool

        var name: String {
            switch answer {
            case .error(let code): code.rawValue
            case .echo: "echoed"
            }
        }
    }

    static func expect(_ frames: [Data], limits: MessageLimits) -> Expected {
        // A refusal names the request when its envelope frame was within the limit and holds a
        // string id (proto/README.md, "Requests and replies"); without a delimiter or an envelope
        // frame there is nothing to read it from.
        func refused(_ code: ErrorCode, route: [Data], body: Data? = nil) -> Expected {
            let id = body.flatMap { $0.count <= limits.maxEnvelopeBytes ? Message.requestID(in: $0) : nil }
            return Expected(route: route, answer: .error(code), correlationId: id, refusedByBus: true)
        }
        guard let delimiter = frames.firstIndex(where: \.isEmpty) else { return refused(.invalidMessage, route: []) }
        let route = Array(frames[..<delimiter])
        guard delimiter + 1 < frames.count else { return refused(.invalidMessage, route: route) }
        let body = frames[delimiter + 1]
        func refused(_ code: ErrorCode) -> Expected { refused(code, route: route, body: body) }
        let attachment = delimiter + 2 < frames.count ? frames[delimiter + 2] : nil
        let extra = max(0, frames.count - (delimiter + 3))
        if body.count > limits.maxEnvelopeBytes { return refused(.messageTooLarge) }
        if extra > 0 { return refused(.unexpectedFrames) }
        if let attachment, attachment.count > limits.maxAttachmentBytes { return refused(.messageTooLarge) }
        let message: Message
        do throws(ServiceError) {
            message = try Message(body: body, attachment: attachment)
        } catch {
            return refused(error.code)
        }
        do throws(ServiceError) {
            let echo = try message.payload(as: Echo.self)
            return Expected(route: route, answer: .echo(echo, attachment: attachment), correlationId: message.header.id, refusedByBus: false)
        } catch {
            return Expected(route: route, answer: .error(.invalidMessage), correlationId: message.header.id, refusedByBus: false)
        }
    }

    static func check(_ reply: [Data]?, _ expected: Expected) -> [String] {
        guard let reply else { return ["no reply (expected \(expected.name))"] }
        var problems: [String] = []
        let head = expected.route.count
        guard reply.count >= head + 2, Array(reply[..<head]) == expected.route, reply[head].isEmpty else {
            return ["the reply's \(reply.count) frames do not start with the routing frames and the delimiter"]
        }
        let message: Message
        do {
            message = try Message(body: reply[head + 1], attachment: head + 2 < reply.count ? reply[head + 2] : nil)
        } catch {
            return ["the reply is not an envelope: \(error)"]
        }
        if reply.count > head + 3 { problems.append("the reply has \(reply.count - head - 3) frames too many") }
        if message.header.correlationId != expected.correlationId {
            problems.append("correlationId \(message.header.correlationId ?? "none"), expected \(expected.correlationId ?? "none")")
        }
        switch expected.answer {
        case .error(let code):
            if message.serviceError?.code != code {
                problems.append("expected \(code), got \(message.serviceError.map(\.description) ?? message.header.type)")
            }
            if message.attachment != nil { problems.append("an error reply with a binary frame") }
        case .echo(let echo, let attachment):
            if let error = message.serviceError {
                problems.append("expected the echo, got \(error)")
            } else if (try? message.payload(as: Echo.self)) != echo {
                problems.append("the echo is not what was sent")
            }
            if message.attachment != attachment { problems.append("the binary frame did not come back unchanged") }
        }
        return problems
    }
}

/// Sends each case's frames from one raw DEALER socket on its own thread and context and
/// returns each reply (`nil` when none came within 30 s, a failure bound for a loaded machine: every
/// case is answered; 2 s once one has not been; the socket is then replaced, so a late
/// reply cannot be taken for the next case's). Before the first case, another socket sends a
/// frame of `beyondCap` bytes, which the server must drop with its connection. `willSend` is
/// told each case's index before it is sent.
func rawDealerSession(
    _ endpoint: Endpoint, _ cases: [[Data]], beyondCap: Int, willSend: @escaping @Sendable (Int) -> Void
) async -> [[Data]?] {
    await withCheckedContinuation { continuation in
        let thread = Thread {
            continuation.resume(returning: rawDealerSessionBlocking(endpoint.rawValue, cases, beyondCap: beyondCap, willSend: willSend))
        }
        thread.start()
    }
}

private func rawDealerSessionBlocking(
    _ endpoint: String, _ cases: [[Data]], beyondCap: Int, willSend: (Int) -> Void
) -> [[Data]?] {
    guard let context = zmq_ctx_new() else { return cases.map { _ in nil } }
    defer { zmq_ctx_term(context) }

    func open(linger: Int32) -> UnsafeMutableRawPointer? {
        guard let socket = zmq_socket(context, ZMQ_DEALER) else { return nil }
        var linger = linger
        zmq_setsockopt(socket, ZMQ_LINGER, &linger, MemoryLayout<Int32>.size)
        guard zmq_connect(socket, endpoint) == 0 else {
            zmq_close(socket)
            return nil
        }
        return socket
    }
    func send(_ frames: [Data], on socket: UnsafeMutableRawPointer) -> Bool {
        for (index, frame) in frames.enumerated() {
            let flags = index < frames.count - 1 ? ZMQ_SNDMORE : 0
            guard frame.withUnsafeBytes({ zmq_send(socket, $0.baseAddress, $0.count, flags) }) >= 0 else { return false }
        }
        return true
    }

    // A frame beyond the server's ZMQ_MAXMSGSIZE, from a socket of its own (flushed as it closes).
    if let oversized = open(linger: 2_000) {
        _ = send([Data(), Data(count: beyondCap)], on: oversized)
        zmq_close(oversized)
    }

    let message = UnsafeMutablePointer<zmq_msg_t>.allocate(capacity: 1)
    zmq_msg_init(message)
    defer {
        zmq_msg_close(message)
        message.deallocate()
    }
    var socket = open(linger: 0)
    defer { if let socket { zmq_close(socket) } }
    var replies: [[Data]?] = []
    // A failure bound for a loaded machine; once one case has gone unanswered the test fails
    // anyway, and the rest need not wait as long.
    var wait: Int32 = 30_000
    for (index, frames) in cases.enumerated() {
        willSend(index)
        guard let current = socket, send(frames, on: current) else {
            replies.append(nil)
            continue
        }
        var item = zmq_pollitem_t(socket: current, fd: 0, events: Int16(ZMQ_POLLIN), revents: 0)
        guard zmq_poll(&item, 1, Int(wait)) == 1 else {
            wait = 2_000
            replies.append(nil)
            zmq_close(current)
            socket = open(linger: 0)
            continue
        }
        var reply: [Data] = []
        repeat {
            guard zmq_msg_recv(message, current, 0) >= 0 else { break }
            let size = zmq_msg_size(message)
            reply.append(size == 0 ? Data() : Data(bytes: zmq_msg_data(message), count: size))
        } while zmq_msg_more(message) != 0
        replies.append(reply)
    }
    return replies
}
