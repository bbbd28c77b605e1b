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

    public init() {}

    public var dataDirectory: String {
        dataDir ?? Settings.environment("ONBOARDING_DATA_DIR") ?? Defaults.dataDirectory
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
        let group = ServiceGroup(
            configuration: .init(
                // A group shuts its services down last to first: the bus comes first so that it
                // stops last, after every service has finished what it had in flight.
                services: [.init(service: bus)]
                    + services.map {
                        .init(service: $0, successTerminationBehavior: .gracefullyShutdownGroup,
                              failureTerminationBehavior: .gracefullyShutdownGroup)
                    },
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: logger))
        logger.info("\(name) started (pid \(ProcessInfo.processInfo.processIdentifier))")
        try await group.run()
        logger.info("\(name) stopped")
    }
}
