import Foundation
import Hummingbird
import Logging
import Messaging
import NIOCore
import OnboardingAPI
import Prometheus
import ServiceLifecycle
import Synchronization

/// A program's figures in Prometheus's text format, at `GET /metrics` on an address of its own
/// (off unless its `*.metrics` setting is set).
///
/// Everything here is read when Prometheus scrapes, never counted per message: the bus's own
/// counts (``BusStatistics``), what the service's own health reply adds (the orchestrator's
/// feeds, auth's unlink queue: one `health` request to itself per scrape), and the process's CPU
/// time, resident memory and open descriptors (from `/proc`). So a program without a scraper
/// pays nothing, and one with a scraper pays a request and a few system calls per scrape.
public struct MetricsEndpoint: Service {
    public let host: String
    public let port: Int
    let statistics: @Sendable () -> BusStatistics
    /// The service's own health reply, or `nil` (the gateway, or no answer in time).
    let health: @Sendable () async -> HealthStatus?
    let logger: Logger
    /// The setting that chose the address, for the error when it cannot be used.
    let setting: String
    /// Called with the port once listening (the real one when `port` is 0).
    let onListening: @Sendable (Int) async -> Void

    public init(
        host: String, port: Int, statistics: @escaping @Sendable () -> BusStatistics,
        health: @escaping @Sendable () async -> HealthStatus? = { nil }, logger: Logger, setting: String = "the metrics setting",
        onListening: @escaping @Sendable (Int) async -> Void = { _ in }
    ) {
        self.setting = setting
        self.host = host
        self.port = port
        self.statistics = statistics
        self.health = health
        self.logger = logger
        self.onListening = onListening
    }

    public func run() async throws {
        let figures = Figures()
        let (statistics, health) = (self.statistics, self.health)
        let router = Router()
        router.get("/metrics") { _, _ -> Response in
            let text = figures.render(bus: statistics(), health: await health(), process: ProcessFigures.read())
            return Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(bytes: text)))
        }
        let (logger, onListening) = (self.logger, self.onListening)
        let application = Application(
            router: router,
            configuration: .init(address: .hostname(host, port: port), serverName: nil),
            onServerRunning: { channel in
                let bound = channel.localAddress?.port ?? 0
                logger.info("metrics at http://\(channel.localAddress?.ipAddress ?? "?"):\(bound)/metrics")
                await onListening(bound)
            },
            logger: logger)
        do {
            try await application.run()
        } catch let error as IOError where error.errnoCode == EADDRINUSE || error.errnoCode == EADDRNOTAVAIL {
            throw ServiceError(
                .addressInUse,
                "Cannot serve metrics at \(host):\(port): \(String(cString: strerror(error.errnoCode))). Give \(setting) a free "
                    + "address of this host, or off.")
        }
    }
}

/// The process's own figures, as Prometheus's client libraries name them.
struct ProcessFigures: Sendable {
    var cpuSeconds: Double = 0
    var residentBytes: Int = 0
    var openDescriptors: Int = 0
    var startTime: Double = 0

    /// Read from `/proc/self` (zeros where it cannot be read).
    static func read() -> ProcessFigures {
        var figures = ProcessFigures()
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        let page = sysconf(Int32(_SC_PAGESIZE))
        // stat: the fields after the command name (which may hold spaces) start at state (3rd).
        if let stat = try? String(contentsOfFile: "/proc/self/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        {
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            // utime and stime are fields 14 and 15, starttime 22 (1-based, counting pid and comm).
            if fields.count > 19, let user = Double(fields[11]), let system = Double(fields[12]), ticks > 0 {
                figures.cpuSeconds = (user + system) / ticks
                if let started = Double(fields[19]), let boot = bootTime() { figures.startTime = boot + started / ticks }
            }
        }
        if let statm = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) {
            let pages = statm.split(separator: " ")
            if pages.count > 1, let resident = Int(pages[1]) { figures.residentBytes = resident * page }
        }
        figures.openDescriptors = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd"))?.count ?? 1) - 1
        return figures
    }

    /// When the machine booted, in seconds since 1970 (`btime` in `/proc/stat`).
    private static func bootTime() -> Double? {
        guard let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8) else { return nil }
        for line in stat.split(separator: "\n") where line.hasPrefix("btime ") {
            return Double(line.dropFirst("btime ".count))
        }
        return nil
    }
}

/// The registry and its metrics, made once; counters follow the running totals they mirror.
final class Figures: Sendable {
    private let registry: PrometheusCollectorRegistry
    private let counters: [(counter: Counter, value: @Sendable (BusStatistics) -> Int)]
    /// What each counter of `counters`, and the CPU time, had reached at the last scrape.
    private let reached = Mutex<(counts: [Int], cpuSeconds: Double)>(([], 0))
    private let slowSubscribers: Gauge
    private let cpu: Counter
    private let resident: Gauge, descriptors: Gauge, started: Gauge
    /// Totals that come with labels (a feed's publisher), made when first seen, and what each
    /// had reached at the last scrape.
    private let labeled = Mutex<[String: (counter: Counter, reached: Int)]>([:])
    private let unlinkPending: Gauge, unlinkOldest: Gauge

    init() {
        let registry = PrometheusCollectorRegistry()
        self.registry = registry
        func counter(_ name: String, _ help: String, _ value: @escaping @Sendable (BusStatistics) -> Int)
            -> (Counter, @Sendable (BusStatistics) -> Int)
        {
            (registry.makeCounter(descriptor: .init(namespace: "onboarding", subsystem: "bus", metricName: name, unitName: "total", helpText: help)), value)
        }
        counters = [
            counter("dropped_events", "Events a subscriber's queue had no room for.", \.droppedEvents),
            counter("unreadable_events", "Events that arrived but could not be read.", \.unreadableEvents),
            counter("overloaded_requests", "Requests refused because the server's queue was full.", \.overloadedRequests),
            counter("rejected_requests", "Requests refused because they could not be read or broke a limit.", \.rejectedRequests),
            counter("late_replies", "Replies that arrived after their caller had given up.", \.lateReplies),
            counter("refused_handshakes", "Connections refused: an unknown CURVE key, or a failed handshake.", \.refusedHandshakes),
            counter("failed_handshakes", "Connections to servers that failed the CURVE handshake.", \.failedHandshakes),
            counter("dropped_replies", "Replies dropped because their caller was not reading them.", \.droppedReplies),
        ]
        slowSubscribers = registry.makeGauge(
            descriptor: .init(
                namespace: "onboarding", subsystem: "bus", metricName: "slow", unitName: "subscribers",
                helpText: "Subscribers of this process that are not reading now."))
        // As Prometheus's client libraries name them.
        func process(_ name: String, _ unit: String, _ help: String) -> MetricNameDescriptor {
            .init(namespace: "process", metricName: name, unitName: unit, helpText: help)
        }
        cpu = registry.makeCounter(descriptor: process("cpu_seconds", "total", "Total user and system CPU time spent in seconds."))
        resident = registry.makeGauge(descriptor: process("resident_memory", "bytes", "Resident memory size in bytes."))
        descriptors = registry.makeGauge(descriptor: process("open", "fds", "Number of open file descriptors."))
        started = registry.makeGauge(
            descriptor: process("start_time", "seconds", "Start time of the process since unix epoch in seconds."))
        unlinkPending = registry.makeGauge(
            descriptor: .init(
                namespace: "onboarding", subsystem: "unlink", metricName: "pending", unitName: "jobs",
                helpText: "Withdrawn accounts still to be unlinked at their provider (auth)."))
        unlinkOldest = registry.makeGauge(
            descriptor: .init(
                namespace: "onboarding", subsystem: "unlink", metricName: "oldest_pending", unitName: "seconds",
                helpText: "How long the oldest unlink job has waited (0 when none waits)."))
    }

    /// The orchestrator's feeds, one series per publisher (its request endpoint).
    private static let feedCounts: [(name: String, help: String, value: @Sendable (FeedStatistics) -> Int)] = [
        ("handled", "Events handled from a publisher, live or replayed.", \.handled),
        ("replayed", "Events fetched with events.after because the live stream skipped them.", \.replayed),
        ("duplicates_dropped", "Events received again after they had been handled, and dropped.", \.duplicatesDropped),
        ("lost", "Events the publisher pruned before they could be fetched.", \.lost),
    ]

    private func follow(_ feeds: [FeedStatistics]) {
        labeled.withLock { labeled in
            for feed in feeds {
                for (name, help, value) in Self.feedCounts {
                    let key = "\(name) \(feed.publisher)"
                    let entry = labeled[key] ?? (
                        registry.makeCounter(
                            descriptor: .init(
                                namespace: "onboarding", subsystem: "feed", metricName: name, unitName: "total", helpText: help),
                            labels: [("publisher", feed.publisher)]), 0)
                    let now = value(feed)
                    if now > entry.reached { entry.counter.increment(by: Int64(now - entry.reached)) }
                    labeled[key] = (entry.counter, max(entry.reached, now))
                }
            }
        }
    }

    /// The text of one scrape. Scrapes may overlap: each counter moves by what its total
    /// gained since the last one, under one lock.
    func render(bus: BusStatistics, health: HealthStatus?, process: ProcessFigures) -> [UInt8] {
        let totals = counters.map { $0.value(bus) }
        let (gains, cpuGain) = reached.withLock { reached in
            if reached.counts.isEmpty { reached.counts = Array(repeating: 0, count: totals.count) }
            let gains = zip(totals, reached.counts).map { max(0, $0 - $1) }
            reached.counts = zip(totals, reached.counts).map { max($0, $1) }
            let cpuGain = max(0, process.cpuSeconds - reached.cpuSeconds)
            reached.cpuSeconds = max(reached.cpuSeconds, process.cpuSeconds)
            return (gains, cpuGain)
        }
        for (entry, gain) in zip(counters, gains) where gain > 0 { entry.counter.increment(by: Int64(gain)) }
        if cpuGain > 0 { cpu.increment(by: cpuGain) }
        slowSubscribers.set(Double(bus.slowSubscribers))
        resident.set(Double(process.residentBytes))
        descriptors.set(Double(process.openDescriptors))
        started.set(process.startTime)
        if let feeds = health?.feeds { follow(feeds) }
        if let unlink = health?.unlink {
            unlinkPending.set(Double(unlink.pending))
            unlinkOldest.set(Double(unlink.oldestPendingSeconds ?? 0))
        }
        var buffer: [UInt8] = []
        registry.emit(into: &buffer)
        return buffer
    }
}
