import ArgumentParser
import CoreMetrics
import Foundation
import Logging
import Messaging
import OTel
import OnboardingAPI
import OnboardingSettings
import Prometheus
import ServiceLifecycle
import ZeroMQMessaging

/// A service executable: which program it is, and the services it runs on a ZeroMQ bus.
///
/// An executable is this much:
///
/// ```swift
/// @main
/// enum Main: HostedProgram {
///     static let program = Program.profile
///     static let abstract = "Keeps profiles and usernames."
///     static let name = ServiceName.profile
///     static func services(_ host: Host) async throws -> [any Service] {
///         [try ProfileService(configuration: .init(host.settings), bus: host.bus, logger: host.logger)]
///     }
/// }
/// ```
///
/// ``HostCommand`` does the rest: flags, `--help` made from the settings' declarations,
/// `--config`, `--print-config`, checking every setting before anything starts, logging, the
/// bus, a `ServiceGroup` that stops on SIGTERM or SIGINT, and `ONBOARDING_EXIT_WITH_PARENT`.
public protocol HostedProgram {
    static var program: Program { get }
    /// One sentence for `--help`.
    static var abstract: String { get }
    /// The name the program signs its messages with (the envelope's `source`) and logs under.
    static var name: String { get }
    /// Builds the program's services. Called once, after the settings were checked.
    static func services(_ host: Host) async throws -> [any Service]
}

extension HostedProgram {

    /// Runs the program with the process's arguments and environment.
    public static func main() async {
        await HostCommand<Self>.main()
    }
}

/// What a program's services are built from.
public struct Host: Sendable {
    public let settings: Settings
    public let bus: ZeroMQBus
    public let logger: Logger
}

/// The command line of every service executable: the options below, and any of the program's
/// settings as `--name value` (listed by `--help`).
public struct HostCommand<Hosted: HostedProgram>: AsyncParsableCommand {
    public static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: Hosted.program.rawValue,
            abstract: Hosted.abstract,
            discussion: """
                Each setting is a flag, an environment variable or a key in the configuration file, \
                in that order of precedence; the README's Configuration lists them all.

                \(Setting.help(for: Hosted.program))
                """)
    }

    @Option(help: ArgumentHelp("A JSON file of settings, nested by key: {\"auth\": {\"rpc\": \"tcp://…\"}}. Env: \(Settings.fileVariable).", valueName: "file"))
    var config: String?

    @Flag(help: "Print the settings in force (secrets hidden) and where each came from, then exit.")
    var printConfig = false

    @Argument(parsing: .allUnrecognized, help: ArgumentHelp("Settings, as --name value: see below.", valueName: "settings"))
    var settingArguments: [String] = []

    public init() {}

    public func run() async throws {
        let settings: Settings
        do {
            let flags = try Setting.parseFlags(settingArguments, for: Hosted.program)
            settings = try await Settings(flags: flags, environment: ProcessInfo.processInfo.environment, file: config)
            try settings.validate(for: Hosted.program)
        } catch let error as SettingError {
            FileHandle.standardError.write(Data("\(Hosted.program.rawValue): \(error)\n".utf8))
            throw ExitCode(2)
        }
        if printConfig {
            print(settings.effectiveConfiguration(for: Hosted.program))
            return
        }
        let level = Logger.Level(rawValue: (try? settings.choice(.logLevel)) ?? "info") ?? .info
        Hosting.bootstrapLogging(level: level, traced: settings.text(.otlpEndpoint) != nil)
        let logger = Logger(label: Hosted.name)
        do {
            try Self.checkReplicasShareAStore(settings)
            let bus = try BusSecurity.busConfiguration(for: Hosted.program, settings: settings)
            let metrics = try Setting.metrics(for: Hosted.program).flatMap { try settings.optionalHTTPAddress($0) }
                .map { (host: $0.host, port: $0.port, own: try Self.requestEndpoint(settings)) }
            let metricsSetting = Setting.metrics(for: Hosted.program)?.environmentVariable ?? "the metrics setting"
            try await Hosting.run(
                name: Hosted.name, settings: settings, logger: logger, bus: bus,
                metrics: metrics.map { ($0.host, $0.port, $0.own, metricsSetting) }
            ) { bus in
                try await Hosted.services(Host(settings: settings, bus: bus, logger: logger))
            }
        } catch let error as SettingError {
            logger.critical("\(error)")
            throw ExitCode(2)
        } catch let error as ServiceError {
            // A setting that only the service's own checks refuse, or a store that cannot open:
            // one line that says what to do, not a stack of wrapped errors.
            logger.critical("\(error.message)")
            throw ExitCode.failure
        }
    }
}

extension HostCommand {
    /// Where the program answers requests (its metrics ask it for its own health there), or
    /// `nil` for the gateway, which answers none on the bus.
    static func requestEndpoint(_ settings: Settings) throws -> Endpoint? {
        try BusSecurity.ownRequestEndpoint(of: Hosted.program, settings: settings)
    }

    /// Replicas of a service that keeps a store must share it: with SQLite each would keep its
    /// own accounts and number its own events.
    static func checkReplicasShareAStore(_ settings: Settings) throws {
        guard Program.publishers.contains(Hosted.program), settings.text(.postgresURL) == nil,
            let own = BusSecurity.requestSetting(of: Hosted.program)
        else { return }
        let replicas = try settings.endpoint(own).replicas.count
        guard replicas == 1 else {
            throw SettingError(
                "\(own.environmentVariable) lists \(replicas) replicas, but they would each keep a SQLite file of their own: "
                    + "set \(Setting.postgresURL.environmentVariable) so that they share one PostgreSQL database")
        }
    }

}

/// Starting a program's services: logging, the ZeroMQ bus, and a `ServiceGroup` that stops
/// everything cleanly on SIGTERM or SIGINT.
public enum Hosting {
    /// Sets up logging to standard error at `level`, once per process; with `traced`, each line
    /// written inside a traced request or event carries its `trace_id` and `span_id`.
    public static func bootstrapLogging(level: Logger.Level, traced: Bool = false) {
        // A closed log reader must not kill the service mid-shutdown: writes fail instead.
        signal(SIGPIPE, SIG_IGN)
        let provider = traced ? OTel.makeLoggingMetadataProvider() : nil
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label, metadataProvider: provider)
            handler.logLevel = level
            return handler
        }
    }

    /// Runs `makeServices` on a new ZeroMQ bus until SIGTERM or SIGINT, or until the process
    /// that started this one has gone (`ONBOARDING_EXIT_WITH_PARENT`); with `metrics`, also
    /// serves the program's figures there (``MetricsEndpoint``).
    ///
    /// The bus is shut down last, after every service has finished what it had in flight.
    public static func run(
        name: String, settings: Settings, logger: Logger, bus configuration: ZeroMQBus.Configuration,
        metrics: (host: String, port: Int, own: Endpoint?, setting: String)? = nil,
        makeServices: (ZeroMQBus) async throws -> [any Service]
    ) async throws {
        let bus = ZeroMQBus(source: name, logger: logger, configuration: configuration)
        // Before any service makes its handles: they are made from the process's factory.
        let registry = PrometheusCollectorRegistry()
        if metrics != nil { MetricsSystem.bootstrap(CatalogMetricsFactory(registry: registry)) }
        var services: [any Service]
        let tracer: (any Service)?
        do {
            tracer = try TraceExport.bootstrap(name: name, settings: settings, logger: logger)
            services = try await makeServices(bus)
            if let metrics {
                let own = metrics.own
                services.append(
                    MetricsEndpoint(
                        host: metrics.host, port: metrics.port, registry: registry, statistics: { bus.statistics },
                        health: {
                            guard let own else { return nil }
                            return try? await bus.call(HealthCheck(), to: own, source: name, timeout: .seconds(2))
                        },
                        logger: logger, setting: metrics.setting))
            }
            if let parent = try settings.optionalInteger(.exitWithParent) {
                services.append(ParentWatch(parent: pid_t(parent), logger: logger))
            }
        } catch {
            await bus.shutdown()
            throw error
        }
        var configuration = ServiceGroupConfiguration(
            // A group shuts its services down last to first: the bus comes first so that it
            // stops last, after every service has finished what it had in flight.
            services: [.init(service: bus)]
                // After the services, before the bus: spans are sent once the services have stopped.
                + (tracer.map { [.init(service: $0)] } ?? [])
                + services.map {
                    .init(service: $0, successTerminationBehavior: .gracefullyShutdownGroup,
                          failureTerminationBehavior: .gracefullyShutdownGroup)
                },
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger)
        // A drain that outlasts this is cancelled rather than left to hang the process.
        configuration.maximumGracefulShutdownDuration = .seconds(10)
        let group = ServiceGroup(configuration: configuration)
        logger.info("\(name) started (pid \(ProcessInfo.processInfo.processIdentifier))")
        try await group.run()
        logger.info("\(name) stopped")
    }
}

/// Stops the process (gracefully) once its parent is no longer `parent`: the process that
/// started it has gone. Enabled with `ONBOARDING_EXIT_WITH_PARENT=<that process's pid>`, which
/// the tests that start executables set, so that a test run that crashes leaves no services
/// behind holding its ports and its output pipes.
struct ParentWatch: Service {
    let parent: pid_t
    let logger: Logger

    func run() async throws {
        do {
            try await cancelWhenGracefulShutdown {
                while getppid() == parent { try await Task.sleep(for: .milliseconds(500)) }
                logger.warning("the process that started this one (pid \(parent)) has gone; stopping")
            }
        } catch is CancellationError {
            // Stopping for another reason.
        }
    }
}

/// Traces over OTLP, when the program's `ONBOARDING_OTLP_ENDPOINT` is set (see ``Traces``).
enum TraceExport {
    /// Bootstraps swift-otel's tracer for the process and turns ``Traces`` on; returns the
    /// service that sends the spans, or `nil` when no endpoint is set.
    ///
    /// Only traces: metrics stay with Prometheus and logs on standard error. `OTEL_*` variables
    /// still override what is set here (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json`, say).
    static func bootstrap(name: String, settings: Settings, logger: Logger) throws -> (any Service)? {
        guard let endpoint = try settings.url(.otlpEndpoint) else { return nil }
        let percent = try settings.integer(.traceSamplePercent)
        var configuration = OTel.Configuration.default
        configuration.serviceName = name
        configuration.diagnosticLogLevel = .warning
        configuration.metrics.enabled = false
        configuration.logs.enabled = false
        configuration.propagators = [.traceContext]
        configuration.traces.sampler = .parentBasedTraceIDRatio(ratio: Double(percent) / 100) ?? .parentBasedAlwaysOn
        configuration.traces.otlpExporter.protocol = .httpProtobuf
        // Set explicitly, the endpoint is used as it is: the path is ours to add.
        configuration.traces.otlpExporter.endpoint = (endpoint.hasSuffix("/") ? String(endpoint.dropLast()) : endpoint) + "/v1/traces"
        configuration.traces.batchSpanProcessor.scheduleDelay = .seconds(1)
        let service = try OTel.bootstrap(configuration: configuration)
        Traces.enable()
        logger.info("spans go to \(configuration.traces.otlpExporter.endpoint) (OTLP over HTTP; \(percent) % of new traces kept)")
        return service
    }
}
