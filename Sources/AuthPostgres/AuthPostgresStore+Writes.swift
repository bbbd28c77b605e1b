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
            let (outcomes, _) = try await store.eventTransaction { connection, last in
                var batch = Batch(writer: self, connection: connection, now: now)
                let outcomes = try await batch.apply(jobs)
                return (outcomes, try await outbox.record(batch.events, after: last, on: connection, logger: logger))
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
    let connection: PostgresConnection
    let now: Date
    var events: [PostgresOutbox.Recording] = []

    init(writer: Writer, connection: PostgresConnection, now: Date) {
        self.writer = writer
        self.connection = connection
        self.now = now
    }

    var logger: Logger { writer.logger }

    /// The endings first, in order; then the sign-ins together. All were concurrent requests, so
    /// any order is one they could have had, and the events (``events``) follow the order applied.
    ///
    /// - Returns: each job's outcome.
    mutating func apply(_ jobs: [Write]) async throws -> [Result<Written, any Error>] {
        var outcomes = [Result<Written, any Error>](repeating: .success(.nothing), count: jobs.count)
        var signIns: [(index: Int, job: SignInJob)] = []
        for (index, job) in jobs.enumerated() {
            do {
                switch job {
                case .signIn(let provider, let subject, let correlationId):
                    signIns.append((index, SignInJob(provider: provider, subject: subject, correlationId: correlationId)))
                case .signOut(let token, let everywhere, let correlationId):
                    outcomes[index] = .success(.uid(try await signOut(token, everywhere: everywhere, correlationId)))
                case .withdraw(let token, let correlationId):
                    outcomes[index] = .success(.uid(try await withdraw(token, correlationId)))
                case .expire(let id, let digest, let uid):
                    try await expire(id: id, digest: digest, uid: uid)
                }
            } catch let refusal as Refusal {
                outcomes[index] = .failure(refusal.error)
            }
        }
        if !signIns.isEmpty {
            let results = try await signIn(signIns.map(\.job))
            for (index, result) in zip(signIns.map(\.index), results) { outcomes[index] = .success(.signedIn(result)) }
        }
        return outcomes
    }

    // MARK: Endings

    mutating func signOut(_ token: String, everywhere: Bool, _ correlationId: String) async throws -> String {
        let (id, digest) = AuthPostgresStore.row(of: SessionKey(token: token))
        // Deleting decides: of two requests that end one session (here or on another replica),
        // one deletes the row and records the ending; the other finds the ending.
        if let uid = try await uid(of: "DELETE FROM session WHERE id = \(id) AND token = \(digest) RETURNING uid") {
            if everywhere { try await run("DELETE FROM session WHERE uid = \(uid)") }
            try await recordEndings([(digest, uid, .signOut)])
            events.append(.init(SignedOut(uid: uid, sessions: try await liveSessions(of: uid)), uid: uid, correlationId: correlationId))
            return uid
        }
        if let ended = try await ending(of: digest) { return ended.uid }
        throw Refusal(error: SessionRefusal.unknown)
    }

    mutating func withdraw(_ token: String, _ correlationId: String) async throws -> String {
        let (id, digest) = AuthPostgresStore.row(of: SessionKey(token: token))
        let cutoff = writer.sessions.expiryCutoff(now: now)
        // An expired session (last used at the cutoff or before) cannot withdraw, even before it
        // is pruned.
        if let uid = try await uid(
            of: "DELETE FROM session WHERE id = \(id) AND token = \(digest) AND last_used_at > \(cutoff) RETURNING uid")
        {
            try await run(
                """
                INSERT INTO unlink_job (uid, provider, subject, token, attempts, created_at, next_attempt_at)
                SELECT a.uid, a.provider, a.subject, g.token, 0, \(now), \(now)
                FROM account a LEFT JOIN provider_grant g ON g.uid = a.uid
                WHERE a.uid = \(uid)
                ON CONFLICT (uid) DO UPDATE SET provider = excluded.provider, subject = excluded.subject,
                  token = excluded.token, attempts = 0, created_at = excluded.created_at,
                  next_attempt_at = excluded.next_attempt_at, last_error = NULL, last_attempt_at = NULL, claim = NULL
                """)
            try await run("DELETE FROM account WHERE uid = \(uid)")
            try await recordEndings([(digest, uid, .withdrawal)])
            events.append(.init(Withdrawn(uid: uid), uid: uid, correlationId: correlationId))
            return uid
        }
        if let ended = try await ending(of: digest), ended.ending.answersWithdrawal { return ended.uid }
        throw Refusal(error: SessionRefusal.unknown)
    }

    mutating func expire(id: Int64, digest: String, uid: String) async throws {
        // Another request may have ended it first: then nothing is left to do.
        guard try await self.uid(of: "DELETE FROM session WHERE id = \(id) AND token = \(digest) RETURNING uid") != nil
        else { return }
        try await recordEndings([(digest, uid, .expired)])
        events.append(
            .init(
                SignedOut(uid: uid, sessions: try await liveSessions(of: uid)), uid: uid,
                correlationId: UUID().uuidString.lowercased()))
    }

    /// Records how sessions ended, and forgets the endings older than ``SessionEnding/retention``.
    func recordEndings(_ endings: [(digest: String, uid: String, ending: SessionEnding)]) async throws {
        guard !endings.isEmpty else { return }
        let forgotten = now.addingTimeInterval(-SessionEnding.retention)
        try await run("DELETE FROM ended_session WHERE ended_at < \(forgotten)")
        try await run(
            """
            INSERT INTO ended_session (token, uid, ending, ended_at)
            SELECT t, u, e, \(now) FROM unnest(\(endings.map(\.digest))::text[], \(endings.map(\.uid))::text[],
              \(endings.map(\.ending.rawValue))::text[]) AS x(t, u, e)
            ON CONFLICT (token) DO UPDATE SET uid = excluded.uid, ending = excluded.ending, ended_at = excluded.ended_at
            """)
    }

    /// How the session whose secret has `digest` ended, if it did within the retention window.
    func ending(of digest: String) async throws -> (uid: String, ending: SessionEnding)? {
        let since = now.addingTimeInterval(-SessionEnding.retention)
        let rows = try await connection.query(
            "SELECT uid, ending FROM ended_session WHERE token = \(digest) AND ended_at >= \(since)", logger: logger)
        for try await (uid, ending) in rows.decode((String, String).self) {
            if let ending = SessionEnding(rawValue: ending) { return (uid, ending) }
        }
        return nil
    }

    func liveSessions(of uid: String) async throws -> Int {
        let rows = try await connection.query("SELECT count(*) FROM session WHERE uid = \(uid)", logger: logger)
        var count: Int64 = 0
        for try await value in rows.decode(Int64.self) { count = value }
        return Int(count)
    }

    // MARK: Statements

    func run(_ query: PostgresQuery) async throws {
        try await connection.query(query, logger: logger)
    }

    /// The uid the statement returns, if it returns a row.
    func uid(of query: PostgresQuery) async throws -> String? {
        for try await uid in try await connection.query(query, logger: logger).decode(String.self) { return uid }
        return nil
    }
}
