import Foundation
import Hummingbird
import Logging
import NIOCore
import Synchronization
import Testing

/// An OTLP/HTTP receiver in the test: keeps every span the executables export (as JSON).
final class SpanReceiver: Sendable {
    struct ReceivedSpan: Hashable, Sendable {
        var service: String
        var name: String
        var traceID: String
        var spanID: String
        var parentSpanID: String
    }

    let spans = Mutex<[ReceivedSpan]>([])

    /// Serves `POST /v1/traces` on a free loopback port until cancelled; `ready` gets the port.
    func run(ready: @escaping @Sendable (Int) async -> Void) async throws {
        let router = Router()
        router.post("/v1/traces") { [self] request, _ -> Response in
            let body = try await request.body.collect(upTo: 32 << 20)
            keep(Data(buffer: body))
            // A 2xx with a JSON content type: anything else counts as a failed export.
            return Response(
                status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: "{}")))
        }
        var logger = Logger(label: "otlp-receiver")
        logger.logLevel = .warning
        let application = Application(
            router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0), serverName: nil),
            onServerRunning: { channel in await ready(channel.localAddress?.port ?? 0) }, logger: logger)
        try await application.run()
    }

    private func keep(_ body: Data) {
        guard let root = try? JSONSerialization.jsonObject(with: body) as? [String: Any] else { return }
        var found: [ReceivedSpan] = []
        for resourceSpans in root["resourceSpans"] as? [[String: Any]] ?? [] {
            let attributes = (resourceSpans["resource"] as? [String: Any])?["attributes"] as? [[String: Any]] ?? []
            let service = attributes.first { $0["key"] as? String == "service.name" }
                .flatMap { ($0["value"] as? [String: Any])?["stringValue"] as? String } ?? "?"
            for scope in resourceSpans["scopeSpans"] as? [[String: Any]] ?? [] {
                for span in scope["spans"] as? [[String: Any]] ?? [] {
                    found.append(
                        ReceivedSpan(
                            service: service, name: span["name"] as? String ?? "",
                            traceID: Self.hex(span["traceId"]), spanID: Self.hex(span["spanId"]),
                            parentSpanID: Self.hex(span["parentSpanId"])))
                }
            }
        }
        spans.withLock { $0 += found }
    }

    /// An id as lowercase hex: OTLP's JSON writes it in hex, protobuf's JSON mapping in base64.
    static func hex(_ value: Any?) -> String {
        guard let text = value as? String, !text.isEmpty else { return "" }
        if text.count == 32 || text.count == 16, text.allSatisfy(\.isHexDigit) { return text.lowercased() }
        guard let bytes = Data(base64Encoded: text) else { return text }
        return bytes.map { String(format: "%02x", $0) }.joined()
    }
}

@Suite("Traces: one sign-in, exported over OTLP by every hop, is one trace")
struct TraceExportTests {
    @Test("the gateway's request, auth's sign-in and commit, and the orchestrator's delivery, decision, publication and commit share the trace the app started")
    func oneTrace() async throws {
        let receiver = SpanReceiver()
        let (ports, portSink) = AsyncStream.makeStream(of: Int.self)
        let receiving = Task { try await receiver.run { portSink.yield($0) } }
        defer { receiving.cancel() }
        var iterator = ports.makeAsyncIterator()
        let port = try #require(await iterator.next())

        let system = try RunningExecutables(extra: [
            "ONBOARDING_OTLP_ENDPOINT": "http://127.0.0.1:\(port)",
            "ONBOARDING_TRACE_SAMPLE_PERCENT": "100",
            // JSON, so that this test reads it without protobuf; sent every 100 ms.
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        ])
        do {
            try await system.startGateway()
            let traceID = (0..<16).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
            let rootSpanID = "00f067aa0ba902b7"
            let http = GatewayHTTP(base: system.gatewayBase)
            let reply = try await http.json(
                .POST, "/v1/session", ["provider": "kakao", "subject": "traced-\(UUID().uuidString)"],
                headers: [("traceparent", "00-\(traceID)-\(rootSpanID)-01")])
            #expect(reply.status == 200)

            let expected: Set<String> = [
                "HTTP POST /v1/session", "auth.signIn", "commit", "process auth.signedIn", "orchestrator.decide",
                "publish route.intent", "orchestrator.commit",
            ]
            let clock = ContinuousClock()
            let deadline = clock.now.advanced(by: .seconds(30))
            var trace: [SpanReceiver.ReceivedSpan] = []
            while clock.now < deadline {
                trace = receiver.spans.withLock { $0.filter { $0.traceID == traceID } }
                if expected.isSubset(of: Set(trace.map(\.name))) { break }
                try await Task.sleep(for: .milliseconds(100))
            }
            let names = Set(trace.map(\.name))
            #expect(expected.isSubset(of: names), "spans of the trace: \(names.sorted()); missing \(expected.subtracting(names).sorted())")
            let services = Set(trace.map(\.service))
            #expect(services.isSuperset(of: ["onboarding-gateway", "auth", "onboarding-orchestrator"]), "\(services.sorted())")
            // One tree: every span's parent is the app's span or another span of the trace.
            let ids = Set(trace.map(\.spanID)).union([rootSpanID])
            for span in trace {
                #expect(ids.contains(span.parentSpanID), "\(span.service) \(span.name)'s parent \(span.parentSpanID) is not in the trace")
            }
        } catch {
            await system.stop()
            throw error
        }
        await system.stop()
    }
}
