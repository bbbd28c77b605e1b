import AuthService
import Foundation
import Logging
import Messaging
import OnboardingAPI
import PostgresNIO
import PostgresSupport
import ServiceRuntime

/// A change that records events, queued for the next transaction.
enum Write: Sendable {
    case signIn(Provider, String, String)
    case signOut(String, everywhere: Bool, String)
    case withdraw(String, String)
    /// Ends a session found expired (``AuthPostgresStore/uid(forSessionToken:)``).
    case expire(id: Int64, digest: String, uid: String)
}

/// What a change gives its caller.
enum Written: Sendable {
    case signedIn(SignInResult)
    case uid(String)
    case nothing
}

/// Carries out batches of ``Write``s, one transaction each, and publishes their events after
/// the commit.
struct Writer: Sendable {
    let store: PostgresStore
    let publisher: any EventPublisher
    let sessions: SessionPolicy
    let clock: @Sendable () -> Date
    let logger: Logger
    let outbox = PostgresOutbox(source: ServiceName.auth)
    let pruning = SessionPruneSchedule()

    /// One outcome per job, in order. A job refused on its own (`unauthenticated`) is refused
    /// before it writes, and the others go on; a database failure fails them all.
    func commit(_ jobs: [Write]) async -> [Result<Written, any Error>] {
        let now = clock()
        let publisher = self.publisher
        do {
            // For new accounts, two flights: BEGIN, the head's lock and the accounts and sessions;
            // then the events and COMMIT.
            let (outcomes, _) = try await store.pipelinedEventTransaction { transaction in
                var batch = Batch(writer: self, transaction: transaction, now: now)
                let outcomes = try batch.apply(jobs)
                return (outcomes, try outbox.record(batch.events, in: transaction))
            } afterCommit: { _, messages in
                // Only queued for the bus's I/O thread: never blocks. Batches take turns, so in order.
                for message in messages { try? publisher.publish(message) }
            }
            return outcomes
        } catch {
            return jobs.map { _ in .failure(error) }
        }
    }
}

/// A request refused before its job wrote anything: the rest of its batch goes on.
struct Refusal: Error {
    var error: ServiceError
}

/// One transaction's work: its jobs, and the events they record.
struct Batch {
    let writer: Writer
    let transaction: PipelineTransaction
    let now: Date
    var events: [PostgresOutbox.Recording] = []

    init(writer: Writer, transaction: PipelineTransaction, now: Date) {
        self.writer = writer
        self.transaction = transaction
        self.now = now
    }

    var logger: Logger { writer.logger }

    /// The endings first, in order; then the sign-ins together. All were concurrent requests, so
    /// any order is one they could have had, and the events (``events``) follow the order applied.
    ///
    /// - Returns: each job's outcome.
    mutating func apply(_ jobs: [Write]) throws -> [Result<Written, any Error>] {
        var outcomes = [Result<Written, any Error>](repeating: .success(.nothing), count: jobs.count)
        var signIns: [(index: Int, job: SignInJob)] = []
        for (index, job) in jobs.enumerated() {
            do {
                switch job {
                case .signIn(let provider, let subject, let correlationId):
                    signIns.append((index, SignInJob(provider: provider, subject: subject, correlationId: correlationId)))
                case .signOut(let token, let everywhere, let correlationId):
                    outcomes[index] = .success(.uid(try signOut(token, everywhere: everywhere, correlationId)))
                case .withdraw(let token, let correlationId):
                    outcomes[index] = .success(.uid(try withdraw(token, correlationId)))
                case .expire(let id, let digest, let uid):
                    try expire(id: id, digest: digest, uid: uid)
                }
            } catch let refusal as Refusal {
                outcomes[index] = .failure(refusal.error)
            }
        }
        if !signIns.isEmpty {
            let results = try signIn(signIns.map(\.job))
            for (index, result) in zip(signIns.map(\.index), results) { outcomes[index] = .success(.signedIn(result)) }
        }
        return outcomes
    }

    // MARK: Endings

    mutating func signOut(_ token: String, everywhere: Bool, _ correlationId: String) throws -> String {
        let (id, digest) = AuthPostgresStore.row(of: SessionKey(token: token))
        // Deleting decides: of two requests that end one session (here or on another replica),
        // one deletes the row and records the ending; the other finds the ending.
        if let uid = try uid(of: "DELETE FROM session WHERE id = \(id) AND token = \(digest) RETURNING uid") {
            if everywhere { try run("DELETE FROM session WHERE uid = \(uid)") }
            try recordEndings([(digest, uid, .signOut)])
            events.append(.init(SignedOut(uid: uid, sessions: try liveSessions(of: uid)), uid: uid, correlationId: correlationId))
            return uid
        }
        if let ended = try ending(of: digest) { return ended.uid }
        throw Refusal(error: SessionRefusal.unknown)
    }

    mutating func withdraw(_ token: String, _ correlationId: String) throws -> String {
        let (id, digest) = AuthPostgresStore.row(of: SessionKey(token: token))
        let cutoff = writer.sessions.expiryCutoff(now: now)
        // An expired session (last used at the cutoff or before) cannot withdraw, even before it
        // is pruned.
        if let uid = try uid(
            of: "DELETE FROM session WHERE id = \(id) AND token = \(digest) AND last_used_at > \(cutoff) RETURNING uid")
        {
            try run(
                """
                INSERT INTO unlink_job (uid, provider, subject, token, attempts, created_at, next_attempt_at)
                SELECT a.uid, a.provider, a.subject, g.token, 0, \(now), \(now)
                FROM account a LEFT JOIN provider_grant g ON g.uid = a.uid
                WHERE a.uid = \(uid)
                ON CONFLICT (uid) DO UPDATE SET provider = excluded.provider, subject = excluded.subject,
                  token = excluded.token, attempts = 0, created_at = excluded.created_at,
                  next_attempt_at = excluded.next_attempt_at, last_error = NULL, last_attempt_at = NULL, claim = NULL
                """)
            try run("DELETE FROM account WHERE uid = \(uid)")
            try recordEndings([(digest, uid, .withdrawal)])
            events.append(.init(Withdrawn(uid: uid), uid: uid, correlationId: correlationId))
            return uid
        }
        if let ended = try ending(of: digest), ended.ending.answersWithdrawal { return ended.uid }
        throw Refusal(error: SessionRefusal.unknown)
    }

    mutating func expire(id: Int64, digest: String, uid: String) throws {
        // Another request may have ended it first: then nothing is left to do.
        guard try self.uid(of: "DELETE FROM session WHERE id = \(id) AND token = \(digest) RETURNING uid") != nil
        else { return }
        try recordEndings([(digest, uid, .expired)])
        events.append(
            .init(
                SignedOut(uid: uid, sessions: try liveSessions(of: uid)), uid: uid,
                correlationId: UUID().uuidString.lowercased()))
    }

    /// Records how sessions ended, and forgets the endings older than ``SessionEnding/retention``.
    func recordEndings(_ endings: [(digest: String, uid: String, ending: SessionEnding)]) throws {
        guard !endings.isEmpty else { return }
        let forgotten = now.addingTimeInterval(-SessionEnding.retention)
        try run("DELETE FROM ended_session WHERE ended_at < \(forgotten)")
        try run(
            """
            INSERT INTO ended_session (token, uid, ending, ended_at)
            SELECT t, u, e, \(now) FROM unnest(\(endings.map(\.digest))::text[], \(endings.map(\.uid))::text[],
              \(endings.map(\.ending.rawValue))::text[]) AS x(t, u, e)
            ON CONFLICT (token) DO UPDATE SET uid = excluded.uid, ending = excluded.ending, ended_at = excluded.ended_at
            """)
    }

    /// How the session whose secret has `digest` ended, if it did within the retention window.
    func ending(of digest: String) throws -> (uid: String, ending: SessionEnding)? {
        let since = now.addingTimeInterval(-SessionEnding.retention)
        let rows = try transaction.rows(
            "SELECT uid, ending FROM ended_session WHERE token = \(digest) AND ended_at >= \(since)")
        for (uid, ending) in try rows.decode((String, String).self) {
            if let ending = SessionEnding(rawValue: ending) { return (uid, ending) }
        }
        return nil
    }

    func liveSessions(of uid: String) throws -> Int {
        let rows = try transaction.rows("SELECT count(*) FROM session WHERE uid = \(uid)")
        return Int(try rows.first?.decode(Int64.self) ?? Int64(0))
    }

    // MARK: Statements

    /// Queues `query` (sent with the next read, or with COMMIT).
    func run(_ query: PipelineQuery) throws {
        try transaction.send(query)
    }

    /// The uid the statement returns, if it returns a row.
    func uid(of query: PipelineQuery) throws -> String? {
        try transaction.rows(query).first?.decode(String.self)
    }
}
