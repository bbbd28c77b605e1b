import Foundation
import Logging
import Messaging
import OnboardingAPI
import PostgresNIO
import PostgresSupport
import ProfileService
import ServiceRuntime

/// profile's profiles in PostgreSQL, with the outbox of their events (``PostgresOutbox``): what
/// ``ProfileStore`` is on SQLite, for several replicas.
///
/// Every change is one ``PostgresStore/eventTransaction(_:afterCommit:)``: it takes the outbox
/// head's lock first, so profile's changes take turns whichever replica makes them, and each
/// reads what the one before committed. A username is claimed by the `UNIQUE` key on its
/// uniqueness key, so of simultaneous claims exactly one wins. Profile changes are few (one
/// create per person, the odd update): one transaction each, unbatched, as on SQLite.
///
/// Each committed change is also announced with `NOTIFY` on ``channel`` (its sequence and uid),
/// which every replica's ``followChanges()`` turns into an eviction from its cache.
///
/// Thread safety: immutable; any task may call any method.
final class ProfilePostgresStore: ProfileStorage {
    let store: PostgresStore
    let cache: ProfileCache
    let publisher: any EventPublisher
    let logger: Logger
    /// The `NOTIFY` channel of this schema's changes.
    let channel: String
    private let outbox = PostgresOutbox(source: ServiceName.profile)

    init(store: PostgresStore, context: ProfileStorageContext) {
        self.store = store
        self.cache = context.cache
        self.publisher = context.publisher
        self.logger = context.logger
        self.channel = "\(store.location.schema)_changes"
    }

    static func migrator(schema: String) throws -> PostgresMigrator {
        var migrator = try PostgresMigrator(schema: schema)
        PostgresOutbox.registerMigration(in: &migrator)
        migrator.register(
            "profile-v1",
            [
                // Times are kept as the API writes them (ISO 8601 text), so they read back exactly.
                """
                CREATE TABLE profile (
                  uid text PRIMARY KEY,
                  username text NOT NULL,
                  username_key text NOT NULL UNIQUE,
                  image_path text,
                  created_at text NOT NULL,
                  updated_at text NOT NULL,
                  create_key text,
                  sequence bigint NOT NULL)
                """
            ])
        // Per person, the highest attempt whose creates were abandoned (see abandonCreates).
        migrator.register(
            "profile-v2-abandoned-creates",
            ["CREATE TABLE abandoned_creates (uid text PRIMARY KEY, through_attempt bigint NOT NULL)"])
        return migrator
    }

    // MARK: Reading

    func read(uid: String) async throws -> ProfileResult {
        let logger = self.logger
        return try await store.read { connection in
            // The profile, or the newest sequence when there is none: one snapshot.
            let rows = try await connection.query(
                """
                SELECT h.sequence, p.uid, p.username, p.image_path, p.created_at, p.updated_at, p.sequence
                FROM outbox_head h LEFT JOIN profile p ON p.uid = \(uid)
                WHERE h.id = 1
                """,
                logger: logger)
            var result = ProfileResult(profile: nil, asOfSequence: 0)
            for try await (last, uid, username, imagePath, createdAt, updatedAt, sequence) in rows.decode(
                (Int64, String?, String?, String?, String?, String?, Int64?).self)
            {
                if let uid, let username, let createdAt, let updatedAt, let sequence {
                    let profile = Profile(
                        uid: uid, username: username, imagePath: imagePath, createdAt: createdAt, updatedAt: updatedAt)
                    result = ProfileResult(profile: profile, asOfSequence: UInt64(clamping: sequence))
                } else {
                    result = ProfileResult(profile: nil, asOfSequence: UInt64(clamping: last))
                }
            }
            return result
        }
    }

    func availability(of username: String) async throws -> UsernameAvailability {
        let checked = UsernameRules.check(username)
        guard let key = checked.uniquenessKey else {
            return UsernameAvailability(username: checked.normalized, available: false, reason: checked.problem)
        }
        let logger = self.logger
        let taken = try await store.read { connection in
            var taken = false
            for try await held in try await connection.query(
                "SELECT EXISTS (SELECT 1 FROM profile WHERE username_key = \(key))", logger: logger
            ).decode(Bool.self) { taken = held }
            return taken
        }
        return UsernameAvailability(username: checked.normalized, available: !taken, reason: taken ? .duplicated : nil)
    }

    func events(after sequence: UInt64, limit: Int?) async throws -> EventPage {
        let logger = self.logger
        return try await store.read { connection in
            try await PostgresOutbox.events(after: sequence, limit: limit, on: connection, logger: logger)
        }
    }

    // MARK: Changing

    func createRecorded(
        uid: String, username: String, imagePath: String?, idempotencyKey: String?, attempt: UInt64?, correlationId: String?
    ) async throws -> (profile: Profile, sequence: UInt64) {
        let (username, usernameKey) = try ProfileRules.checkCreate(
            uid: uid, username: username, imagePath: imagePath, idempotencyKey: idempotencyKey)
        return try await change { connection, last in
            if let existing = try await self.row(uid: uid, on: connection) {
                guard let idempotencyKey, existing.createKey == idempotencyKey else { throw ProfileRules.profileExists }
                return Change(profile: existing.profile, sequence: existing.sequence, uid: uid)
            }
            if let attempt, attempt <= (try await self.abandonedThrough(uid: uid, on: connection)) {
                throw ProfileRules.createAbandoned
            }
            let now = Timestamp.now()
            let sequence = last + 1
            try await Self.claimingUsername {
                try await connection.query(
                    """
                    INSERT INTO profile (uid, username, username_key, image_path, created_at, updated_at, create_key, sequence)
                    VALUES (\(uid), \(username), \(usernameKey), \(imagePath), \(now), \(now), \(idempotencyKey), \(sequence))
                    """,
                    logger: self.logger)
            }
            let profile = Profile(uid: uid, username: username, imagePath: imagePath, createdAt: now, updatedAt: now)
            return try await self.recorded(
                ProfileCreated(profile: profile), profile: profile, uid: uid, after: last, correlationId: correlationId,
                on: connection)
        }.result
    }

    /// In a change's transaction, after the outbox head's lock: a create of `uid` either
    /// committed before (and the profile read here shows it) or reads the mark after this commits.
    func abandonCreates(uid: String, through attempt: UInt64) async throws -> ProfileResult {
        let logger = self.logger
        let change = try await change { connection, last in
            try await connection.query(
                """
                INSERT INTO abandoned_creates (uid, through_attempt) VALUES (\(uid), \(Int64(clamping: attempt)))
                ON CONFLICT (uid) DO UPDATE SET through_attempt = greatest(abandoned_creates.through_attempt, excluded.through_attempt)
                """,
                logger: logger)
            guard let row = try await self.row(uid: uid, on: connection) else {
                return Change(profile: nil, sequence: UInt64(clamping: last), uid: uid)
            }
            return Change(profile: row.profile, sequence: row.sequence, uid: uid)
        }
        return ProfileResult(profile: change.profile, asOfSequence: change.sequence)
    }

    private func abandonedThrough(uid: String, on connection: PostgresConnection) async throws -> UInt64 {
        for try await through in try await connection.query(
            "SELECT through_attempt FROM abandoned_creates WHERE uid = \(uid)", logger: logger
        ).decode(Int64.self) { return UInt64(clamping: through) }
        return 0
    }

    func updateRecorded(uid: String, username: String?, imagePath: String?, correlationId: String?)
        async throws -> (profile: Profile, sequence: UInt64)
    {
        let username = try username.map { name throws(ServiceError) in try ProfileRules.validated(name) }
        try ProfileRules.validate(imagePath: imagePath, of: uid)
        return try await change { connection, last in
            guard var row = try await self.row(uid: uid, on: connection) else { throw ProfileRules.profileNotFound }
            let before = row
            if let username {
                row.profile.username = username.name
                row.usernameKey = username.key
            }
            if let imagePath { row.profile.imagePath = imagePath }
            guard row != before else { return Change(profile: row.profile, sequence: row.sequence, uid: uid) }
            row.profile.updatedAt = Timestamp.now()
            let (profile, key, sequence) = (row.profile, row.usernameKey, last + 1)
            try await Self.claimingUsername {
                try await connection.query(
                    """
                    UPDATE profile SET username = \(profile.username), username_key = \(key), image_path = \(profile.imagePath),
                      updated_at = \(profile.updatedAt), sequence = \(sequence)
                    WHERE uid = \(uid)
                    """,
                    logger: self.logger)
            }
            return try await self.recorded(
                ProfileUpdated(profile: profile), profile: profile, uid: uid, after: last, correlationId: correlationId,
                on: connection)
        }.result
    }

    func delete(uid: String, reason: DeletionReason, correlationId: String?) async throws -> Bool {
        try await change { connection, last in
            var deleted = false
            for try await _ in try await connection.query("DELETE FROM profile WHERE uid = \(uid) RETURNING 1", logger: self.logger) {
                deleted = true
            }
            guard deleted else { return Change(profile: nil, sequence: 0, uid: uid, deleted: false) }
            return try await self.recorded(
                ProfileDeleted(uid: uid, reason: reason), profile: nil, uid: uid, after: last, correlationId: correlationId,
                on: connection)
        }.deleted
    }

    // MARK: Transactions

    /// What a change did: the profile now (`nil`: deleted), the sequence of the event that last
    /// changed it, and the event to publish (none when nothing changed).
    struct Change: Sendable {
        var profile: Profile?
        var sequence: UInt64
        var uid: String
        var deleted = true
        var messages: [OutgoingMessage] = []

        var result: (profile: Profile, sequence: UInt64) {
            get throws {
                guard let profile else { throw ServiceError(.internalError, "profile's store lost a profile it just wrote.") }
                return (profile, sequence)
            }
        }
    }

    /// Runs `body` in an event transaction; once it has committed, publishes its event and
    /// brings this replica's cache up to date (even when the caller has stopped waiting).
    private func change(_ body: @escaping @Sendable (PostgresConnection, _ last: Int64) async throws -> Change)
        async throws -> Change
    {
        let (cache, publisher) = (self.cache, self.publisher)
        return try await store.eventTransaction(body) { change in
            guard !change.messages.isEmpty else { return }
            if let profile = change.profile {
                cache.store(profile, sequence: change.sequence)
            } else {
                cache.remove(change.uid)
            }
            // Only queued for the bus's I/O thread: never blocks. Changes take turns, so in order.
            for message in change.messages { try? publisher.publish(message) }
        }
    }

    /// Records `event` after `last` and tells every replica (``channel``), in the transaction.
    private func recorded<Event: APIEvent>(
        _ event: Event, profile: Profile?, uid: String, after last: Int64, correlationId: String?,
        on connection: PostgresConnection
    ) async throws -> Change {
        let messages = try await outbox.record(
            [PostgresOutbox.Recording(event, uid: uid, correlationId: correlationId)], after: last, on: connection,
            logger: logger)
        let sequence = last + 1
        // Delivered to listeners when (and only if) the transaction commits.
        try await connection.query("SELECT pg_notify(\(channel), \("\(sequence) \(uid)"))", logger: logger)
        return Change(profile: profile, sequence: UInt64(sequence), uid: uid, messages: messages)
    }

    /// A profile row: the profile, its uniqueness key, its create's idempotency key, and the
    /// sequence of the event that last changed it.
    struct Row: Equatable {
        var profile: Profile
        var usernameKey: String
        var createKey: String?
        var sequence: UInt64
    }

    private func row(uid: String, on connection: PostgresConnection) async throws -> Row? {
        let rows = try await connection.query(
            """
            SELECT username, username_key, image_path, created_at, updated_at, create_key, sequence
            FROM profile WHERE uid = \(uid)
            """,
            logger: logger)
        for try await (username, key, imagePath, createdAt, updatedAt, createKey, sequence) in rows.decode(
            (String, String, String?, String, String, String?, Int64).self)
        {
            return Row(
                profile: Profile(uid: uid, username: username, imagePath: imagePath, createdAt: createdAt, updatedAt: updatedAt),
                usernameKey: key, createKey: createKey, sequence: UInt64(clamping: sequence))
        }
        return nil
    }

    /// Runs a write that may claim a username, turning the database's verdict on uniqueness into
    /// the domain's (the transaction is then rolled back).
    private static func claimingUsername(_ write: () async throws -> Void) async throws {
        do {
            try await write()
        } catch let error as PSQLError where error.serverInfo?[.sqlState] == "23505" {
            throw ServiceError.username(.duplicated)
        }
    }

    // MARK: Other replicas' changes

    /// Evicts from this replica's cache what other replicas change, for as long as the task
    /// runs: it listens on ``channel`` from a connection of its own. While it cannot listen (at
    /// start, or after the connection was lost) the cache keeps nothing, so that no replica ever
    /// answers from an entry another has made stale; once listening again, it starts empty.
    func followChanges() async {
        var delay = Duration.milliseconds(100)
        var failing = false
        while !Task.isCancelled, !store.isClosed {
            do {
                try await store.client.withConnection { connection in
                    try await connection.listen(on: self.channel) { notifications in
                        self.cache.isTracking = true
                        if failing { self.logger.notice("profile hears of other replicas' changes again; caching again") }
                        (failing, delay) = (false, .milliseconds(100))
                        for try await notification in notifications { self.apply(notification.payload) }
                    }
                }
            } catch {
                cache.isTracking = false
                try? await Task.sleep(for: delay)
                // A pool shut at the end of the run is no outage.
                guard !Task.isCancelled, !store.isClosed else { return }
                if !failing {
                    logger.warning(
                        "profile cannot hear of other replicas' changes (\(String(reflecting: error))); not caching until it can")
                }
                failing = true
                delay = min(delay * 2, .seconds(5))
                continue
            }
            cache.isTracking = false
        }
    }

    /// Evicts what a notification (`<sequence> <uid>`) made stale.
    private func apply(_ payload: String) {
        guard let space = payload.firstIndex(of: " "), let sequence = UInt64(payload[..<space]) else {
            // Not a notice this version writes: whatever it was about may be stale.
            cache.removeAll()
            return
        }
        cache.remove(String(payload[payload.index(after: space)...]), olderThan: sequence)
    }
}
