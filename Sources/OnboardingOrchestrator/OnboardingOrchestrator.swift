import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import ServiceLifecycle
import ServiceRuntime

/// The onboarding-orchestrator service: turns auth and profile events into route intents,
/// answers "check me now" and "what is my current intent?", runs profile set-up, and cleans up
/// after withdrawals.
///
/// Decisions are made by ``OnboardingStateMachine`` and ``ProfileSetupSaga``; ``Engine`` carries
/// them out and keeps them in its store (SQLite, or PostgreSQL), so nothing is lost to a crash: events are followed with
/// ``EventFeed`` from the last one handled, every decision commits with the cursor of the event
/// that caused it, and unfinished checks, clean-ups and set-ups resume on start.
/// Run it with ``run()`` (in a `ServiceGroup`, or a task in tests).
public struct OnboardingOrchestrator: Service {
    public struct Configuration: Sendable {
        /// Where the orchestrator answers its requests.
        public var rpc: Endpoint
        /// Where route intents are published, on topics `route.<uid>`.
        public var routes: Endpoint
        public var authRPC: Endpoint
        public var authEvents: Endpoint
        public var profileRPC: Endpoint
        public var profileEvents: Endpoint
        public var imageRPC: Endpoint
        /// The orchestrator's SQLite database; `nil` keeps it in memory (tests). Unused when
        /// ``database`` is set.
        public var databasePath: String?
        /// Another database than SQLite (PostgreSQL: `OrchestratorPostgresDatabase`, in the
        /// `OrchestratorPostgres` module); `nil`: the SQLite file at ``databasePath``.
        public var database: (any OrchestratorDatabase)?
        /// The largest image accepted with a set-up request.
        public var maxImageBytes: Int
        /// How long one call to another service may take.
        public var callTimeout: Duration
        public var retryPolicy: RetryPolicy
        /// How long route intents stay replayable with `events.after`.
        public var retention: Outbox.Retention
        /// The secret the orchestrator's calls to other services carry, and that `onboarding.routes`,
        /// `events.after` and service-side `onboarding.intent` require.
        public var serviceToken: String?

        public init(
            rpc: Endpoint = Defaults.orchestratorRPC,
            routes: Endpoint = Defaults.routes,
            authRPC: Endpoint = Defaults.authRPC,
            authEvents: Endpoint = Defaults.authEvents,
            profileRPC: Endpoint = Defaults.profileRPC,
            profileEvents: Endpoint = Defaults.profileEvents,
            imageRPC: Endpoint = Defaults.imageRPC,
            databasePath: String? = nil,
            maxImageBytes: Int = Defaults.maxImageBytes,
            callTimeout: Duration = .seconds(2),
            retryPolicy: RetryPolicy = RetryPolicy(),
            retention: Outbox.Retention = Outbox.Retention(),
            serviceToken: String? = nil,
            database: (any OrchestratorDatabase)? = nil
        ) {
            self.rpc = rpc
            self.routes = routes
            self.authRPC = authRPC
            self.authEvents = authEvents
            self.profileRPC = profileRPC
            self.profileEvents = profileEvents
            self.imageRPC = imageRPC
            self.databasePath = databasePath
            self.maxImageBytes = maxImageBytes
            self.callTimeout = callTimeout
            self.retryPolicy = retryPolicy
            self.retention = retention
            self.serviceToken = serviceToken
            self.database = database
        }

        /// Where the store is kept: ``database``, or the SQLite file at ``databasePath``.
        public var storeDatabase: any OrchestratorDatabase { database ?? SQLiteOrchestratorDatabase(path: databasePath) }
    }

    public let configuration: Configuration
    private let bus: any MessageBus
    private let logger: Logger
    private let sessions: any SessionVerifier

    /// - Parameter sessions: verifies session tokens; by default asks auth.
    public init(configuration: Configuration, bus: any MessageBus, logger: Logger, sessions: (any SessionVerifier)? = nil) throws {
        self.configuration = configuration
        self.bus = bus
        self.logger = logger
        self.sessions = sessions ?? RemoteSessionVerifier(
            bus: bus, authEndpoint: configuration.authRPC, source: ServiceName.orchestrator)
    }

    /// Opens and migrates the store (``Configuration/storeDatabase``), answers requests and
    /// follows events until graceful shutdown or cancellation, then closes the store: run an
    /// orchestrator once.
    ///
    /// - Throws: ``ServiceError`` `storeUnavailable` when the store cannot be opened, or the bus's
    ///   errors when an endpoint cannot be bound.
    public func run() async throws {
        let publisher = CountingPublisher(try await bus.publisher(at: configuration.routes), types: [])
        defer { publisher.close() }
        let database = configuration.storeDatabase
        logger.info("the orchestrator keeps its store in \(database)")
        let context = OrchestratorStorageContext(publisher: publisher, retention: configuration.retention, logger: logger)
        do {
            try await database.withStorage(context) { storage in try await serve(storage) }
        } catch is StoppedWhileStandingBy {
            logger.info("stopped while standing by")
        }
    }

    private func serve(_ storage: any OrchestratorStorage) async throws {
        let (work, workQueue) = AsyncStream.makeStream(of: Work.self)
        let engine = try Engine(configuration: configuration, bus: bus, storage: storage, logger: logger, work: workQueue)
        let cursors = try await storage.cursors()
        let feeds = [
            (ServiceName.auth, EventFeed(
                bus: bus, events: configuration.authEvents, replay: configuration.authRPC, topics: ["auth."],
                source: ServiceName.orchestrator, serviceToken: configuration.serviceToken, logger: logger)),
            (ServiceName.profile, EventFeed(
                bus: bus, events: configuration.profileEvents, replay: configuration.profileRPC, topics: ["profile."],
                source: ServiceName.orchestrator, serviceToken: configuration.serviceToken, logger: logger)),
        ]
        logger.info("publishing route intents at \(configuration.routes); following events from \(configuration.authEvents) and \(configuration.profileEvents)")

        var dispatcher = engine.dispatcher(sessions: sessions)
        dispatcher.feedStatistics = { feeds.map { $0.1.statistics } }
        let server = RequestServer(
            bus: bus, endpoint: configuration.rpc,
            // Set-up requests may carry images: few wait and few of them run at once, so what is
            // held in memory stays bounded ((16 + 32) × twice the image limit). Checks, which wait
            // for a commit, are not held to the images' limit.
            limits: MessageLimits(
                maxEnvelopeBytes: 64 * 1024,
                maxAttachmentBytes: configuration.maxImageBytes.multipliedReportingOverflow(by: 2).overflow
                    ? .max : configuration.maxImageBytes * 2,
                queueLimit: 16),
            dispatcher: dispatcher, logger: logger, maxAttachmentsInFlight: 32)

        // What the engine accepted before it stopped taking inputs commits on the bus's thread,
        // behind the jobs queued there: wait for that before the publisher closes (its route
        // intents still go out) and `run` closes the database (a queued commit would find it
        // closed, and the decision would wait for the next start).
        try await withCleanup {
            try await withThrowingDiscardingTaskGroup { group in
                // However this ends (a failure to start included), the engine takes no more inputs.
                defer { engine.stopTakingInputs() }
                group.addTask { await Self.perform(work, atMost: Self.maximumConcurrentWork) }
                try await engine.resumeUnfinishedWork()
                for (name, feed) in feeds {
                    // On SQLite, live events commit on the bus's thread as they arrive.
                    var onLoop: EventFeed.LoopHandler?
                    if case .onLoop(let sqlite) = engine.commits {
                        onLoop = { events, through in try engine.handleOnLoop(events, from: name, through: through, in: sqlite) }
                    }
                    group.addTask { [onLoop] in
                        await feed.run(after: cursors[name] ?? 0, reader: Engine.eventReader, onLoop: onLoop) { events, through in
                            try await engine.handle(events, from: name, through: through)
                        }
                    }
                }
                group.addTask { await engine.settleSetUps() }
                // Returns on graceful shutdown once every request in flight has been answered, with
                // the feeds and the work queue still running to answer them.
                try await server.run()
                workQueue.finish()
                group.cancelAll()
            }
        } cleanup: {
            await engine.finishQueued()
        }
    }
}

extension OnboardingOrchestrator {
    /// How many calls run at once; more wait in the work queue (a burst of returning sign-ins
    /// becomes a queue of checks, not thousands of calls at the profile store at once). Timers
    /// (waits before a retry) do not count: they hold no connection, and there is at most one
    /// per person with work under way.
    static let maximumConcurrentWork = 512

    static func perform(_ work: AsyncStream<Work>, atMost limit: Int) async {
        await withDiscardingTaskGroup { timers in
            await withTaskGroup(of: Void.self) { calls in
                var running = 0
                for await job in work {
                    if job.isTimer {
                        timers.addTask { await job.run() }
                        continue
                    }
                    if running >= limit {
                        await calls.next()
                        running -= 1
                    }
                    calls.addTask { await job.run() }
                    running += 1
                }
            }
        }
    }
}

/// A piece of asynchronous work the engine asked for (a call to another service, a timer).
struct Work: Sendable {
    /// A wait before a retry, rather than a call.
    var isTimer = false
    let run: @Sendable () async -> Void
}
