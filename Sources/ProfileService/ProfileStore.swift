import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime

/// The profile store: the single source of truth for profiles and the usernames they hold.
///
/// Every change and the event that reports it are written in one transaction (through the
/// ``Outbox``), so an event exists exactly when its change does. Username uniqueness is decided
/// by the database (a `UNIQUE` column on the uniqueness key), so of two simultaneous claims of one
/// name exactly one wins, whichever process or thread makes them.
///
/// Thread safety: a value over a `DatabaseWriter`, which serializes writes and may run reads
/// concurrently; every method may be called from any task. Database calls run on GRDB's own
/// queues, never on the caller's thread.
///
/// Errors: every method throws ``ServiceError`` only. The domain refusals are `invalidUsername`
/// (with the rule as `reason`), `usernameTaken`, `profileExists`, `profileNotFound` and
/// `invalidRequest`; any failure of the database itself is logged and thrown as
/// `storeUnavailable` (nothing was changed), never as a missing profile.
public struct ProfileStore: ProfileStorage {
    /// Told of each committed change: the person, their profile now (`nil`: deleted) and the
    /// sequence number of the event that reports the change.
    ///
    /// Called on the database's writer queue, in commit order, before the changing method
    /// returns; it must not block or touch the database.
    public typealias CommitObserver = @Sendable (_ uid: String, _ profile: Profile?, _ sequence: UInt64) -> Void

    public let writer: any DatabaseWriter
    public let outbox: Outbox
    private let logger: Logger
    private let afterCommit: CommitObserver?

    /// - Parameters:
    ///   - writer: the database, already migrated with ``migrator()``.
    ///   - outbox: records each change's event in the change's transaction.
    ///   - logger: where database failures are logged in full (callers get only a code).
    ///   - afterCommit: told of each committed change, to keep a cache in commit order.
    public init(writer: any DatabaseWriter, outbox: Outbox, logger: Logger, afterCommit: CommitObserver? = nil) {
        self.writer = writer
        self.outbox = outbox
        self.logger = logger
        self.afterCommit = afterCommit
    }

    /// The migrations of the profile database: the outbox and the `profile` table, whose
    /// `createKey` column (added by `profile-v2-create-key`) keeps the idempotency key of the
    /// create that made each profile, and whose `sequence` column (`profile-v3-sequence`) keeps
    /// the sequence number of the event that last changed it; `abandonedCreates`
    /// (`profile-v4-abandoned-creates`) keeps, per person, the attempt creates were abandoned through.
    public static func migrator() -> DatabaseMigrator {
        var migrator = DatabaseMigrator()
        Outbox.registerMigration(in: &migrator)
        migrator.registerMigration("profile-v1") { db in
            try db.create(table: ProfileRow.databaseTableName) { table in
                table.primaryKey("uid", .text)
                table.column("username", .text).notNull()
                table.column("usernameKey", .text).notNull().unique()
                table.column("imagePath", .text)
                table.column("createdAt", .text).notNull()
                table.column("updatedAt", .text).notNull()
            }
        }
        migrator.registerMigration("profile-v2-create-key") { db in
            try db.alter(table: ProfileRow.databaseTableName) { table in
                table.add(column: "createKey", .text)
            }
        }
        migrator.registerMigration("profile-v3-sequence") { db in
            try db.alter(table: ProfileRow.databaseTableName) { table in
                table.add(column: "sequence", .integer).notNull().defaults(to: 0)
            }
            // Profiles made before: as new as everything recorded so far (true of each of them now,
            // and the same cost for every row, pruned events or not).
            try db.execute(sql: "UPDATE profile SET sequence = ?", arguments: [Int64(clamping: try Outbox.lastSequence(in: db))])
        }
        // Per person, the highest attempt whose creates were abandoned (see abandonCreates).
        migrator.registerMigration("profile-v4-abandoned-creates") { db in
            try db.create(table: "abandonedCreates") { table in
                table.primaryKey("uid", .text)
                table.column("throughAttempt", .integer).notNull()
            }
        }
        return migrator
    }

    /// Opens the database at `path` (`nil`: a private in-memory one) and brings its schema up to
    /// date.
    ///
    /// Blocks the calling thread while the file is opened and migrated.
    /// - Throws: ``ServiceError`` `storeUnavailable` when it cannot be opened or migrated.
    public static func openDatabase(path: String?) throws(ServiceError) -> any DatabaseWriter {
        do {
            let writer = try ServiceDatabase.open(path: path)
            try migrator().migrate(writer)
            return writer
        } catch {
            throw ServiceError(
                .storeUnavailable, "The profile database at \(path ?? "(memory)") could not be opened: \(error)")
        }
    }

    // MARK: Reading

    /// The profile of `uid` (`nil`: none) and how new that answer is
    /// (``ProfileResult/asOfSequence``): for a profile, the sequence of the event that last
    /// changed it; for none, the newest sequence recorded so far, read in the same snapshot.
    ///
    /// - Throws: `storeUnavailable`.
    public func read(uid: String) async throws(ServiceError) -> ProfileResult {
        try await run(write: false) { db in try Self.read(uid: uid, in: db) }
    }

    /// ``read(uid:)`` inside the caller's transaction (the hot path, on the bus's thread).
    static func read(uid: String, in db: Database) throws -> ProfileResult {
        let statement = try db.cachedStatement(sql: "SELECT * FROM \(ProfileRow.databaseTableName) WHERE uid = ?")
        if let row = try ProfileRow.fetchOne(statement, arguments: [uid]) {
            return ProfileResult(profile: row.profile, asOfSequence: row.sequence)
        }
        return ProfileResult(profile: nil, asOfSequence: try Outbox.lastSequence(in: db))
    }

    /// Whether `username` could be claimed now, and if not, why.
    ///
    /// Format problems are reported without touching the store; the name is checked once, with
    /// bounded work (``UsernameRules/check(_:)``), so a hostile name costs microseconds. A name
    /// held by anyone, the caller included, is `duplicated`; letter case and Unicode composition
    /// are ignored.
    /// - Throws: `storeUnavailable`.
    public func availability(of username: String) async throws(ServiceError) -> UsernameAvailability {
        let checked = UsernameRules.check(username)
        guard let key = checked.uniquenessKey else {
            return UsernameAvailability(username: checked.normalized, available: false, reason: checked.problem)
        }
        let taken = try await run(write: false) { db in
            try !ProfileRow.filter(ProfileRow.Columns.usernameKey == key).isEmpty(db)
        }
        return UsernameAvailability(username: checked.normalized, available: !taken, reason: taken ? .duplicated : nil)
    }

    // MARK: Changing

    /// Creates the first profile of `uid`, storing the username's NFC form, and records
    /// `ProfileCreated`.
    ///
    /// With an `idempotencyKey`, the key is stored with the profile, and a later create for
    /// `uid` with the same key (a retry whose first reply was lost) is answered with the
    /// profile as it is now, without recording a second event. The retry's username and image
    /// path are not compared with the first request's: the key alone says it is the same
    /// request. A create with another key, or with none, while the profile exists is
    /// `profileExists`. Keys are compared exactly (letter case counts). Otherwise, a create whose
    /// `attempt` is at or below what ``abandonCreates(uid:through:)`` was given is refused
    /// (`invalidRequest`, reason `createAbandoned`).
    ///
    /// - Parameters:
    ///   - idempotencyKey: see ``IdempotencyKey``.
    ///   - attempt: the caller's number for this try (`nil`: never refused as abandoned).
    ///   - correlationId: the request that caused it, carried by the event.
    /// Answered with how new the answer is: the sequence of the `ProfileCreated` event (for a
    /// repeated key, of the event that last changed the profile).
    /// - Throws: `invalidUsername`, `invalidRequest` (an image path that is not one of this
    ///   person's as image-upload makes them, or a malformed idempotency key), `profileExists`,
    ///   `usernameTaken` or `storeUnavailable`.
    public func createRecorded(
        uid: String, username: String, imagePath: String?, idempotencyKey: String? = nil, attempt: UInt64? = nil,
        correlationId: String? = nil
    ) async throws(ServiceError) -> (profile: Profile, sequence: UInt64) {
        let (username, usernameKey) = try ProfileRules.checkCreate(
            uid: uid, username: username, imagePath: imagePath, idempotencyKey: idempotencyKey)
        let (outbox, afterCommit) = (self.outbox, self.afterCommit)
        return try await run { db in
            if let existing = try ProfileRow.fetchOne(db, key: uid) {
                guard let idempotencyKey, existing.createKey == idempotencyKey else { throw ProfileRules.profileExists }
                return (existing.profile, existing.sequence)
            }
            if let attempt, attempt <= (try Self.abandonedThrough(uid: uid, in: db)) { throw ProfileRules.createAbandoned }
            let now = Timestamp.now()
            var row = ProfileRow(
                uid: uid, username: username, usernameKey: usernameKey,
                imagePath: imagePath, createdAt: now, updatedAt: now, createKey: idempotencyKey)
            // The event first, so the row is written once with its sequence; a refused claim
            // below rolls both back.
            row.sequence = try outbox.append(ProfileCreated(profile: row.profile), uid: uid, correlationId: correlationId, in: db)
            try Self.claimingUsername { try row.insert(db) }
            Self.tell(afterCommit, uid: uid, profile: row.profile, sequence: row.sequence, in: db)
            return (row.profile, row.sequence)
        }
    }

    /// Refuses, from now on, every create of `uid` whose attempt is at or below `attempt` (a
    /// lower number than one given before changes nothing), and answers with the profile as it
    /// is. Writes are serialized, so a create either committed before (and the answer shows its
    /// profile) or reads the mark after it (and is refused): none of those attempts can make a
    /// profile once this has answered. Records no event.
    ///
    /// - Throws: `storeUnavailable`.
    public func abandonCreates(uid: String, through attempt: UInt64) async throws(ServiceError) -> ProfileResult {
        try await run { db in
            try db.execute(
                sql: """
                    INSERT INTO abandonedCreates (uid, throughAttempt) VALUES (?, ?)
                    ON CONFLICT (uid) DO UPDATE SET throughAttempt = max(throughAttempt, excluded.throughAttempt)
                    """,
                arguments: [uid, Int64(clamping: attempt)])
            return try Self.read(uid: uid, in: db)
        }
    }

    private static func abandonedThrough(uid: String, in db: Database) throws -> UInt64 {
        let through = try Int64.fetchOne(db, sql: "SELECT throughAttempt FROM abandonedCreates WHERE uid = ?", arguments: [uid])
        return UInt64(clamping: through ?? 0)
    }

    /// Changes the username and/or image path of `uid`'s profile and records `ProfileUpdated`.
    ///
    /// A field that is `nil` stays as it is. When nothing would change, the profile is returned
    /// as it is and no event is recorded.
    /// Answered with the sequence of the event that last changed the profile (this one's, when
    /// something changed).
    /// - Throws: `invalidUsername`, `invalidRequest` (an image path that is not one of this person's
    ///   as image-upload makes them), `profileNotFound`, `usernameTaken` or `storeUnavailable`.
    public func updateRecorded(uid: String, username: String?, imagePath: String?, correlationId: String? = nil)
        async throws(ServiceError) -> (profile: Profile, sequence: UInt64)
    {
        let username = try username.map { name throws(ServiceError) in try ProfileRules.validated(name) }
        try ProfileRules.validate(imagePath: imagePath, of: uid)
        let (outbox, afterCommit) = (self.outbox, self.afterCommit)
        return try await run { db in
            guard var row = try ProfileRow.fetchOne(db, key: uid) else { throw ProfileRules.profileNotFound }
            let before = row
            if let username {
                row.username = username.name
                row.usernameKey = username.key
            }
            if let imagePath { row.imagePath = imagePath }
            guard row != before else { return (row.profile, row.sequence) }
            row.updatedAt = Timestamp.now()
            row.sequence = try outbox.append(ProfileUpdated(profile: row.profile), uid: uid, correlationId: correlationId, in: db)
            try Self.claimingUsername { try row.update(db) }
            Self.tell(afterCommit, uid: uid, profile: row.profile, sequence: row.sequence, in: db)
            return (row.profile, row.sequence)
        }
    }

    /// Deletes `uid`'s profile, freeing its username, and records `ProfileDeleted` when there
    /// was one.
    ///
    /// - Returns: `false` when there was no profile to delete.
    /// - Throws: `storeUnavailable`.
    public func delete(uid: String, reason: DeletionReason, correlationId: String? = nil) async throws(ServiceError) -> Bool {
        let (outbox, afterCommit) = (self.outbox, self.afterCommit)
        return try await run { db in
            guard try ProfileRow.deleteOne(db, key: uid) else { return false }
            let sequence = try outbox.append(ProfileDeleted(uid: uid, reason: reason), uid: uid, correlationId: correlationId, in: db)
            Self.tell(afterCommit, uid: uid, profile: nil, sequence: sequence, in: db)
            return true
        }
    }

    // MARK: Replay

    /// The recorded events after `sequence`, for `events.after`.
    public func events(after sequence: UInt64, limit: Int?) async throws(ServiceError) -> EventPage {
        try await run(write: false) { db in try Outbox.events(after: sequence, limit: limit, in: db) }
    }

    // MARK: Rules

    private static func tell(_ observer: CommitObserver?, uid: String, profile: Profile?, sequence: UInt64, in db: Database) {
        guard let observer else { return }
        db.afterNextTransaction { _ in observer(uid, profile, sequence) }
    }

    /// Runs a write that may claim a username, turning the database's verdict on uniqueness into
    /// the domain's.
    private static func claimingUsername(_ write: () throws -> Void) throws {
        do {
            try write()
        } catch let error as DatabaseError where error.extendedResultCode == .SQLITE_CONSTRAINT_UNIQUE {
            throw ServiceError.username(.duplicated)
        } catch let error as DatabaseError where error.extendedResultCode == .SQLITE_CONSTRAINT_PRIMARYKEY {
            throw ProfileRules.profileExists
        }
    }

    private func run<T: Sendable>(write: Bool = true, _ body: @escaping @Sendable (Database) throws -> T)
        async throws(ServiceError) -> T
    {
        do {
            return write ? try await writer.writeTransactionToCompletion(body) : try await writer.read(body)
        } catch let error as ServiceError {
            throw error
        } catch {
            logger.error("The profile store failed: \(error)")
            throw ServiceError(.storeUnavailable, "The profile store failed. Nothing was changed; try again.")
        }
    }
}

/// A row of the `profile` table.
struct ProfileRow: Codable, Hashable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "profile"

    enum Columns {
        static let usernameKey = Column(CodingKeys.usernameKey)
    }

    var uid: String
    /// As entered, in NFC.
    var username: String
    /// NFC and lowercased: what uniqueness is decided on.
    var usernameKey: String
    var imagePath: String?
    var createdAt: String
    var updatedAt: String
    /// The idempotency key of the create that made this profile, if it had one.
    var createKey: String? = nil
    /// The sequence number of the event that last changed this profile.
    var sequence: UInt64 = 0

    var profile: Profile {
        Profile(uid: uid, username: username, imagePath: imagePath, createdAt: createdAt, updatedAt: updatedAt)
    }
}
