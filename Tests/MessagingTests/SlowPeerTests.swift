import CZeroMQ
import Foundation
import Logging
import Messaging
import Synchronization
import Testing
import ZeroMQMessaging

/// What a peer that stops reading costs a service, over real sockets: bounded, named, counted,
/// and nobody else waits for it.
@Suite("Slow peers", .timeLimit(.minutes(1)))
struct SlowPeerTests {
    @Test("a subscriber that never reads is named in the log and counted; a reading one keeps getting every event")
    func stalledSubscriber() async throws {
        let log = LogLines()
        var configuration = ZeroMQBus.Configuration()
        configuration.publishHighWaterMark = 100
        let publishing = ZeroMQBus(source: "publisher", logger: log.logger, configuration: configuration)
        let (endpoint, publisher) = try await bindRetrying { try await publishing.publisher(at: $0) }
        let stop = StopFlag()
        let stalled = await startStalledSubscriber(to: endpoint, stop: stop)
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
}

/// Collects a logger's lines.
final class LogLines: Sendable {
    private let lines = Mutex<[String]>([])

    var logger: Logger {
        Logger(label: "test.lines") { _ in Handler(lines: self) }
    }

    func contains(_ text: String) -> Bool {
        lines.withLock { $0.contains { $0.contains(text) } }
    }

    private struct Handler: LogHandler {
        let lines: LogLines
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .info

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            lines.lines.withLock { $0.append("\(event.message)") }
        }
    }
}

/// A raw SUB socket on its own thread and context that subscribes to everything at `endpoint`
/// and never reads, with the smallest queues, until `stop` is set. Returns once it is connected.
func startStalledSubscriber(to endpoint: Endpoint, stop: StopFlag) async -> Task<Void, Never> {
    let (started, startedSink) = AsyncStream.makeStream(of: Void.self)
    let (finished, finishedSink) = AsyncStream.makeStream(of: Void.self)
    let thread = Thread {
        stallBlocking(endpoint.rawValue, stop: stop) { startedSink.finish() }
        finishedSink.finish()
    }
    thread.start()
    for await _ in started {}
    return Task { for await _ in finished {} }
}

private func stallBlocking(_ endpoint: String, stop: StopFlag, started: () -> Void) {
    defer { started() }
    guard let context = zmq_ctx_new() else { return }
    defer { zmq_ctx_term(context) }
    guard let socket = zmq_socket(context, ZMQ_SUB) else { return }
    defer { zmq_close(socket) }
    var option: Int32 = 0
    zmq_setsockopt(socket, ZMQ_LINGER, &option, MemoryLayout<Int32>.size)
    option = 1
    zmq_setsockopt(socket, ZMQ_RCVHWM, &option, MemoryLayout<Int32>.size)
    option = 4096
    zmq_setsockopt(socket, ZMQ_RCVBUF, &option, MemoryLayout<Int32>.size)
    zmq_setsockopt(socket, ZMQ_SUBSCRIBE, "", 0)
    guard zmq_connect(socket, endpoint) == 0 else { return }
    started()
    // The thread only holds the socket open; it never reads.
    while !stop.isSet { usleep(10_000) }
}
