import AuthService
import Foundation
import Messaging
import OnboardingAPI
import PostgresNIO
import PostgresSupport

/// One sign-in of a batch.
struct SignInJob: Sendable {
    var provider: Provider
    var subject: String
    var correlationId: String
}

extension Batch {
    /// Signs in every job of the batch with a fixed number of statements, however many there are.
    /// For new accounts that is one: it creates the accounts and opens the sessions (a round trip
    /// to the database costs more than anything it does here). Accounts that sign in again add
    /// the endings ``SessionPolicy`` asks for; at most once a second, other accounts' expired
    /// sessions are pruned first. One `SignedIn` per job goes to ``events``.
    ///
    /// Each result is what a sign-in alone, in the jobs' order, would have given, with one
    /// exception: the session count of an account that ends sessions in the batch is counted
    /// after all of its endings.
    mutating func signIn(_ jobs: [SignInJob]) throws -> [SignInResult] {
        try pruneOthers(sparing: jobs)
        let secrets = jobs.map { _ in SessionToken.makeSecret() }
        let digests = secrets.map(SessionToken.digest)
        var accounts = try createAndOpen(jobs, digests: digests)
        if accounts.contains(where: { $0 == nil }) {
            try openLosers(jobs, digests: digests, into: &accounts)
        }
        let opened = accounts.map { $0! }

        let live = try endSessions(ofReturning: Set(opened.filter { !$0.isNew }.map(\.uid)))
        var results: [SignInResult] = []
        for (index, job) in jobs.enumerated() {
            let (uid, isNew, id) = (opened[index].uid, opened[index].isNew, opened[index].session)
            // As each sign-in alone would have counted: its account's live sessions up to its own.
            let sessions = isNew ? 1 : live[uid, default: []].filter { $0 <= id }.count
            events.append(
                .init(
                    SignedIn(uid: uid, provider: job.provider, isNewAccount: isNew, sessions: sessions), uid: uid,
                    correlationId: job.correlationId))
            results.append(
                SignInResult(
                    uid: uid, sessionToken: SessionToken.token(id: id, secret: secrets[index]), provider: job.provider,
                    isNewAccount: isNew))
        }
        return results
    }

    typealias Opened = (uid: String, isNew: Bool, session: Int64)

    /// One statement: creates the accounts that are new (time-ordered uids; of two jobs for one
    /// new account, the first creates it), finds the others, and opens a session for each job,
    /// their ids in the jobs' order.
    ///
    /// - Returns: each job's account and session, `nil` for a job whose account another
    ///   transaction created while this one waited (the statement's snapshot cannot see it).
    private func createAndOpen(_ jobs: [SignInJob], digests: [String]) throws -> [Opened?] {
        let statement = CreateAndOpen(
            candidates: jobs.map { _ in Identifier.timeOrdered(now: now) }, providers: jobs.map(\.provider.rawValue),
            subjects: jobs.map(\.subject), digests: digests, now: now)
        var accounts: [Opened?] = []
        for (uid, isNew, id) in try transaction.rows(statement.query).decode((String?, Bool, Int64?).self) {
            accounts.append(uid.flatMap { uid in id.map { (uid, isNew, $0) } })
        }
        guard accounts.count == jobs.count else {
            throw ServiceError(.storeUnavailable, "A sign-in of the batch went missing; try again.")
        }
        return accounts
    }

    /// ``createAndOpen(_:digests:)``'s statement.
    struct CreateAndOpen {
        static let sql = """
            WITH input AS (
              SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS x(candidate, provider, subject, digest, n)),
            created AS (
              INSERT INTO account (uid, provider, subject, created_at)
              SELECT candidate, provider, subject, $5 FROM input ORDER BY provider, subject, n
              ON CONFLICT (provider, subject) DO NOTHING
              RETURNING uid, provider, subject),
            resolved AS (
              SELECT i.n, i.digest, c.uid IS NOT NULL AND c.uid = i.candidate AS is_new, coalesce(c.uid, a.uid) AS uid
              FROM input i
              LEFT JOIN created c ON c.provider = i.provider AND c.subject = i.subject
              LEFT JOIN account a ON a.provider = i.provider AND a.subject = i.subject),
            opened AS (
              INSERT INTO session (token, uid, created_at, last_used_at)
              SELECT digest, uid, $5, $5 FROM resolved WHERE uid IS NOT NULL ORDER BY n
              RETURNING id, token)
            SELECT r.uid, r.is_new, o.id
            FROM resolved r LEFT JOIN opened o ON o.token = r.digest
            ORDER BY r.n
            """
        /// A fresh uid per job, taken by the jobs whose account is new.
        var candidates: [String]
        var providers: [String], subjects: [String], digests: [String]
        var now: Date

        var query: PipelineQuery {
            PipelineQuery(unsafeSQL: Self.sql) { query in
                for texts in [candidates, providers, subjects, digests] { query.bind(texts) }
                query.bind(now)
            }
        }
    }

    /// Opens the sessions of the jobs whose accounts another transaction created meanwhile (two
    /// first sign-ins of one account at once, on two replicas): now that it has committed, a new
    /// statement sees those accounts.
    private func openLosers(_ jobs: [SignInJob], digests: [String], into accounts: inout [Opened?]) throws {
        let losers = accounts.indices.filter { accounts[$0] == nil }
        let rows = try transaction.rows(
            """
            INSERT INTO session (token, uid, created_at, last_used_at)
            SELECT x.digest, a.uid, \(now), \(now)
            FROM unnest(\(losers.map { jobs[$0].provider.rawValue })::text[], \(losers.map { jobs[$0].subject })::text[],
              \(losers.map { digests[$0] })::text[]) AS x(provider, subject, digest)
            JOIN account a ON a.provider = x.provider AND a.subject = x.subject
            RETURNING id, token, uid
            """)
        var opened: [String: (Int64, String)] = [:]
        for (id, digest, uid) in try rows.decode((Int64, String, String).self) { opened[digest] = (id, uid) }
        for index in losers {
            guard let (id, uid) = opened[digests[index]] else {
                throw ServiceError(.storeUnavailable, "The account vanished while signing in; try again.")
            }
            accounts[index] = (uid, false, id)
        }
    }

    /// Applies ``SessionPolicy`` to the accounts that signed in again (their new sessions
    /// included): ends the expired ones and those beyond the cap, recording each ending.
    ///
    /// - Returns: the ids of each account's sessions still live.
    private func endSessions(ofReturning uids: Set<String>) throws -> [String: [Int64]] {
        guard !uids.isEmpty else { return [:] }
        let rows = try transaction.rows(
            """
            SELECT uid, id, token, last_used_at FROM session WHERE uid = ANY(\(Array(uids))::text[])
            ORDER BY uid, last_used_at DESC, id DESC
            """)
        var sessions: [String: [(id: Int64, digest: String, lastUsed: Date)]] = [:]
        for (uid, id, digest, lastUsed) in try rows.decode((String, Int64, String, Date).self) {
            sessions[uid, default: []].append((id, digest, lastUsed))
        }
        var ended: [(digest: String, uid: String, ending: SessionEnding)] = []
        var endedIDs: [Int64] = []
        var live: [String: [Int64]] = [:]
        for (uid, newestFirst) in sessions {
            let endings = writer.sessions.endings(atSignIn: newestFirst, now: now) { $0.lastUsed }
            let gone = Set(endings.map(\.session.id))
            live[uid] = newestFirst.map(\.id).filter { !gone.contains($0) }
            for (session, ending) in endings {
                ended.append((session.digest, uid, ending))
                endedIDs.append(session.id)
            }
        }
        if !endedIDs.isEmpty {
            try run("DELETE FROM session WHERE id = ANY(\(endedIDs)::bigint[])")
            try recordEndings(ended)
        }
        return live
    }

    /// At most once a second (``SessionPruneSchedule``): ends up to a batch of expired sessions,
    /// oldest first, of accounts that are not signing in now (their own are the policy's),
    /// telling each such account with `SignedOut`, carrying the correlation id of the batch's
    /// first sign-in. Rows another transaction holds are skipped (another replica is pruning them).
    ///
    /// The oldest first, so that the scan starts at the expired end of `last_used_at`'s index and
    /// stops at the cutoff: when nothing has expired it reads nothing. (Joined to `account` first,
    /// the planner went through every session instead, inside the sign-in transaction: 80–120 ms
    /// at 98,000 accounts on the bench's machine, where this takes 0.1 ms.)
    private mutating func pruneOthers(sparing jobs: [SignInJob]) throws {
        guard writer.pruning.isDue(at: now) else { return }
        let cutoff = writer.sessions.expiryCutoff(now: now)
        let rows = try transaction.rows(
            """
            SELECT s.id, s.token, s.uid FROM session s
            WHERE s.last_used_at <= \(cutoff)
              AND s.uid NOT IN (
                SELECT a.uid FROM unnest(\(jobs.map(\.provider.rawValue))::text[], \(jobs.map(\.subject))::text[]) AS x(provider, subject)
                JOIN account a ON a.provider = x.provider AND a.subject = x.subject)
            ORDER BY s.last_used_at
            LIMIT \(Int64(SessionPruneSchedule.batch)) FOR UPDATE OF s SKIP LOCKED
            """)
        let stale: [(id: Int64, digest: String, uid: String)] = try rows.decode((Int64, String, String).self)
        writer.pruning.looked(at: now, found: stale.count)
        guard !stale.isEmpty else { return }
        try run("DELETE FROM session WHERE id = ANY(\(stale.map(\.id))::bigint[])")
        try recordEndings(stale.map { ($0.digest, $0.uid, .expired) })
        for owner in Set(stale.map(\.uid)).sorted() {
            events.append(
                .init(
                    SignedOut(uid: owner, sessions: try liveSessions(of: owner)), uid: owner,
                    correlationId: jobs[0].correlationId))
        }
    }
}
