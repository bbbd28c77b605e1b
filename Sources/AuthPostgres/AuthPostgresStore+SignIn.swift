import AuthService
import Foundation
import Messaging
import OnboardingAPI
import PostgresNIO

/// One sign-in of a batch.
struct SignInJob: Sendable {
    var provider: Provider
    var subject: String
    var correlationId: String
}

extension Batch {
    /// Signs in every job of the batch with a fixed number of statements, however many there are:
    /// the accounts (found or created), the sessions, the endings ``SessionPolicy`` asks for, and
    /// at most once a second the pruning of other accounts' expired sessions.
    ///
    /// Each result is what a sign-in alone, in the jobs' order, would have given, with one
    /// exception: the session count of an account that ends sessions in the batch is counted
    /// after all of its endings.
    mutating func signIn(_ jobs: [SignInJob]) async throws -> [SignInResult] {
        let accounts = try await findOrCreateAccounts(jobs)
        let secrets = jobs.map { _ in SessionToken.makeSecret() }
        let digests = secrets.map(SessionToken.digest)
        let uids = accounts.map(\.uid)
        // Session ids come back with the digest each was stored under (digests are random, so
        // unique): RETURNING promises no order.
        var ids: [String: Int64] = [:]
        let inserted = try await connection.query(
            """
            INSERT INTO session (token, uid, created_at, last_used_at)
            SELECT t, u, \(now), \(now) FROM unnest(\(digests)::text[], \(uids)::text[]) AS x(t, u)
            RETURNING id, token
            """,
            logger: logger)
        for try await (id, digest) in inserted.decode((Int64, String).self) { ids[digest] = id }
        let sessionIDs = try digests.map { digest in
            guard let id = ids[digest] else { throw ServiceError(.internalError, "A new session was not stored; try again.") }
            return id
        }

        let live = try await endSessions(ofReturning: Set(accounts.filter { !$0.isNew }.map(\.uid)))
        try await pruneOthers(keeping: Set(uids), correlationId: jobs[0].correlationId)

        var results: [SignInResult] = []
        for (index, job) in jobs.enumerated() {
            let (uid, isNew, id) = (accounts[index].uid, accounts[index].isNew, sessionIDs[index])
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

    /// The account of each job, created when new. A new account gets a time-ordered uid. Rows
    /// are inserted in key order, so two batches that create the same accounts (on two replicas)
    /// wait for each other instead of deadlocking; one that waits then finds the other's row.
    private func findOrCreateAccounts(_ jobs: [SignInJob]) async throws -> [(uid: String, isNew: Bool)] {
        let candidates = jobs.map { _ in Identifier.timeOrdered(now: now) }
        let order = jobs.indices.sorted { (jobs[$0].provider.rawValue, jobs[$0].subject) < (jobs[$1].provider.rawValue, jobs[$1].subject) }
        let rows = try await connection.query(
            """
            INSERT INTO account (uid, provider, subject, created_at)
            SELECT u, p, s, \(now)
            FROM unnest(\(order.map { candidates[$0] })::text[], \(order.map { jobs[$0].provider.rawValue })::text[],
              \(order.map { jobs[$0].subject })::text[]) WITH ORDINALITY AS x(u, p, s, n)
            ORDER BY n
            ON CONFLICT (provider, subject) DO NOTHING
            RETURNING uid
            """,
            logger: logger)
        var created: Set<String> = []
        for try await uid in rows.decode(String.self) { created.insert(uid) }

        var accounts = candidates.map { (uid: $0, isNew: created.contains($0)) }
        let existing = jobs.indices.filter { !accounts[$0].isNew }
        guard !existing.isEmpty else { return accounts }
        let found = try await connection.query(
            """
            SELECT a.provider, a.subject, a.uid
            FROM account a JOIN unnest(\(existing.map { jobs[$0].provider.rawValue })::text[],
              \(existing.map { jobs[$0].subject })::text[]) AS x(p, s) ON a.provider = x.p AND a.subject = x.s
            """,
            logger: logger)
        var uids: [String: String] = [:]
        for try await (provider, subject, uid) in found.decode((String, String, String).self) {
            uids[provider + "\u{0}" + subject] = uid
        }
        for index in existing {
            guard let uid = uids[jobs[index].provider.rawValue + "\u{0}" + jobs[index].subject] else {
                throw ServiceError(.internalError, "The account vanished while signing in; try again.")
            }
            accounts[index].uid = uid
        }
        return accounts
    }

    /// Applies ``SessionPolicy`` to the accounts that signed in again (their new sessions
    /// included): ends the expired ones and those beyond the cap, recording each ending.
    ///
    /// - Returns: the ids of each account's sessions still live.
    private func endSessions(ofReturning uids: Set<String>) async throws -> [String: [Int64]] {
        guard !uids.isEmpty else { return [:] }
        let rows = try await connection.query(
            """
            SELECT uid, id, token, last_used_at FROM session WHERE uid = ANY(\(Array(uids))::text[])
            ORDER BY uid, last_used_at DESC, id DESC
            """,
            logger: logger)
        var sessions: [String: [(id: Int64, digest: String, lastUsed: Date)]] = [:]
        for try await (uid, id, digest, lastUsed) in rows.decode((String, Int64, String, Date).self) {
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
            try await run("DELETE FROM session WHERE id = ANY(\(endedIDs)::bigint[])")
            try await recordEndings(ended)
        }
        return live
    }

    /// At most once a second (``SessionPruneSchedule``): ends up to a batch of other accounts'
    /// expired sessions, telling each such account with `SignedOut`. Rows another transaction
    /// holds are skipped (another replica is pruning them). The events carry the correlation
    /// id of the sign-in that pruned.
    private mutating func pruneOthers(keeping uids: Set<String>, correlationId: String) async throws {
        guard writer.pruning.isDue(at: now) else { return }
        let cutoff = writer.sessions.expiryCutoff(now: now)
        let rows = try await connection.query(
            """
            SELECT id, token, uid FROM session
            WHERE last_used_at < \(cutoff) AND NOT (uid = ANY(\(Array(uids))::text[]))
            LIMIT \(Int64(SessionPruneSchedule.batch)) FOR UPDATE SKIP LOCKED
            """,
            logger: logger)
        var stale: [(id: Int64, digest: String, uid: String)] = []
        for try await row in rows.decode((Int64, String, String).self) { stale.append(row) }
        writer.pruning.looked(at: now, found: stale.count)
        guard !stale.isEmpty else { return }
        try await run("DELETE FROM session WHERE id = ANY(\(stale.map(\.id))::bigint[])")
        try await recordEndings(stale.map { ($0.digest, $0.uid, .expired) })
        for owner in Set(stale.map(\.uid)).sorted() {
            events.append(
                .init(SignedOut(uid: owner, sessions: try await liveSessions(of: owner)), uid: owner, correlationId: correlationId))
        }
    }
}
