import AuthService
import Foundation
import ImageUploadService
import Logging
import OnboardingClient
import OnboardingOrchestrator
import ProfileService
import ServiceLifecycle
import ServiceRuntime
import Synchronization

/// The whole onboarding system in this process: auth, profile, image-upload and the
/// orchestrator on one ``InProcessBus``, with their databases and images in a temporary folder
/// and auth in dev mode (sign-in takes a subject, no ID token).
///
/// ```swift
/// try await InProcessSystem.run { system in
///     let app = system.client()
///     let uid = try await app.signIn(provider: .kakao, subject: "minji").uid
///     for await received in try await app.intents() { … }   // presentProfileSetup, …
///     #expect(try await system.profile(of: uid) == nil)
/// }
/// ```
///
/// ``run(_:_:)`` starts it, runs your test, and stops it (also when the test throws);
/// ``start(_:)`` and ``stop()`` do the same in two steps. When `start` returns, every service
/// answers requests and follows the others' events.
///
/// To play one service yourself, leave it out (``Configuration/leftOut``) and start a
/// ``StandInService`` at its endpoint; calls to a service left out and not played fail with
/// `noResponder`.
///
/// Thread safety: every member may be used from any task.
public final class InProcessSystem: Sendable {
    /// The four services.
    public enum Part: String, Sendable, Hashable, CaseIterable {
        case auth, profile, imageUpload, orchestrator
    }

    /// How the system is set up. The defaults suit most tests.
    public struct Configuration: Sendable {
        /// Services not to start (to play them with a ``StandInService``, or to see callers get
        /// `noResponder`).
        public var leftOut: Set<Part>
        /// The secret the services share (``InProcessSystem/serviceToken``).
        public var serviceToken: String
        /// How long the orchestrator waits for each call to another service, and its backoff
        /// between retries of profile checks and clean-ups.
        public var orchestratorCallTimeout: Duration
        public var orchestratorRetry: RetryPolicy
        /// How much the services log (to standard error); `.error` by default (`.warning` shows
        /// their retries, `.debug` everything).
        public var logLevel: Logger.Level
        /// How long a new subscription on ``InProcessSystem/bus`` takes to start receiving (see
        /// ``InProcessBus/init(source:joinDelay:)``): 20 ms by default, so that code which would
        /// miss the first events after subscribing on ZeroMQ misses them here too. `.zero` joins
        /// at once.
        public var joinDelay: Duration
        /// Where databases and images go; by default a new folder under the temporary
        /// directory, deleted by ``InProcessSystem/stop()``. A folder you name is kept.
        public var directory: URL?
        /// Where auth, profile and the orchestrator keep their stores instead of SQLite files in
        /// ``directory`` (PostgreSQL, say: `AuthPostgresDatabase`, `ProfilePostgresDatabase`,
        /// `OrchestratorPostgresDatabase`); `nil` keeps the file.
        public var authDatabase: (any AuthDatabase)?
        public var profileDatabase: (any ProfileDatabase)?
        public var orchestratorDatabase: (any OrchestratorDatabase)?
        /// How many of each service run (1 by default). More than one needs all three stores
        /// above (replicas share them): replica 1 binds `inproc://auth`, replica 2
        /// `inproc://auth-2`, and so on, and ``InProcessSystem/endpoints`` lists them all. One
        /// orchestrator leads; the others stand by.
        public var replicas = 1

        public init(
            leftOut: Set<Part> = [],
            serviceToken: String = "in-process-service-token",
            orchestratorCallTimeout: Duration = .seconds(2),
            orchestratorRetry: RetryPolicy = RetryPolicy(),
            logLevel: Logger.Level = .error,
            joinDelay: Duration = .milliseconds(20),
            directory: URL? = nil
        ) {
            self.leftOut = leftOut
            self.serviceToken = serviceToken
            self.orchestratorCallTimeout = orchestratorCallTimeout
            self.orchestratorRetry = orchestratorRetry
            self.logLevel = logLevel
            self.joinDelay = joinDelay
            self.directory = directory
        }
    }

    /// The bus every service is on. Bind your own stand-ins and subscribers here.
    public let bus: InProcessBus
    /// Where each service listens (``SystemEndpoints/inProcess``; with replicas, each endpoint lists them).
    public let endpoints: SystemEndpoints
    /// The folder with the databases (`auth.sqlite`, `profile.sqlite`, `orchestrator.sqlite`)
    /// and ``imagesDirectory``.
    public let directory: URL
    public let configuration: Configuration

    private let group: ServiceGroup
    private let running: Task<Void, any Error>
    private let stopped = Atomic(false)
    private let removesDirectory: Bool

    private init(
        bus: InProcessBus, directory: URL, removesDirectory: Bool, configuration: Configuration, group: ServiceGroup,
        running: Task<Void, any Error>
    ) {
        self.bus = bus
        self.endpoints = Self.endpoints(replicas: configuration.replicas)
        self.directory = directory
        self.removesDirectory = removesDirectory
        self.configuration = configuration
        self.group = group
        self.running = running
    }

    /// Where image-upload keeps images: `<uid>/<name>.<ext>` and their thumbnails.
    public var imagesDirectory: URL { directory.appendingPathComponent("images") }

    /// The secret the services share: put it in an envelope's `serviceToken` to call as one of them.
    public var serviceToken: String { configuration.serviceToken }

    // MARK: Starting and stopping

    /// Starts the system and returns once every service it runs answers `health`.
    ///
    /// Call ``stop()`` when done, or use ``run(_:_:)``, which cannot forget to.
    /// - Throws: the error of a service that could not start (a folder it cannot write, say),
    ///   or `timeout` when the services did not all answer within 60 seconds.
    public static func start(_ configuration: Configuration = Configuration()) async throws -> InProcessSystem {
        let directory = configuration.directory
            ?? FileManager.default.temporaryDirectory.appendingPathComponent("onboarding-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        var logger = Logger(label: "in-process-system")
        logger.logLevel = configuration.logLevel
        let bus = InProcessBus(source: "in-process-bus", joinDelay: configuration.joinDelay)
        let services: [any Service]
        do {
            services = try makeServices(configuration, directory: directory, bus: bus, logger: logger)
        } catch {
            if configuration.directory == nil { try? FileManager.default.removeItem(at: directory) }
            throw error
        }
        let group = ServiceGroup(services: services, logger: logger)
        let outcome = Outcome()
        let running = Task {
            do {
                try await group.run()
                outcome.set(.success(()))
            } catch {
                outcome.set(.failure(error))
                throw error
            }
        }
        let system = InProcessSystem(
            bus: bus, directory: directory, removesDirectory: configuration.directory == nil,
            configuration: configuration, group: group, running: running)
        do {
            try await system.waitUntilReady(outcome: outcome)
        } catch {
            try? await system.stop()
            throw error
        }
        return system
    }

    /// Starts the system, runs `body` with it, and stops it, also when `body` throws.
    ///
    /// - Returns: what `body` returns.
    /// - Throws: what `body` throws; otherwise what ``start(_:)`` or ``stop()`` throw.
    public static func run<Result: Sendable>(
        _ configuration: Configuration = Configuration(),
        _ body: (InProcessSystem) async throws -> Result
    ) async throws -> Result {
        let system = try await start(configuration)
        let result: Result
        do {
            result = try await body(system)
        } catch {
            try? await system.stop()
            throw error
        }
        try await system.stop()
        return result
    }

    /// Stops every service gracefully (requests in flight are answered first), waits until they
    /// have, and deletes the temporary folder. Calling it again does nothing.
    ///
    /// - Throws: the error a service stopped with, if one failed while running.
    public func stop() async throws {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        await group.triggerGracefulShutdown()
        defer {
            if removesDirectory { try? FileManager.default.removeItem(at: directory) }
        }
        try await running.value
    }

    private static func makeServices(
        _ configuration: Configuration, directory: URL, bus: InProcessBus, logger: Logger
    ) throws -> [any Service] {
        let replicas = configuration.replicas
        guard replicas >= 1 else { throw ServiceError(.invalidRequest, "Configuration.replicas is \(replicas): give 1 or more.") }
        guard replicas == 1
            || (configuration.authDatabase != nil && configuration.profileDatabase != nil && configuration.orchestratorDatabase != nil)
        else {
            throw ServiceError(
                .invalidRequest,
                "\(replicas) replicas need authDatabase, profileDatabase and orchestratorDatabase (PostgreSQL): replicas share their stores.")
        }
        // Every service calls the others at the lists; replica `n` binds entry `n` of its own.
        let e = Self.endpoints(replicas: replicas)
        let token = configuration.serviceToken
        func database(_ name: String) -> String { directory.appendingPathComponent(name).path }
        var services: [any Service] = []
        let parts = Set(Part.allCases).subtracting(configuration.leftOut)
        for n in 0..<replicas {
            if parts.contains(.auth) {
                services.append(try AuthService(
                    configuration: .init(
                        rpc: e.authRPC.replicas[n], events: e.authEvents.replicas[n], databasePath: database("auth.sqlite"),
                        devMode: true, serviceToken: token, database: configuration.authDatabase),
                    bus: bus, logger: logger))
            }
            if parts.contains(.profile) {
                services.append(try ProfileService(
                    configuration: .init(
                        rpc: e.profileRPC.replicas[n], events: e.profileEvents.replicas[n], authRPC: e.authRPC,
                        databasePath: database("profile.sqlite"), serviceToken: token, database: configuration.profileDatabase),
                    bus: bus, logger: logger))
            }
            if parts.contains(.imageUpload) {
                services.append(try ImageUploadService(
                    configuration: .init(
                        rpc: e.imageRPC.replicas[n], directory: directory.appendingPathComponent("images").path, serviceToken: token),
                    bus: bus, logger: logger))
            }
            if parts.contains(.orchestrator) {
                services.append(try OnboardingOrchestrator(
                    configuration: .init(
                        rpc: e.orchestratorRPC.replicas[n], routes: e.routes.replicas[n], authRPC: e.authRPC,
                        authEvents: e.authEvents, profileRPC: e.profileRPC, profileEvents: e.profileEvents, imageRPC: e.imageRPC,
                        databasePath: database("orchestrator.sqlite"), callTimeout: configuration.orchestratorCallTimeout,
                        retryPolicy: configuration.orchestratorRetry, serviceToken: token,
                        database: configuration.orchestratorDatabase),
                    bus: bus, logger: logger))
            }
        }
        return services
    }

    /// ``SystemEndpoints/inProcess`` with each endpoint listing `replicas` names: `inproc://auth`,
    /// `inproc://auth-2`, and so on.
    static func endpoints(replicas: Int) -> SystemEndpoints {
        guard replicas > 1 else { return .inProcess }
        func list(_ first: Endpoint) -> Endpoint {
            Endpoint(replicas: [first] + (2...replicas).map { Endpoint("\(first.rawValue)-\($0)") })
        }
        let e = SystemEndpoints.inProcess
        return SystemEndpoints(
            authRPC: list(e.authRPC), authEvents: list(e.authEvents), profileRPC: list(e.profileRPC),
            profileEvents: list(e.profileEvents), imageRPC: list(e.imageRPC), orchestratorRPC: list(e.orchestratorRPC),
            routes: list(e.routes))
    }

    /// Waits until every service started answers `health`, or one of them fails.
    private func waitUntilReady(outcome: Outcome) async throws {
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: .seconds(60))
        let parts = Set(Part.allCases).subtracting(configuration.leftOut)
        let waiting = endpoints.rpcEndpoints.filter { entry in parts.contains { $0.serviceName == entry.service } }
        for (service, endpoint) in waiting {
            while true {
                if let outcome = outcome.value {
                    if case .failure(let error) = outcome { throw error }
                    throw ServiceError(.shuttingDown, "The in-process system stopped before \(service) answered.")
                }
                do {
                    _ = try await bus.call(HealthCheck(), to: endpoint, source: "in-process-system", timeout: .seconds(1))
                    break
                } catch let error as ServiceError where error.code == .noResponder || error.code == .timeout {
                    guard clock.now < deadline else {
                        throw ServiceError(
                            .timeout, "\(service) did not answer at \(endpoint) within 60 s of starting; its log says why (Configuration.logLevel).")
                    }
                    try await Task.sleep(for: .milliseconds(5))
                }
            }
        }
    }

    /// How the service group's run ended, once it has.
    private final class Outcome: Sendable {
        private let result = Mutex<Result<Void, any Error>?>(nil)
        var value: Result<Void, any Error>? { result.withLock { $0 } }
        func set(_ value: Result<Void, any Error>) { result.withLock { $0 = value } }
    }

    // MARK: Clients

    /// A client of this system, as an app would use it (no one signed in yet unless `session`
    /// is given). Each attempt of a call waits `timeout`; retried calls give up after `deadline`.
    public func client(
        name: String = "app", session: OnboardingClient.Session? = nil, timeout: Duration = .seconds(5),
        deadline: Duration = Defaults.retryDeadline
    ) -> OnboardingClient {
        endpoints.client(bus, name: name, session: session, timeout: timeout, deadline: deadline)
    }

    // MARK: What the stores hold

    /// The profile of `uid` in the profile store, or `nil` when there is none.
    public func profile(of uid: String) async throws -> Profile? {
        try await bus.call(
            GetProfile(), to: endpoints.profileRPC, source: "in-process-system", uid: uid, serviceToken: serviceToken
        ).profile
    }

    /// The route intent in force for `uid`, as the orchestrator has stored it.
    public func intentInForce(for uid: String) async throws -> RouteState {
        try await bus.call(
            CurrentIntent(), to: endpoints.orchestratorRPC, source: "in-process-system", uid: uid,
            serviceToken: serviceToken)
    }

    /// The files image-upload keeps for `uid` (images and thumbnails), by name, sorted.
    public func storedImages(of uid: String) -> [String] {
        let folder = imagesDirectory.appendingPathComponent(uid).path
        return ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).filter { !$0.hasPrefix(".") }.sorted()
    }
}

extension InProcessSystem.Part {
    /// The name the service signs its messages with (``ServiceName``).
    public var serviceName: String {
        switch self {
        case .auth: ServiceName.auth
        case .profile: ServiceName.profile
        case .imageUpload: ServiceName.imageUpload
        case .orchestrator: ServiceName.orchestrator
        }
    }
}
