import Foundation
import Logging
import Messaging
import OnboardingAPI
import CoreMetrics
@testable import ServiceHosting
import ServiceRuntime
import Prometheus
import Synchronization
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@Suite("Metrics for Prometheus", .timeLimit(.minutes(1)))
struct MetricsEndpointTests {
    @Test("GET /metrics gives the bus's counts as counters that follow their totals, and the process's figures")
    func scrape() async throws {
        let totals = Mutex(BusStatistics())
        let (listening, port) = AsyncStream.makeStream(of: Int.self)
        var logger = Logger(label: "metrics-test")
        logger.logLevel = .warning
        let endpoint = MetricsEndpoint(
            host: "127.0.0.1", port: 0, statistics: { totals.withLock { $0 } },
            health: {
                var health = HealthStatus(service: "onboarding-orchestrator", startedAt: "2026-11-27T00:00:00.000Z", statistics: BusStatistics())
                var feed = FeedStatistics(publisher: "tcp://127.0.0.1:7101", sequence: 9)
                feed.handled = totals.withLock { $0.refusedHandshakes } * 10
                // Three events behind; the last one handled was committed 3 s ago.
                feed.newest = 12
                feed.lastHandledTime = Timestamp.format(Date().addingTimeInterval(-3))
                health.feeds = [feed]
                health.unlink = UnlinkQueueStatus(pending: 2, oldestPendingSeconds: 30)
                return health
            },
            logger: logger,
            onListening: { port.yield($0); port.finish() })
        let serving = Task { try await endpoint.run() }
        defer { serving.cancel() }
        var ports = listening.makeAsyncIterator()
        let bound = try #require(await ports.next())
        let url = try #require(URL(string: "http://127.0.0.1:\(bound)/metrics"))

        func scrape() async throws -> [String: Double] {
            let (data, response) = try await URLSession.shared.data(from: url)
            #expect((response as? HTTPURLResponse)?.value(forHTTPHeaderField: "Content-Type")?.hasPrefix("text/plain; version=0.0.4") == true)
            var values: [String: Double] = [:]
            for line in String(decoding: data, as: UTF8.self).split(separator: "\n") where !line.hasPrefix("#") {
                let parts = line.split(separator: " ")
                if parts.count == 2, let value = Double(parts[1]) { values[String(parts[0])] = value }
            }
            return values
        }

        let first = try await scrape()
        #expect(first["onboarding_bus_refused_handshakes_total"] == 0)
        #expect(first["onboarding_bus_slow_subscribers"] == 0)
        #expect((first["process_resident_memory_bytes"] ?? 0) > 1_000_000)
        #expect((first["process_open_fds"] ?? 0) > 2)
        #expect((first["process_start_time_seconds"] ?? 0) > 1_700_000_000)
        #expect(first[#"onboarding_feed_lag_events{publisher="tcp://127.0.0.1:7101"}"#] == 3)
        #expect((first[#"onboarding_feed_lag_seconds{publisher="tcp://127.0.0.1:7101"}"#] ?? 0) >= 2.9)
        totals.withLock {
            $0.refusedHandshakes = 3
            $0.slowSubscribers = 1
            $0.droppedReplies = 7
        }
        let second = try await scrape()
        #expect(second["onboarding_bus_refused_handshakes_total"] == 3)
        #expect(second["onboarding_bus_dropped_replies_total"] == 7)
        #expect(second["onboarding_bus_slow_subscribers"] == 1)
        totals.withLock {
            $0.refusedHandshakes = 5
            $0.slowSubscribers = 0
        }
        let third = try await scrape()
        #expect(third["onboarding_bus_refused_handshakes_total"] == 5, "a counter follows its total")
        #expect(third["onboarding_bus_slow_subscribers"] == 0, "a gauge goes down again")
        #expect((third["process_cpu_seconds_total"] ?? 0) >= (first["process_cpu_seconds_total"] ?? 0))
    }

    @Test("every metric a scrape shows is declared, with its help text and kind, in the README's table")
    func declared() async throws {
        let registry = PrometheusCollectorRegistry()
        let factory = CatalogMetricsFactory(registry: registry)
        // What the services make, through the factory the executables bootstrap.
        withMetricsFactory(factory) {
            Counter(label: MetricDefinition.requests.name, dimensions: [("type", "auth.signIn"), ("outcome", "ok")]).increment()
            CoreMetrics.Timer(label: MetricDefinition.requestDuration.name, dimensions: [("type", "auth.signIn"), ("outcome", "ok")])
                .recordNanoseconds(150_000)
            Recorder(label: MetricDefinition.batchSize.name, dimensions: [("kind", "requests")]).record(3)
            Gauge(label: MetricDefinition.outboxRows.name).record(5)
            Meter(label: MetricDefinition.intentStreams.name).increment()
        }
        var logger = Logger(label: "metrics-test")
        logger.logLevel = .warning
        let (listening, port) = AsyncStream.makeStream(of: Int.self)
        let endpoint = MetricsEndpoint(
            host: "127.0.0.1", port: 0, registry: registry, statistics: { BusStatistics() }, logger: logger,
            onListening: { port.yield($0); port.finish() })
        let serving = Task { try await endpoint.run() }
        defer { serving.cancel() }
        var ports = listening.makeAsyncIterator()
        let bound = try #require(await ports.next())
        let (data, _) = try await URLSession.shared.data(from: try #require(URL(string: "http://127.0.0.1:\(bound)/metrics")))
        let text = String(decoding: data, as: UTF8.self)
        let declared = Dictionary(uniqueKeysWithValues: MetricDefinition.all.map { ($0.name, $0) })
        var families = 0
        for line in text.split(separator: "\n") where line.hasPrefix("# TYPE ") {
            let parts = line.split(separator: " ")
            let (name, kind) = (String(parts[2]), String(parts[3]))
            families += 1
            #expect(declared[name]?.kind.rawValue == kind, "\(name) is exported as a \(kind) but declared as \(declared[name]?.kind.rawValue ?? "nothing")")
            #expect(text.contains("# HELP \(name) \(declared[name]?.help ?? "?")"), "\(name) has no help text, or another")
        }
        #expect(families >= 10)
        // The duration histogram's buckets run from 100 µs to 10 s.
        #expect(text.contains(#"le="0.0001""#) && text.contains(#"le="10.0""#))
    }
}
