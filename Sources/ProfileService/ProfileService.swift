import Logging
import Messaging
import OnboardingAPI
import OnboardingSettings
import ServiceLifecycle
import ServiceRuntime

/// The profile service: profiles and usernames, answered over the bus.
///
/// It answers `profile.get`, `profile.create`, `profile.update`, `profile.delete`,
/// `profile.checkUsername`, `profile.evictCache`, `events.after` and `health` at
/// ``Configuration/rpc``, and publishes `profile.created`, `profile.updated` and
/// `profile.deleted` at ``Configuration/events``, each written in the same transaction as its
/// change and kept in the outbox for ``Configuration/eventRetention``.
///
/// `profile.create` with an `idempotencyKey` is safe to retry: the key is stored with the
/// profile, and a create that repeats it is answered with that profile, publishing nothing
/// (see ``ProfileStore/create(uid:username:imagePath:idempotencyKey:correlationId:)``).
///
/// Run it in a `ServiceGroup` (or a task): ``run()`` returns on graceful shutdown or
/// cancellation, after the requests in flight have been answered.
public struct ProfileService: Service {
    /// Where the service listens and keeps its data.
    public struct Configuration: Sendable {
        /// Where requests are answered.
        public var rpc: Endpoint
        /// Where events are published.
        public var events: Endpoint
        /// Auth's request endpoint, for verifying session tokens.
        public var authRPC: Endpoint
        /// The SQLite file; `nil` keeps everything in memory (tests). Unused when ``database``
        /// is set.
        public var databasePath: String?
        /// Another database than SQLite (PostgreSQL: `ProfilePostgresDatabase`, in the
        /// `ProfilePostgres` module); `nil`: the SQLite file at ``databasePath``.
        public var database: (any ProfileDatabase)?
        /// How many people's profiles the cache keeps; at least 1.
        public var cacheCapacity: Int
        /// The secret service-only requests must carry; `nil` trusts every caller (tests only).
        public var serviceToken: String?
        /// How long published events are kept for replay (`events.after`).
        public var eventRetention: Outbox.Retention

        public static let defaultCacheCapacity = Int(Setting.profileCacheCapacity.defaultText)!

        public init(
            rpc: Endpoint = Defaults.profileRPC,
            events: Endpoint = Defaults.profileEvents,
            authRPC: Endpoint = Defaults.authRPC,
            databasePath: String? = nil,
            cacheCapacity: Int = Configuration.defaultCacheCapacity,
            serviceToken: String? = nil,
            eventRetention: Outbox.Retention = Outbox.Retention(),
            database: (any ProfileDatabase)? = nil
        ) {
            self.rpc = rpc
            self.events = events
            self.authRPC = authRPC
            self.databasePath = databasePath
            self.cacheCapacity = cacheCapacity
            self.serviceToken = serviceToken
            self.eventRetention = eventRetention
            self.database = database
        }

        /// Where the store is kept: ``database``, or the SQLite file at ``databasePath``.
        public var storeDatabase: any ProfileDatabase { database ?? SQLiteProfileDatabase(path: databasePath) }
    }

    /// What the request endpoint accepts: envelopes up to 64 KiB and no binary frame.
    public static let rpcLimits = MessageLimits(maxEnvelopeBytes: 64 * 1024, maxAttachmentBytes: 0)

    public let configuration: Configuration
    private let bus: any MessageBus
    private let logger: Logger
    private let sessions: any SessionVerifier

    /// - Parameters:
    ///   - bus: the bus to answer and publish on.
    ///   - sessions: verifies the session tokens of app requests; by default auth is asked at
    ///     ``Configuration/authRPC``.
    /// - Throws: ``ServiceError`` `invalidRequest` when the configuration cannot work (a cache
    ///   capacity below 1).
    public init(
        configuration: Configuration, bus: any MessageBus, logger: Logger, sessions: (any SessionVerifier)? = nil
    ) throws {
        guard configuration.cacheCapacity >= 1 else {
            throw ServiceError(
                .invalidRequest, "The cache capacity must be at least 1, not \(configuration.cacheCapacity).")
        }
        self.configuration = configuration
        self.bus = bus
        self.logger = logger
        self.sessions = sessions
            ?? RemoteSessionVerifier(bus: bus, authEndpoint: configuration.authRPC, source: ServiceName.profile)
    }

    /// Binds the event publisher, opens and migrates the store (``Configuration/storeDatabase``),
    /// and answers requests until graceful shutdown or cancellation.
    ///
    /// - Throws: ``ServiceError`` `storeUnavailable` when the database cannot be opened, or the
    ///   bus's `addressInUse` / `invalidEndpoint` when an endpoint cannot be bound.
    public func run() async throws {
        let publisher = CountingPublisher(
            try await bus.publisher(at: configuration.events),
            types: [ProfileCreated.self, ProfileUpdated.self, ProfileDeleted.self])
        defer { publisher.close() }
        logger.info("profile publishes events at \(configuration.events)")
        let database = configuration.storeDatabase
        logger.info("profile keeps its store in \(database)")
        let cache = ProfileCache(capacity: configuration.cacheCapacity)
        let context = ProfileStorageContext(
            publisher: publisher, cache: cache, eventRetention: configuration.eventRetention, logger: logger)
        let (bus, sessions, serviceToken, logger, rpc) = (bus, sessions, configuration.serviceToken, logger, configuration.rpc)
        try await database.withStorage(context) { store in
            let requests = ProfileRequests(store: store, cache: cache)
            let server = RequestServer(
                bus: bus, endpoint: rpc, limits: Self.rpcLimits,
                dispatcher: requests.dispatcher(sessions: sessions, serviceToken: serviceToken, logger: logger), logger: logger)
            try await server.run()
        }
    }
}
