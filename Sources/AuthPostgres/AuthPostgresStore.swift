import AuthService
import Foundation
import Logging
import Messaging
import OnboardingAPI
import PostgresNIO
import PostgresSupport
import ServiceRuntime

/// auth's accounts, sessions and unlink queue in PostgreSQL, with the outbox of their events
/// (``PostgresOutbox``): what `AuthStore` is on SQLite, for several replicas.
///
/// Every change that records an event goes through one ``GroupCommitter``: whatever queued while
/// a transaction ran goes into the next one, sign-ins as a handful of set-based statements
/// whatever their number. One transaction at a time per process also means its events are
/// published in the order of their sequence numbers. Reads, and writes without events (a
/// session's last use, a provider grant, the unlink queue), go straight to the pool.
///
/// Races with other replicas are settled by the database: first sign-ins of one account yield
/// to its unique key; an ending deletes the session row and goes on only when it deleted it; the
/// pruning of other accounts' sessions skips rows another transaction holds.
///
/// A batch that fails (the database failed, or timed out) fails every request in it with
/// `storeUnavailable`, which callers retry.
///
/// Thread safety: immutable; any task may call any method.
final class AuthPostgresStore: AuthStorage {
    let store: PostgresStore
    let clock: @Sendable () -> Date
    private let writer: Writer
    private let committer: GroupCommitter<Write, Result<Written, any Error>>

    init(store: PostgresStore, context: AuthStorageContext, maxBatch: Int = 1_000) {
        self.store = store
        self.clock = context.clock
        let writer = Writer(
            store: store, publisher: context.publisher, sessions: context.sessions, clock: context.clock,
            logger: context.logger)
        self.writer = writer
        self.committer = GroupCommitter(maxBatch: maxBatch) { jobs in await writer.commit(jobs) }
    }

    static func migrator(schema: String) throws -> PostgresMigrator {
        var migrator = try PostgresMigrator(schema: schema)
        PostgresOutbox.registerMigration(in: &migrator)
        migrator.register(
            "auth-v1",
            [
                """
                CREATE TABLE account (
                  uid text PRIMARY KEY,
                  provider text NOT NULL,
                  subject text NOT NULL,
                  created_at timestamptz NOT NULL,
                  UNIQUE (provider, subject))
                """,
                // A session's token is `<id>.<secret>`: `token` keeps the secret's SHA-256.
                """
                CREATE TABLE session (
                  id bigserial PRIMARY KEY,
                  token text NOT NULL,
                  uid text NOT NULL REFERENCES account (uid) ON DELETE CASCADE,
                  created_at timestamptz NOT NULL,
                  last_used_at timestamptz NOT NULL)
                """,
                "CREATE INDEX session_uid ON session (uid)",
                "CREATE INDEX session_last_used_at ON session (last_used_at)",
                // No reference to account: a withdrawal deletes the account, and the record of
                // how its session ended must stay.
                """
                CREATE TABLE ended_session (
                  token text PRIMARY KEY,
                  uid text NOT NULL,
                  ending text NOT NULL,
                  ended_at timestamptz NOT NULL)
                """,
                "CREATE INDEX ended_session_ended_at ON ended_session (ended_at)",
                """
                CREATE TABLE provider_grant (
                  uid text PRIMARY KEY REFERENCES account (uid) ON DELETE CASCADE,
                  provider text NOT NULL,
                  token text NOT NULL,
                  updated_at timestamptz NOT NULL)
                """,
                // No reference to account: the job outlives it.
                """
                CREATE TABLE unlink_job (
                  uid text PRIMARY KEY,
                  provider text NOT NULL,
                  subject text NOT NULL,
                  token text,
                  attempts bigint NOT NULL DEFAULT 0,
                  created_at timestamptz NOT NULL,
                  next_attempt_at timestamptz NOT NULL,
                  last_error text,
                  last_attempt_at timestamptz)
                """,
                "CREATE INDEX unlink_job_next_attempt_at ON unlink_job (next_attempt_at)",
            ])
        // Which claim holds a job: a worker whose lease ran out (and whose job another replica
        // took) records nothing over the new claimant's.
        migrator.register("auth-v2-unlink-claims", ["ALTER TABLE unlink_job ADD COLUMN claim text"])
        return migrator
    }

    // MARK: Changes that record events

    func signIn(provider: Provider, subject: String, correlationId: String) async throws -> SignInResult {
        guard case .signedIn(let result) = try await committer.submit(.signIn(provider, subject, correlationId)).get()
        else { throw Self.mismatch }
        return result
    }

    func signOut(token: String, everywhere: Bool, correlationId: String) async throws -> String {
        guard case .uid(let uid) = try await committer.submit(.signOut(token, everywhere: everywhere, correlationId)).get()
        else { throw Self.mismatch }
        return uid
    }

    func withdraw(token: String, correlationId: String) async throws -> String {
        guard case .uid(let uid) = try await committer.submit(.withdraw(token, correlationId)).get()
        else { throw Self.mismatch }
        return uid
    }

    private static let mismatch = ServiceError(.internalError, "auth's store answered a change with another's result.")

    // MARK: Sessions

    func uid(forSessionToken token: String) async throws -> String {
        let now = clock()
        let (id, digest) = Self.row(of: SessionKey(token: token))
        let cutoff = now.addingTimeInterval(-SessionEnding.retention)
        let logger = writer.logger
        // The session and, when it is gone, how it ended: one round trip.
        let (session, ending) = try await store.read { connection in
            let rows = try await connection.query(
                """
                SELECT s.uid, s.last_used_at, e.uid, e.ending
                FROM (SELECT 1) AS one
                LEFT JOIN session s ON s.id = \(id) AND s.token = \(digest)
                LEFT JOIN ended_session e ON e.token = \(digest) AND e.ended_at >= \(cutoff)
                """,
                logger: logger)
            var found: ((uid: String, lastUsed: Date)?, SessionEnding?) = (nil, nil)
            for try await (uid, lastUsed, _, ending) in rows.decode((String?, Date?, String?, String?).self) {
                if let uid, let lastUsed { found.0 = (uid, lastUsed) }
                found.1 = ending.flatMap(SessionEnding.init(rawValue:))
            }
            return found
        }
        guard let session, !token.isEmpty else { throw SessionRefusal.of(ending) }
        switch SessionLookup.found(uid: session.uid, lastUsed: session.lastUsed, policy: writer.sessions, now: now) {
        case .live(let uid, renew: false):
            return uid
        case .live(let uid, renew: true):
            // No event: straight to the pool, not through the committer.
            try await store.read { connection in
                _ = try await connection.query(
                    "UPDATE session SET last_used_at = \(now) WHERE id = \(id) AND token = \(digest)", logger: logger)
            }
            return uid
        case .expired(let uid):
            _ = try await committer.submit(.expire(id: id, digest: digest, uid: uid)).get()
            throw SessionRefusal.expired
        case .ended(let ending):
            throw SessionRefusal.of(ending)
        }
    }

    /// The session row a key names: its id and its secret's digest. Tokens from before session
    /// ids were never stored here: id 0 matches no row, and the digest still finds an ending.
    static func row(of key: SessionKey) -> (id: Int64, digest: String) {
        switch key {
        case .session(let id, let digest): (id, digest)
        case .legacy(let digest): (0, digest)
        }
    }

    // MARK: Replay

    func events(after sequence: UInt64, limit: Int?) async throws -> EventPage {
        let logger = writer.logger
        return try await store.read { connection in
            try await PostgresOutbox.events(after: sequence, limit: limit, on: connection, logger: logger)
        }
    }

    // MARK: Unlinking

    func recordGrant(uid: String, provider: Provider, token: String) async throws {
        let now = clock()
        let logger = writer.logger
        try await store.read { connection in
            _ = try await connection.query(
                """
                INSERT INTO provider_grant (uid, provider, token, updated_at)
                SELECT uid, \(provider.rawValue), \(token), \(now) FROM account WHERE uid = \(uid)
                ON CONFLICT (uid) DO UPDATE SET token = excluded.token, updated_at = excluded.updated_at
                """,
                logger: logger)
        }
    }

    func claimDueUnlinkJobs(at now: Date, limit: Int, lease: TimeInterval) async throws -> [UnlinkJob] {
        let (held, count) = (now.addingTimeInterval(lease), Int64(limit))
        let claim = UUID().uuidString.lowercased()
        let logger = writer.logger
        return try await store.read { connection in
            // Held by moving the next attempt past the lease: a replica that dies with a job
            // leaves it due again then. SKIP LOCKED: two replicas never claim one job.
            let rows = try await connection.query(
                """
                UPDATE unlink_job SET next_attempt_at = \(held), claim = \(claim)
                WHERE uid IN (
                  SELECT uid FROM unlink_job WHERE next_attempt_at <= \(now)
                  ORDER BY next_attempt_at LIMIT \(count) FOR UPDATE SKIP LOCKED)
                RETURNING uid, provider, subject, token, attempts, created_at, next_attempt_at, last_error
                """,
                logger: logger)
            var jobs: [UnlinkJob] = []
            for try await (uid, provider, subject, token, attempts, created, next, error) in rows.decode(
                (String, String, String, String?, Int64, Date, Date, String?).self)
            {
                guard let provider = Provider(rawValue: provider) else { continue }
                jobs.append(
                    UnlinkJob(
                        uid: uid, provider: provider, subject: subject, token: token, attempts: Int(attempts),
                        createdAt: created, nextAttemptAt: next, lastError: error, claim: claim))
            }
            return jobs.sorted { $0.createdAt < $1.createdAt }
        }
    }

    func nextUnlinkAttempt() async throws -> Date? {
        let logger = writer.logger
        return try await store.read { connection in
            var next: Date?
            for try await date in try await connection.query("SELECT min(next_attempt_at) FROM unlink_job", logger: logger)
                .decode(Date?.self)
            { next = date }
            return next
        }
    }

    /// Records `step` only while `job`'s claim still holds it (a job queued again by a later
    /// withdrawal, or claimed by another replica after the lease ran out, is left to them).
    func apply(_ step: UnlinkStep, to job: UnlinkJob, at now: Date) async throws {
        let logger = writer.logger
        try await store.read { connection in
            switch step {
            case .unlinked, .refused:
                _ = try await connection.query(
                    "DELETE FROM unlink_job WHERE uid = \(job.uid) AND claim IS NOT DISTINCT FROM \(job.claim)", logger: logger)
            case .retry(let at, let attempts, let error):
                _ = try await connection.query(
                    """
                    UPDATE unlink_job SET attempts = \(Int64(attempts)), next_attempt_at = \(at), last_error = \(error),
                      last_attempt_at = \(now)
                    WHERE uid = \(job.uid) AND claim IS NOT DISTINCT FROM \(job.claim)
                    """,
                    logger: logger)
            }
        }
    }

    func unlinkQueueStatus(at now: Date) async throws -> UnlinkQueueStatus {
        let logger = writer.logger
        return try await store.read { connection in
            let rows = try await connection.query(
                """
                SELECT (SELECT count(*) FROM unlink_job), (SELECT min(created_at) FROM unlink_job), f.last_error, f.last_attempt_at
                FROM (SELECT 1) AS one
                LEFT JOIN LATERAL (
                  SELECT last_error, last_attempt_at FROM unlink_job WHERE last_error IS NOT NULL
                  ORDER BY last_attempt_at DESC LIMIT 1) f ON true
                """,
                logger: logger)
            var status = UnlinkQueueStatus(pending: 0, oldestPendingSeconds: nil, lastError: nil, lastErrorAt: nil)
            for try await (pending, oldest, error, errorAt) in rows.decode((Int64, Date?, String?, Date?).self) {
                status = UnlinkQueueStatus(
                    pending: Int(pending), oldestPendingSeconds: oldest.map { max(0, Int(now.timeIntervalSince($0))) },
                    lastError: error, lastErrorAt: errorAt.map(Timestamp.format))
            }
            return status
        }
    }
}
