import CZeroMQ
import Foundation
import Logging
import Messaging
import Testing
import ZeroMQMessaging

/// What only the ZeroMQ bus has: other-language clients, raw frames, shutdown.
@Suite("ZeroMQ bus", .timeLimit(.minutes(1)))
struct ZeroMQBusTests {
    @Test("a plain REQ socket, as in any other language, gets a reply")
    func plainREQClient() async throws {
        try await withHarness(.zeroMQ) { buses in
            let (endpoint, _) = try await buses.startServer(handler: echoHandler)
            let request = try echoRequest("from python", number: 3)
            let frames = try #require(await rawExchange(ZMQ_REQ, endpoint: endpoint, frames: [request.body]))

            #expect(frames.count == 1)
            let reply = try Message(body: frames[0])
            #expect(try reply.payload(as: Echo.self) == Echo(text: "from python", number: 3))
            #expect(reply.header.correlationId == (try Message(body: request.body).header.id))
        }
    }

    @Test("a request with frames after the attachment is answered with unexpectedFrames")
    func extraFrames() async throws {
        try await withHarness(.zeroMQ) { buses in
            let (endpoint, _) = try await buses.startServer(limits: MessageLimits(maxAttachmentBytes: 100), handler: echoHandler)
            let request = try echoRequest("too many")
            let frames = try #require(
                await rawExchange(ZMQ_REQ, endpoint: endpoint, frames: [request.body, Data([1]), Data([2])]))

            #expect(frames.count == 1)
            #expect(try Message(body: frames[0]).serviceError?.code == .unexpectedFrames)
            #expect(buses.server.statistics.rejectedRequests == 1)
        }
    }

    @Test("a request without the empty delimiter is answered with invalidMessage")
    func missingDelimiter() async throws {
        try await withHarness(.zeroMQ) { buses in
            let (endpoint, _) = try await buses.startServer(handler: echoHandler)
            let frames = try #require(
                await rawExchange(ZMQ_DEALER, endpoint: endpoint, frames: [try echoRequest("no delimiter").body]))

            #expect(frames.count == 2)
            #expect(frames.first?.isEmpty == true)
            #expect(try Message(body: frames[1]).serviceError?.code == .invalidMessage)
            #expect(buses.server.statistics.rejectedRequests == 1)
        }
    }

    @Test("shutting down fails calls in flight with closed, and later calls too")
    func shutdownFailsPendingCalls() async throws {
        try await withHarness(.zeroMQ) { buses in
            let (endpoint, requests) = try await buses.bindServer()
            var incoming = requests.makeAsyncIterator()
            let client = try #require(buses.client as? ZeroMQBus)
            let call = Task { try await client.request(try echoRequest("pending"), to: endpoint, timeout: .seconds(30)) }
            _ = try #require(await incoming.next())

            await client.shutdown()
            #expect(await serviceError { try await call.value }?.code == .closed)
            #expect(await serviceError {
                try await client.request(try echoRequest("after"), to: endpoint, timeout: .seconds(1))
            }?.code == .closed)
            await client.shutdown()  // idempotent
        }
    }

    @Test("shutting down finishes subscriptions and server streams")
    func shutdownFinishesStreams() async throws {
        let bus = ZeroMQBus(source: "bus", logger: Logger(label: "test"))
        let (endpoint, requests) = try await bindRetrying { try await bus.serve(at: $0, limits: MessageLimits()) }
        let events = try await bus.subscribe(to: [endpoint], topics: [""], limits: MessageLimits())
        await bus.shutdown()
        for await _ in requests { Issue.record("No request was sent") }
        for await _ in events { Issue.record("No event was published") }
        #expect(await serviceError { try await bus.publisher(at: Endpoints.fresh()) }?.code == .closed)
    }

    @Test("an endpoint that is not one gives invalidEndpoint", arguments: ["nonsense", "bogus://x", "tcp://127.0.0.1"])
    func invalidEndpoint(endpoint: String) async throws {
        try await withHarness(.zeroMQ) { buses in
            let error = await serviceError { try await buses.server.serve(at: Endpoint(endpoint), limits: MessageLimits()) }
            #expect(error?.code == .invalidEndpoint)
        }
    }
}

/// Sends `frames` from a raw socket of `type` on its own thread and context and returns the reply
/// frames, or `nil` when none came within 5 seconds.
func rawExchange(_ type: Int32, endpoint: Endpoint, frames: [Data]) async -> [Data]? {
    await withCheckedContinuation { continuation in
        let thread = Thread {
            continuation.resume(returning: rawExchangeBlocking(type, endpoint: endpoint.rawValue, frames: frames))
        }
        thread.start()
    }
}

private func rawExchangeBlocking(_ type: Int32, endpoint: String, frames: [Data]) -> [Data]? {
    guard let context = zmq_ctx_new() else { return nil }
    defer { zmq_ctx_term(context) }
    guard let socket = zmq_socket(context, type) else { return nil }
    defer { zmq_close(socket) }
    var linger: Int32 = 0
    zmq_setsockopt(socket, ZMQ_LINGER, &linger, MemoryLayout<Int32>.size)
    guard zmq_connect(socket, endpoint) == 0 else { return nil }
    for (index, frame) in frames.enumerated() {
        let flags = index < frames.count - 1 ? ZMQ_SNDMORE : 0
        let sent = frame.withUnsafeBytes { zmq_send(socket, $0.baseAddress, $0.count, flags) }
        guard sent >= 0 else { return nil }
    }
    var item = zmq_pollitem_t(socket: socket, fd: 0, events: Int16(ZMQ_POLLIN), revents: 0)
    guard zmq_poll(&item, 1, 5000) == 1 else { return nil }

    let message = UnsafeMutablePointer<zmq_msg_t>.allocate(capacity: 1)
    zmq_msg_init(message)
    defer {
        zmq_msg_close(message)
        message.deallocate()
    }
    var reply: [Data] = []
    repeat {
        guard zmq_msg_recv(message, socket, 0) >= 0 else { return nil }
        let size = zmq_msg_size(message)
        reply.append(size == 0 ? Data() : Data(bytes: zmq_msg_data(message), count: size))
    } while zmq_msg_more(message) != 0
    return reply
}
