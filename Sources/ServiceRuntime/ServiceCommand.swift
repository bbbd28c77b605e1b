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
        var configuration = ServiceGroupConfiguration(
            // A group shuts its services down last to first: the bus comes first so that it
            // stops last, after every service has finished what it had in flight.
            services: [.init(service: bus)]
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

/// The file `<data-dir>/service.token`: the secret every service started on one data directory
/// shares, so that a local deployment needs no set-up.
public struct ServiceTokenFile: Sendable {
    public let path: String

    public init(directory: String) {
        self.path = URL(fileURLWithPath: directory).appendingPathComponent("service.token").path
    }

    /// Reads the token, or creates it when there is none. Safe when several services start at
    /// once: exactly one creates the file, and the others read what it wrote.
    public func readOrCreate() throws -> String {
        if let token = read() { return token }
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent().path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var bytes = [UInt8](repeating: 0, count: 32)
        var generator = SystemRandomNumberGenerator()
        for index in bytes.indices { bytes[index] = generator.next() }
        let token = bytes.map { String(format: "%02x", $0) }.joined()
        let temporary = path + ".\(UUID().uuidString).tmp"
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        guard descriptor >= 0 else {
            throw ServiceError(.storeUnavailable, "Could not write \(temporary); check that the data directory is writable.")
        }
        let written = Array(token.utf8).withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        let synced = fsync(descriptor) == 0
        close(descriptor)
        guard written == token.utf8.count, synced else {
            unlink(temporary)
            throw ServiceError(.storeUnavailable, "Could not write \(temporary); check that the data directory is writable.")
        }
        // link(2) fails if the token file appeared meanwhile: then the other process's wins.
        let linked = link(temporary, path) == 0
        unlink(temporary)
        if linked { return token }
        guard let token = read() else {
            throw ServiceError(.storeUnavailable, "Could not create or read \(path).")
        }
        return token
    }

    private func read() -> String? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        let token = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        return token.isEmpty ? nil : token
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
