import Foundation
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime

/// Where auth keeps accounts, sessions and the unlink queue, with the outbox of the events each
/// change causes: SQLite (the embedded default, ``SQLiteAuthDatabase``) or PostgreSQL
/// (`AuthPostgresDatabase` in the `AuthPostgres` module).
///
/// Every implementation keeps the same promises, and one test suite checks both:
/// - each change and its events commit together, and the events are published after the commit,
///   in sequence order;
/// - simultaneous first sign-ins of one account all get the same uid;
/// - a retried sign-out or withdrawal answers as the first did and records nothing more
///   (``SessionEnding``); a session ended by another's withdrawal is `unauthenticated`;
/// - sessions expire and are capped by ``SessionPolicy``;
/// - a withdrawal queues its unlink in its own transaction.
///
/// Thread safety: any task may call any method.
public protocol AuthStorage: SessionVerifier {
    /// The time sessions are stamped and judged with (tests move it).
    var clock: @Sendable () -> Date { get }

    /// Finds or creates the account of (provider, subject) and opens a session for it.
    func signIn(provider: Provider, subject: String, correlationId: String) async throws -> SignInResult

    /// Ends the session of `token` (with `everywhere`, every session of its account) and records
    /// `SignedOut`. - Returns: its uid. - Throws: `unauthenticated`.
    func signOut(token: String, everywhere: Bool, correlationId: String) async throws -> String

    /// Deletes the account of `token`'s session with all its sessions, queues its unlink, and
    /// records `Withdrawn`. - Returns: its uid. - Throws: `unauthenticated`.
    func withdraw(token: String, correlationId: String) async throws -> String

    /// The recorded events after `sequence`, for `events.after`.
    func events(after sequence: UInt64, limit: Int?) async throws -> EventPage

    // MARK: Unlinking

    /// Keeps `token` as what unlinking `uid`'s account takes; nothing when the account is gone.
    func recordGrant(uid: String, provider: Provider, token: String) async throws

    /// Up to `limit` jobs due at `now`, the longest due first, each held for this caller for
    /// `lease` (a store shared by several replicas gives a job to one of them at a time; a
    /// replica that dies holding one leaves it due again when the lease runs out).
    func claimDueUnlinkJobs(at now: Date, limit: Int, lease: TimeInterval) async throws -> [UnlinkJob]

    /// When the next job is due (`nil`: the queue is empty).
    func nextUnlinkAttempt() async throws -> Date?

    /// Carries out `step` for `job`: deletes it, or records the failure and the next attempt;
    /// nothing when `job`'s claim (``UnlinkJob/claim``) no longer holds it.
    func apply(_ step: UnlinkStep, to job: UnlinkJob, at now: Date) async throws

    /// The queue as `health` shows it.
    func unlinkQueueStatus(at now: Date) async throws -> UnlinkQueueStatus
}

/// What every store of auth is opened with.
public struct AuthStorageContext: Sendable {
    /// Where the store publishes the events it commits.
    public var publisher: any EventPublisher
    public var sessions: SessionPolicy
    public var clock: @Sendable () -> Date
    public var eventRetention: Outbox.Retention
    public var logger: Logger

    public init(
        publisher: any EventPublisher, sessions: SessionPolicy, clock: @escaping @Sendable () -> Date,
        eventRetention: Outbox.Retention, logger: Logger
    ) {
        self.publisher = publisher
        self.sessions = sessions
        self.clock = clock
        self.eventRetention = eventRetention
        self.logger = logger
    }
}

/// A database auth can keep its store in: opened, migrated and looked after (retention of old
/// events, and whatever else the database needs) for as long as auth runs.
public protocol AuthDatabase: Sendable, CustomStringConvertible {
    /// Opens the store, runs `body` with it, and closes it when `body` returns or throws.
    ///
    /// - Throws: ``ServiceError`` `storeUnavailable` when the database cannot be opened or
    ///   migrated; what `body` throws.
    func withStorage<T: Sendable>(
        _ context: AuthStorageContext, _ body: @Sendable (any AuthStorage) async throws -> T
    ) async throws -> T
}

/// Auth's store in a SQLite file (or in memory, for tests): the embedded default.
public struct SQLiteAuthDatabase: AuthDatabase {
    /// The file; `nil` keeps everything in memory.
    public var path: String?

    public init(path: String?) {
        self.path = path
    }

    public var description: String { path.map { "SQLite at \($0)" } ?? "SQLite in memory" }

    public func withStorage<T: Sendable>(
        _ context: AuthStorageContext, _ body: @Sendable (any AuthStorage) async throws -> T
    ) async throws -> T {
        let logger = context.logger
        return try await withSQLiteStore(path: path, retention: context.eventRetention, logger: logger, open: { path in
            let database = try ServiceDatabase.open(path: path)
            try AuthStore.migrator.migrate(database)
            return database
        }) { database in
            let store = AuthStore(
                database: database, outbox: Outbox(source: ServiceName.auth, publisher: context.publisher), logger: logger,
                clock: context.clock, sessions: context.sessions)
            return try await body(store)
        }
    }
}
