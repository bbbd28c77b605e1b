import Foundation
import Logging
import Messaging
import OnboardingAPI
import ServiceHosting
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
}
