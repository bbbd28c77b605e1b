import Foundation
import Messaging
import Testing
import ZeroMQMessaging

/// A rough loopback measurement, run on demand: `BENCHMARK=1 swift test -c release --filter ZeroMQBenchmark`.
@Suite("ZeroMQ benchmark", .enabled(if: ProcessInfo.processInfo.environment["BENCHMARK"] != nil))
struct ZeroMQBenchmark {
    @Test("request round trips on loopback")
    func roundTrips() async throws {
        try await withHarness(.zeroMQ) { buses in
            let (endpoint, _) = try await buses.startServer(handler: echoHandler)
            let client = buses.client
            let request = try echoRequest("ping")
            _ = try await client.request(request, to: endpoint, timeout: .seconds(5))

            // Sequential: one request at a time, so this is the latency of a round trip.
            let sequentialCount = 2_000
            var latencies: [Duration] = []
            latencies.reserveCapacity(sequentialCount)
            let sequentialStart = ContinuousClock.now
            for _ in 0..<sequentialCount {
                let start = ContinuousClock.now
                _ = try await client.request(request, to: endpoint, timeout: .seconds(5))
                latencies.append(ContinuousClock.now - start)
            }
            let sequential = ContinuousClock.now - sequentialStart
            latencies.sort()
            func percentile(_ fraction: Double) -> Double {
                seconds(latencies[min(latencies.count - 1, Int(Double(latencies.count) * fraction))]) * 1e6
            }

            // Pipelined: 10,000 requests with up to `window` in flight on one DEALER.
            let total = 10_000
            let window = 100
            let pipelinedStart = ContinuousClock.now
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<total {
                    if index >= window { try await group.next() }
                    group.addTask { _ = try await client.request(request, to: endpoint, timeout: .seconds(10)) }
                }
                try await group.waitForAll()
            }
            let pipelined = ContinuousClock.now - pipelinedStart

            print(String(format: "sequential latency: p50 %.0f µs, p90 %.0f µs, p99 %.0f µs", percentile(0.5), percentile(0.9), percentile(0.99)))
            print(String(
                format: "sequential: %d round trips, %.1f µs each; pipelined (window %d): %d requests in %.3f s, %.0f requests/s, %.1f µs each",
                sequentialCount, seconds(sequential) / Double(sequentialCount) * 1e6, window, total,
                seconds(pipelined), Double(total) / seconds(pipelined), seconds(pipelined) / Double(total) * 1e6))
        }
    }
}

private func seconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
}
