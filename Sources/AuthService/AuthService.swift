import AuthIdentity
import Foundation
import Logging
import Messaging
import OnboardingAPI
import ServiceLifecycle
import ServiceRuntime

/// The auth service: turns a provider account into a stable uid, keeps sessions, and publishes
/// `auth.signedIn`, `auth.signedOut` and `auth.withdrawn`.
///
/// Requests (at ``Configuration/rpc``):
/// - `auth.signIn` (open): verifies the identity, finds or creates the account, opens a session.
/// - `auth.signOut` (session): ends the envelope's session (with `everywhere`, every session of
///   its account). Safe to retry: a sign-out of a session that already ended (signed out,
///   withdrawn or expired, within the last 24 hours) answers the same uid and publishes nothing.
/// - `auth.withdraw` (session): deletes the account and all its sessions. Safe to retry: a
///   withdrawal of a session that was withdrawn answers the same uid and publishes nothing; one
///   of a session that was only signed out is `unauthenticated`.
/// - `auth.verifySession` (open): which uid a token belongs to, or `unauthenticated`.
/// - `events.after` (service): the recorded events after a sequence number, for replay.
///
/// Each event is written to the outbox in the same transaction as the change it reports and
/// published at ``Configuration/events`` after commit. The outbox keeps events for
/// ``Configuration/eventRetention``.
///
/// Thread safety: a value type; ``run()`` is called once, from a `ServiceGroup` or a test task.
public struct AuthService: Service {
    public struct Configuration: Sendable {
        /// Where requests are answered.
        public var rpc: Endpoint
        /// Where events are published.
        public var events: Endpoint
        /// The SQLite file; `nil` keeps everything in memory (tests). Unused when ``database``
        /// is set.
        public var databasePath: String?
        /// Another database than SQLite (PostgreSQL: `AuthPostgresDatabase`, in the
        /// `AuthPostgres` module); `nil`: the SQLite file at ``databasePath``.
        public var database: (any AuthDatabase)?
        /// Accept sign-ins by provider subject alone, without an ID token (local use only).
        /// Ignored when an ``IdentityVerifier`` is given to ``AuthService/init(configuration:bus:logger:identities:)``.
        public var devMode: Bool
        /// The secret service-only requests (`events.after`) must carry; `nil` trusts every
        /// caller (tests only).
        public var serviceToken: String?
        /// How long published events are kept for replay.
        public var eventRetention: Outbox.Retention
        /// How sign-ins are verified outside dev mode: each provider's client ids, issuer and key
        /// set URL (Naver: its profile API). A provider without client ids refuses its sign-ins.
        public var identityProviders: IdentityProviderSettings
        /// How long sessions live unused (30 days) and how many an account holds (10).
        public var sessions: SessionPolicy
        /// The time sessions are stamped and judged with (tests move it).
        public var clock: @Sendable () -> Date
        /// Unlinking withdrawn accounts at their providers (none configured: nothing is unlinked).
        public var unlink: UnlinkConfiguration

        public init(
            rpc: Endpoint = Defaults.authRPC,
            events: Endpoint = Defaults.authEvents,
            databasePath: String? = nil,
            devMode: Bool = false,
            serviceToken: String? = nil,
            eventRetention: Outbox.Retention = Outbox.Retention(),
            identityProviders: IdentityProviderSettings = IdentityProviderSettings(),
            sessions: SessionPolicy = SessionPolicy(),
            clock: @escaping @Sendable () -> Date = { Date() },
            unlink: UnlinkConfiguration = UnlinkConfiguration(),
            database: (any AuthDatabase)? = nil
        ) {
            self.rpc = rpc
            self.events = events
            self.databasePath = databasePath
            self.devMode = devMode
            self.serviceToken = serviceToken
            self.eventRetention = eventRetention
            self.identityProviders = identityProviders
            self.sessions = sessions
            self.clock = clock
            self.unlink = unlink
            self.database = database
        }

        /// Where the store is kept: ``database``, or the SQLite file at ``databasePath``.
        public var storeDatabase: any AuthDatabase { database ?? SQLiteAuthDatabase(path: databasePath) }
    }

    public let configuration: Configuration
    private let bus: any MessageBus
    private let logger: Logger
    private let identities: any IdentityVerifier
    private let trustsSubjects: Bool

    /// - Parameter identities: verifies sign-ins. When `nil`, dev mode picks
    ///   ``DevModeIdentityVerifier``; without dev mode, ``ProviderIdentityVerifier`` verifies
    ///   tokens with the providers of ``Configuration/identityProviders``.
    /// - Throws: ``ServiceError`` `invalidRequest` when the configuration cannot work (the same
    ///   endpoint for requests and events, or an empty database path).
    public init(
        configuration: Configuration, bus: any MessageBus, logger: Logger, identities: (any IdentityVerifier)? = nil
    ) throws {
        guard configuration.rpc != configuration.events else {
            throw ServiceError(
                .invalidRequest, "auth needs different endpoints for requests and events; both are \(configuration.rpc).")
        }
        guard configuration.databasePath?.isEmpty != true else {
            throw ServiceError(.invalidRequest, "auth's database path is empty; give a file path, or nil for memory.")
        }
        self.configuration = configuration
        self.bus = bus
        self.logger = logger
        if let identities {
            self.identities = identities
            self.trustsSubjects = false
        } else if configuration.devMode {
            self.identities = DevModeIdentityVerifier()
            self.trustsSubjects = true
        } else {
            self.identities = ProviderIdentityVerifier(settings: configuration.identityProviders, logger: logger)
            self.trustsSubjects = false
        }
    }

    /// Binds the event publisher, opens and migrates the store (``Configuration/storeDatabase``),
    /// and answers requests until graceful shutdown or cancellation, letting requests in flight
    /// finish.
    ///
    /// - Throws: a database error when the store cannot be opened or migrated, or the bus's
    ///   ``ServiceError`` (such as `addressInUse`) when an endpoint cannot be bound.
    public func run() async throws {
        if trustsSubjects {
            logger.warning("DEV MODE: sign-in accepts provider subjects without ID tokens. Never run this in production.")
        } else if let providers = identities as? ProviderIdentityVerifier {
            for line in providers.settings.summary { logger.notice("sign-in with \(line)") }
        }
        let publisher = CountingPublisher(
            try await bus.publisher(at: configuration.events), types: [SignedIn.self, SignedOut.self, Withdrawn.self])
        defer { publisher.close() }
        logger.info("auth publishes events at \(configuration.events)")
        let database = configuration.storeDatabase
        logger.info("auth keeps its store in \(database)")
        let context = AuthStorageContext(
            publisher: publisher, sessions: configuration.sessions, clock: configuration.clock,
            eventRetention: configuration.eventRetention, logger: logger)
        let (bus, identities, serviceToken, logger) = (bus, identities, configuration.serviceToken, logger)
        let (unlinkConfiguration, rpc) = (configuration.unlink, configuration.rpc)
        try await database.withStorage(context) { store in
            let unlink = UnlinkWorker(configuration: unlinkConfiguration, store: store, logger: logger)
            let server = RequestServer(
                bus: bus, endpoint: rpc,
                dispatcher: Self.dispatcher(
                    store: store, identities: identities, serviceToken: serviceToken, logger: logger, unlink: unlink),
                logger: logger)
            try await unlink.running { try await server.run() }
        }
    }

    private static func dispatcher(
        store: any AuthStorage, identities: any IdentityVerifier, serviceToken: String?, logger: Logger, unlink: UnlinkWorker
    ) -> RequestDispatcher {
        var dispatcher = RequestDispatcher(source: ServiceName.auth, sessions: store, serviceToken: serviceToken, logger: logger)
        let sqlite = store as? AuthStore
        if let sqlite, let immediate = identities as? any ImmediateIdentityVerifier {
            // SQLite's hot path: verified, written and answered on the bus's thread, a batch of
            // sign-ins per transaction.
            let outbox = sqlite.outbox
            dispatcher.onLoop(SignIn.self, access: .open, database: sqlite.database) { request, context, db in
                let subject = try immediate.verifyNow(request)
                return try AuthStore.signIn(
                    provider: request.provider, subject: subject, correlationId: context.message.header.id, outbox: outbox,
                    sessions: sqlite.sessions, pruning: sqlite.pruning, now: sqlite.clock(), in: db)
            }
        } else {
            dispatcher.on(SignIn.self, access: .open) { request, context in
                // Verified before the store is touched: a sign-in whose keys must be fetched (or
                // that Naver must answer) waits here, off the bus's thread. The subject is ignored
                // here, but its rule holds in every mode, as the schema says.
                if let problem = SignIn.subjectProblem(request.subject) { throw problem }
                let subject = try await identities.verify(request)
                let result = try await store.signIn(
                    provider: request.provider, subject: subject, correlationId: context.message.header.id)
                await unlink.recordGrant(for: request, uid: result.uid)
                // Per sign-in: debug, so that 1,000 sign-ins/s do not flood the log.
                logger.debug(
                    "signed in",
                    metadata: ["uid": "\(result.uid)", "provider": "\(result.provider.rawValue)", "new": "\(result.isNewAccount)"])
                return result
            }
        }
        // Sign-out and withdrawal check the token themselves, in the transaction that ends the
        // session, so that a retry after the session ended is answered as the first one was.
        dispatcher.on(SignOut.self, access: .endingSession, replyUID: \.uid) { request, context in
            let uid = try await store.signOut(
                token: context.message.header.sessionToken ?? "", everywhere: request.everywhere == true,
                correlationId: context.message.header.id)
            logger.debug("signed out", metadata: ["uid": "\(uid)"])
            return AccountResult(uid: uid)
        }
        dispatcher.on(Withdraw.self, access: .endingSession, replyUID: \.uid) { _, context in
            let uid = try await store.withdraw(
                token: context.message.header.sessionToken ?? "", correlationId: context.message.header.id)
            unlink.wake()
            logger.notice("withdrawn", metadata: ["uid": "\(uid)"])
            return AccountResult(uid: uid)
        }
        if let sqlite {
            // Every other service asks this for each app request: answered on the bus's thread.
            // A session whose use must be recorded (at most hourly) or that just expired needs a
            // write: that rare case is answered later, from the async path.
            dispatcher.onLoop(VerifySession.self, access: .open, database: sqlite.database, writes: false) {
                request, _, db, reply -> AccountResult? in
                switch try AuthStore.lookUp(token: request.sessionToken, policy: sqlite.sessions, now: sqlite.clock(), in: db) {
                case .live(let uid, renew: false):
                    return AccountResult(uid: uid)
                case .ended(let ending):
                    throw SessionRefusal.of(ending)
                case .live(_, renew: true), .expired:
                    Task {
                        do {
                            reply.send(.success(AccountResult(uid: try await sqlite.uid(forSessionToken: request.sessionToken))))
                        } catch {
                            reply.send(.failure(error as? ServiceError ?? ServiceError(.storeUnavailable, "\(error)")))
                        }
                    }
                    return nil
                }
            }
            dispatcher.onEventsAfter(database: sqlite.database)
        } else {
            dispatcher.on(VerifySession.self, access: .open) { request, _ in
                AccountResult(uid: try await store.uid(forSessionToken: request.sessionToken))
            }
            dispatcher.on(EventsAfter.self, access: .serviceWithoutUID) { request, _ in
                try await store.events(after: request.sequence, limit: request.limit)
            }
        }
        // Health replies show the unlink queue (pending jobs, the oldest one's age, the last error).
        dispatcher.healthDetails = { status in
            status.unlink = try? await unlink.status()
        }
        return dispatcher
    }
}
