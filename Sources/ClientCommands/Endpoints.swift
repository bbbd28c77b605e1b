import ArgumentParser
import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingClient
import OnboardingSettings
import ServiceHosting
import ZeroMQMessaging

/// Where the services are, for the command-line tools: each a flag, with its environment
/// variable and default from the setting's declaration.
public struct EndpointOptions: ParsableArguments {
    @Option(help: ArgumentHelp(Setting.authRPC.helpLine))
    var authRpc: String?
    @Option(help: ArgumentHelp(Setting.profileRPC.helpLine))
    var profileRpc: String?
    @Option(help: ArgumentHelp(Setting.imageRPC.helpLine))
    var imageRpc: String?
    @Option(help: ArgumentHelp(Setting.orchestratorRPC.helpLine))
    var orchestratorRpc: String?
    @Option(help: ArgumentHelp(Setting.routes.helpLine))
    var routes: String?
    @Option(help: ArgumentHelp(Setting.keysDir.helpLine))
    var keysDir: String?
    @Option(help: ArgumentHelp(Setting.keyName.helpLine))
    var keyName: String?

    public init() {}

    /// The flags given, by setting.
    var flags: [Setting: String] {
        [
            Setting.authRPC: authRpc, .profileRPC: profileRpc, .imageRPC: imageRpc, .orchestratorRPC: orchestratorRpc,
            .routes: routes, .keysDir: keysDir, .keyName: keyName,
        ].compactMapValues { $0 }
    }

    /// The bus configuration of `program`: its CURVE keys, as the flags (these and `more`, such
    /// as the tool's `--data-dir`) and the environment say.
    public func busConfiguration(for program: Program, more: [Setting: String?] = [:]) throws -> ZeroMQBus.Configuration {
        do {
            let settings = Settings(flags: flags.merging(more.compactMapValues { $0 }) { mine, _ in mine })
            return try BusSecurity.busConfiguration(for: program, settings: settings)
        } catch let error as SettingError {
            // One line, without the usage text a ValidationError would add: nothing was misused.
            FileHandle.standardError.write(Data("\(program.rawValue): \(error)\n".utf8))
            throw ExitCode(2)
        }
    }

    /// Checks every endpoint before the command runs, so the getters below cannot fail.
    public func validate() throws {
        let settings = Settings(flags: flags)
        do {
            for setting in [Setting.authRPC, .profileRPC, .imageRPC, .orchestratorRPC, .routes] {
                _ = try settings.endpoint(setting)
            }
        } catch let error as SettingError {
            throw ValidationError(error.description)
        }
    }

    private func endpoint(_ setting: Setting) -> Endpoint {
        (try? Settings(flags: flags).endpoint(setting)) ?? Endpoint(setting.defaultText)
    }

    public var authRPC: Endpoint { endpoint(.authRPC) }
    public var profileRPC: Endpoint { endpoint(.profileRPC) }
    public var imageRPC: Endpoint { endpoint(.imageRPC) }
    public var orchestratorRPC: Endpoint { endpoint(.orchestratorRPC) }
    public var routesEndpoint: Endpoint { endpoint(.routes) }

    func clientConfiguration(_ calls: CallOptions) -> OnboardingClient.Configuration {
        OnboardingClient.Configuration(
            authRPC: authRPC, profileRPC: profileRPC, orchestratorRPC: orchestratorRPC, routes: routesEndpoint,
            timeout: .milliseconds(calls.timeoutMs), deadline: .milliseconds(calls.deadlineMs))
    }

    /// Every service's name and request endpoint.
    public var services: [(name: String, endpoint: Endpoint)] {
        [(ServiceName.auth, authRPC), (ServiceName.profile, profileRPC), (ServiceName.imageUpload, imageRPC),
         (ServiceName.orchestrator, orchestratorRPC)]
    }
}

/// How long the client tools wait for replies, and keep resending.
struct CallOptions: ParsableArguments {
    @Option(help: "How long to wait for a reply, in milliseconds.")
    var timeoutMs: Int = 3000
    @Option(help: "How long to keep resending a request that is safe to repeat while the service does not answer, in milliseconds.")
    var deadlineMs: Int = 10_000
}

/// Runs `body` with a ZeroMQ bus, shutting the bus down afterwards; a ``ServiceError`` is
/// printed with its code and a hint, and the command exits with status 1.
func withBus<T: Sendable>(
    name: String, configuration: ZeroMQBus.Configuration, _ body: (ZeroMQBus) async throws -> T
) async throws -> T {
    var logger = Logger(label: name)
    logger.logLevel = .warning
    let bus = ZeroMQBus(source: name, logger: logger, configuration: configuration)
    do {
        let value = try await body(bus)
        await bus.shutdown()
        return value
    } catch let error as ServiceError {
        await bus.shutdown()
        Terminal.report(error)
        throw ExitCode.failure
    } catch {
        await bus.shutdown()
        throw error
    }
}

/// Sets up logging for a command-line tool: warnings and worse, to standard error.
func bootstrapToolLogging() {
    LoggingSystem.bootstrap { label in
        var handler = StreamLogHandler.standardError(label: label)
        handler.logLevel = .warning
        return handler
    }
}
