import CZeroMQ
import Foundation
import Logging
import Messaging
import Synchronization
import TestSupport
import Testing
import ZeroMQMessaging

/// What a peer that stops reading costs a service, over real sockets: bounded, named, counted,
/// and nobody else waits for it.
@Suite("Slow peers", .timeLimit(.minutes(1)))
struct SlowPeerTests {
    @Test("a subscriber that never reads is named in the log and counted; a reading one keeps getting every event")
    func stalledSubscriber() async throws {
        let log = LogCapture()
        var configuration = ZeroMQBus.Configuration()
        configuration.publishHighWaterMark = 100
        let publishing = ZeroMQBus(source: "publisher", logger: log.logger, configuration: configuration)
        let (endpoint, publisher) = try await bindRetrying { try await publishing.publisher(at: $0) }
        let stop = StopFlag()
        let stalled = await startStalledPeer(ZMQ_SUB, to: endpoint, stop: stop)
        let reading = ZeroMQBus(source: "reader", logger: Logger(label: "test.quiet") { _ in SwiftLogNoOpLogHandler() })
        let stream = try await reading.subscribe(to: [endpoint], topics: ["t"], limits: MessageLimits(queueLimit: 10_000))
        var events = stream.makeAsyncIterator()
        try await waitUntilJoined(&events, publishers: [publisher], probeTopic: "t")

        // Batches of 16 KiB events, each read whole before the next is published, until the
        // publisher names the one that does not read. Its queue fills; the reader misses nothing.
        let padding = String(repeating: "x", count: 16 * 1024)
        var sent = 0
        func sendAndReadBatch() async throws {
            let first = sent
            for _ in 0..<50 {
                try publisher.publish(event("t", type: "test.event", text: "\(sent) \(padding)"))
                sent += 1
            }
            for expected in first..<sent {
                let text = try #require(await nextEvent(&events)).payload(as: Echo.self).text
                #expect(text.prefix { $0 != " " } == "\(expected)", "the reading subscriber gets every event, in order")
            }
        }
        let deadline = ContinuousClock.now + .seconds(20)
        while publishing.statistics.slowSubscribers == 0, ContinuousClock.now < deadline {
            try await sendAndReadBatch()
        }
        #expect(publishing.statistics.slowSubscribers == 1)
        #expect(log.contains("is not reading the events of \(endpoint)"), "the log names it")
        #expect(log.contains("The subscriber at 127.0.0.1:"), "by its address")
        // Still not slowed: another batch arrives whole.
        try await sendAndReadBatch()

        stop.set()
        await stalled.value
        await eventually { publishing.statistics.slowSubscribers == 0 }
        #expect(log.contains("that was not reading \(endpoint) has disconnected"))
        publisher.close()
        await reading.shutdown()
        await publishing.shutdown()
    }

    @Test("a caller that never reads its replies costs its server a bounded queue, counted and logged once; others are answered")
    func silentCaller() async throws {
        let log = LogCapture()
        var configuration = ZeroMQBus.Configuration()
        configuration.replyHighWaterMark = 10
        let serving = ZeroMQBus(source: "server", logger: log.logger, configuration: configuration)
        let large = try echoRequest(String(repeating: "y", count: 64 * 1024))
        let (endpoint, registration) = try await bindRetrying { endpoint in
            try await serving.serve(at: endpoint, limits: MessageLimits(), onLoop: { batch in
                for raw in batch { raw.reply(large) }
            })
        }
        // 64 KiB replies to 2,000 requests: far more than the caller's connection holds.
        let stop = StopFlag()
        let request = [Data(), try echoRequest("hi").body]
        let silent = await startStalledPeer(ZMQ_DEALER, to: endpoint, stop: stop, sending: request, times: 2_000)
        await eventually(within: .seconds(20)) { serving.statistics.droppedReplies >= 1 }
        #expect(log.contains("Replies dropped: a caller of \(endpoint) is not reading its replies"))
        let other = ZeroMQBus(source: "other", logger: Logger(label: "test.quiet") { _ in SwiftLogNoOpLogHandler() })
        let reply = try await other.request(try echoRequest("me too"), to: endpoint, timeout: .seconds(30))
        #expect(reply.body.count > 64 * 1024, "another caller is answered")
        stop.set()
        await silent.value
        registration.close()
        await other.shutdown()
        await serving.shutdown()
    }
}

/// A raw socket of `type` (SUB or DEALER) on its own thread and context, with the smallest
/// queues, that never reads: a SUB subscribes to everything; a DEALER sends `frames` `times`
/// times. Holds its connection open until `stop` is set; returns once it is connected.
func startStalledPeer(
    _ type: Int32, to endpoint: Endpoint, stop: StopFlag, sending frames: [Data] = [], times: Int = 0
) async -> Task<Void, Never> {
    let (started, startedSink) = AsyncStream.makeStream(of: Void.self)
    let (finished, finishedSink) = AsyncStream.makeStream(of: Void.self)
    let thread = Thread {
        stallBlocking(type, endpoint.rawValue, stop: stop, frames: frames, times: times) { startedSink.finish() }
        finishedSink.finish()
    }
    thread.start()
    for await _ in started {}
    return Task { for await _ in finished {} }
}

private func stallBlocking(
    _ type: Int32, _ endpoint: String, stop: StopFlag, frames: [Data], times: Int, started: () -> Void
) {
    defer { started() }
    guard let context = zmq_ctx_new() else { return }
    defer { zmq_ctx_term(context) }
    guard let socket = zmq_socket(context, type) else { return }
    defer { zmq_close(socket) }
    var option: Int32 = 0
    zmq_setsockopt(socket, ZMQ_LINGER, &option, MemoryLayout<Int32>.size)
    option = 1
    zmq_setsockopt(socket, ZMQ_RCVHWM, &option, MemoryLayout<Int32>.size)
    option = 4096
    zmq_setsockopt(socket, ZMQ_RCVBUF, &option, MemoryLayout<Int32>.size)
    if type == ZMQ_SUB { zmq_setsockopt(socket, ZMQ_SUBSCRIBE, "", 0) }
    guard zmq_connect(socket, endpoint) == 0 else { return }
    started()
    for _ in 0..<times {
        for (index, frame) in frames.enumerated() {
            let flags = ZMQ_DONTWAIT | (index < frames.count - 1 ? ZMQ_SNDMORE : 0)
            _ = frame.withUnsafeBytes { zmq_send(socket, $0.baseAddress, $0.count, flags) }
        }
    }
    // Then it only holds the socket open; it never reads.
    while !stop.isSet { usleep(10_000) }
}
