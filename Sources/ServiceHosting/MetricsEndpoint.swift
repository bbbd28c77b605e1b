import Foundation
import Hummingbird
import Logging
import Messaging
import NIOCore
import OnboardingAPI
import Prometheus
import ServiceRuntime
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
    /// Where the services' own metrics are (``ProcessMetrics``); the figures read at scrape
    /// time are added to it.
    let registry: PrometheusCollectorRegistry

    public init(
        host: String, port: Int, registry: PrometheusCollectorRegistry = PrometheusCollectorRegistry(),
        statistics: @escaping @Sendable () -> BusStatistics,
        health: @escaping @Sendable () async -> HealthStatus? = { nil }, logger: Logger, setting: String = "the metrics setting",
        onListening: @escaping @Sendable (Int) async -> Void = { _ in }
    ) {
        self.setting = setting
        self.registry = registry
        self.host = host
        self.port = port
        self.statistics = statistics
        self.health = health
        self.logger = logger
        self.onListening = onListening
    }

    public func run() async throws {
        let figures = Figures(registry: registry)
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

/// The figures read at scrape time, made once in the program's registry; counters follow the
/// running totals they mirror.
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

    init(registry: PrometheusCollectorRegistry) {
        self.registry = registry
        counters = MetricDefinition.busCounts.map { (registry.makeCounter(descriptor: $0.definition.descriptor), $0.value) }
        slowSubscribers = registry.makeGauge(descriptor: MetricDefinition.slowSubscribers.descriptor)
        cpu = registry.makeCounter(descriptor: MetricDefinition.processCPU.descriptor)
        resident = registry.makeGauge(descriptor: MetricDefinition.processResident.descriptor)
        descriptors = registry.makeGauge(descriptor: MetricDefinition.processDescriptors.descriptor)
        started = registry.makeGauge(descriptor: MetricDefinition.processStart.descriptor)
        unlinkPending = registry.makeGauge(descriptor: MetricDefinition.unlinkPending.descriptor)
        unlinkOldest = registry.makeGauge(descriptor: MetricDefinition.unlinkOldest.descriptor)
    }

    private func follow(_ feeds: [FeedStatistics]) {
        labeled.withLock { labeled in
            for feed in feeds {
                for (definition, value) in MetricDefinition.feedCounts {
                    let key = "\(definition.name) \(feed.publisher)"
                    let entry = labeled[key] ?? (
                        registry.makeCounter(descriptor: definition.descriptor, labels: [("publisher", feed.publisher)]), 0)
                    let now = value(feed)
                    if now > entry.reached { entry.counter.increment(by: Int64(now - entry.reached)) }
                    labeled[key] = (entry.counter, max(entry.reached, now))
                }
                let lag = feed.lag()
                let publisher = [("publisher", feed.publisher)]
                registry.makeGauge(descriptor: MetricDefinition.feedLagEvents.descriptor, labels: publisher).set(Double(lag.events))
                registry.makeGauge(descriptor: MetricDefinition.feedLagSeconds.descriptor, labels: publisher).set(lag.seconds)
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

extension MetricDefinition {
    /// Its name and help text, as swift-prometheus takes them.
    var descriptor: MetricNameDescriptor {
        MetricNameDescriptor(metricName: name, unitName: "", helpText: help)
    }
}
