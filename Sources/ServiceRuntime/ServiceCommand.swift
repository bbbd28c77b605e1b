import ArgumentParser
import Foundation
import Logging
import Messaging
@_exported import OnboardingAPI
import ServiceLifecycle
import ZeroMQMessaging

/// Options every service executable takes.
public struct CommonServiceOptions: ParsableArguments {
    @Option(name: .long, help: "Where databases and images are kept. Env: ONBOARDING_DATA_DIR. Default: \(Defaults.dataDirectory)")
    public var dataDir: String?

    @Option(name: .long, help: "trace, debug, info, notice, warning, error or critical. Env: ONBOARDING_LOG_LEVEL. Default: info")
    public var logLevel: String?

    @Option(
        name: .long,
        help: "The secret our services share for calls between them. Env: ONBOARDING_SERVICE_TOKEN. Default: read from <data-dir>/service.token, which is created on first use. Prefer the file or the variable: other local users can see command lines.")
    public var serviceToken: String?

    public init() {}

    public var dataDirectory: String {
        dataDir ?? Settings.environment("ONBOARDING_DATA_DIR") ?? Defaults.dataDirectory
    }

    /// The service token: the flag, the environment, or the token file in the data directory
    /// (created with a new random secret, readable by this user only, when there is none).
    public func resolvedServiceToken() throws -> String {
        if let serviceToken, !serviceToken.isEmpty { return serviceToken }
        if let token = Settings.environment("ONBOARDING_SERVICE_TOKEN") { return token }
        return try ServiceTokenFile(directory: dataDirectory).readOrCreate()
    }

    public var level: Logger.Level {
        let text = logLevel ?? Settings.environment("ONBOARDING_LOG_LEVEL") ?? "info"
        return Logger.Level(rawValue: text.lowercased()) ?? .info
    }
}

/// Starting a service process: logging, the ZeroMQ bus, and a `ServiceGroup` that stops
/// everything cleanly on SIGTERM or SIGINT.
public enum ServiceHost {
    /// Sets up logging to standard error at `level`, once per process.
    public static func bootstrapLogging(level: Logger.Level) {
        // A closed log reader must not kill the service mid-shutdown: writes fail instead.
        signal(SIGPIPE, SIG_IGN)
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
    }

    /// Runs `makeServices` on a new ZeroMQ bus until SIGTERM or SIGINT.
    ///
    /// The bus is shut down last, after every service has finished what it had in flight.
    public static func run(
        name: String, logger: Logger,
        makeServices: (ZeroMQBus) async throws -> [any Service]
    ) async throws {
        let bus = ZeroMQBus(source: name, logger: logger)
        let services: [any Service]
        do {
            services = try await makeServices(bus)
        } catch {
            await bus.shutdown()
            throw error
        }
        var watched = services
        if let value = Settings.environment("ONBOARDING_EXIT_WITH_PARENT"), let parent = pid_t(value) {
            watched.append(ParentWatch(parent: parent, logger: logger))
        }
        var configuration = ServiceGroupConfiguration(
            // A group shuts its services down last to first: the bus comes first so that it
            // stops last, after every service has finished what it had in flight.
            services: [.init(service: bus)]
                + watched.map {
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

/// Options of a service that publishes events from an outbox (auth, profile).
public struct EventRetentionOptions: ParsableArguments {
    @Option(
        name: .long,
        help: "How many hours of published events to keep for subscribers to replay (1 to 87600). Env: ONBOARDING_EVENT_RETENTION_HOURS. Default: \(Defaults.eventRetentionHours)")
    public var eventRetentionHours: Int?

    public init() {}

    /// The retention window: the flag, the environment, or the default.
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` when the hours are out of range.
    public func retention() throws -> Outbox.Retention {
        Outbox.Retention(maxAge: .seconds(try Settings.eventRetentionHours(eventRetentionHours) * 3600))
    }
}
