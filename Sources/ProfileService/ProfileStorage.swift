import Foundation
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime

/// Where profile keeps profiles and the usernames they hold, with the outbox of the events each
/// change causes: SQLite (the embedded default, ``SQLiteProfileDatabase``) or PostgreSQL
/// (`ProfilePostgresDatabase` in the `ProfilePostgres` module).
///
/// Every implementation keeps the same promises, and one test suite checks both:
/// - each change and its event commit together, and the event is published after the commit,
///   in sequence order;
/// - of any number of simultaneous claims of one username (letter case and Unicode composition
///   ignored), exactly one wins, whichever process or replica makes them;
/// - a create that repeats its idempotency key is answered with the profile as it is, and
///   records nothing;
/// - once creates are abandoned through an attempt, no create at or below it makes a profile;
/// - every answer says how new it is (``ProfileResult/asOfSequence``);
/// - a failing database is `storeUnavailable` (or, past the time limit, `timeout`), never "no
///   profile".
///
/// Thread safety: any task may call any method.
public protocol ProfileStorage: Sendable {
    /// The profile of `uid` (`nil`: none) and how new that answer is: for a profile, the sequence
    /// of the event that last changed it; for none, the newest sequence recorded so far.
    func read(uid: String) async throws -> ProfileResult

    /// Whether `username` could be claimed now, and if not, why (a name held by anyone, the
    /// caller included, is `duplicated`).
    func availability(of username: String) async throws -> UsernameAvailability

    /// Creates the first profile of `uid` and records `ProfileCreated`; see
    /// ``ProfileStore/createRecorded(uid:username:imagePath:idempotencyKey:attempt:correlationId:)``.
    func createRecorded(
        uid: String, username: String, imagePath: String?, idempotencyKey: String?, attempt: UInt64?, correlationId: String?
    ) async throws -> (profile: Profile, sequence: UInt64)

    /// From now on refuses every create of `uid` whose attempt is at or below `attempt` (one
    /// that repeats the profile's own key excepted), and answers with the profile as it is, read
    /// after any create that reached the store first; see ``ProfileStore/abandonCreates(uid:through:)``.
    func abandonCreates(uid: String, through attempt: UInt64) async throws -> ProfileResult

    /// Changes the fields given and records `ProfileUpdated` when something changed.
    func updateRecorded(uid: String, username: String?, imagePath: String?, correlationId: String?)
        async throws -> (profile: Profile, sequence: UInt64)

    /// Deletes `uid`'s profile and records `ProfileDeleted`. - Returns: `false` when there was none.
    func delete(uid: String, reason: DeletionReason, correlationId: String?) async throws -> Bool

    /// The recorded events after `sequence`, for `events.after`.
    func events(after sequence: UInt64, limit: Int?) async throws -> EventPage
}

extension ProfileStorage {
    /// ``createRecorded(uid:username:imagePath:idempotencyKey:attempt:correlationId:)`` without
    /// an attempt (never refused as abandoned).
    public func createRecorded(
        uid: String, username: String, imagePath: String?, idempotencyKey: String?, correlationId: String?
    ) async throws -> (profile: Profile, sequence: UInt64) {
        try await createRecorded(
            uid: uid, username: username, imagePath: imagePath, idempotencyKey: idempotencyKey, attempt: nil,
            correlationId: correlationId)
    }

    /// The profile of `uid`, or `nil` when that person has none (a normal answer).
    public func fetch(uid: String) async throws -> Profile? {
        try await read(uid: uid).profile
    }

    /// ``createRecorded(uid:username:imagePath:idempotencyKey:correlationId:)``'s profile.
    public func create(
        uid: String, username: String, imagePath: String?, idempotencyKey: String? = nil, correlationId: String? = nil
    ) async throws -> Profile {
        try await createRecorded(
            uid: uid, username: username, imagePath: imagePath, idempotencyKey: idempotencyKey,
            correlationId: correlationId
        ).profile
    }

    /// ``createRecorded(uid:username:imagePath:idempotencyKey:correlationId:)`` without a
    /// correlation id.
    public func createRecorded(
        uid: String, username: String, imagePath: String?, idempotencyKey: String? = nil
    ) async throws -> (profile: Profile, sequence: UInt64) {
        try await createRecorded(
            uid: uid, username: username, imagePath: imagePath, idempotencyKey: idempotencyKey, correlationId: nil)
    }

    /// ``updateRecorded(uid:username:imagePath:correlationId:)`` without a correlation id.
    public func updateRecorded(uid: String, username: String?, imagePath: String?) async throws
        -> (profile: Profile, sequence: UInt64)
    {
        try await updateRecorded(uid: uid, username: username, imagePath: imagePath, correlationId: nil)
    }

    /// ``updateRecorded(uid:username:imagePath:correlationId:)``'s profile.
    public func update(uid: String, username: String?, imagePath: String?, correlationId: String? = nil)
        async throws -> Profile
    {
        try await updateRecorded(uid: uid, username: username, imagePath: imagePath, correlationId: correlationId).profile
    }

    /// ``delete(uid:reason:correlationId:)`` without a correlation id.
    public func delete(uid: String, reason: DeletionReason) async throws -> Bool {
        try await delete(uid: uid, reason: reason, correlationId: nil)
    }
}

/// What every store of profile is opened with.
public struct ProfileStorageContext: Sendable {
    /// Where the store publishes the events it commits.
    public var publisher: any EventPublisher
    /// The cache in front of the store, which the store keeps true to what is committed: its own
    /// changes, in commit order, and (for a store shared by replicas) every other replica's.
    public var cache: ProfileCache
    public var eventRetention: Outbox.Retention
    public var logger: Logger

    public init(publisher: any EventPublisher, cache: ProfileCache, eventRetention: Outbox.Retention, logger: Logger) {
        self.publisher = publisher
        self.cache = cache
        self.eventRetention = eventRetention
        self.logger = logger
    }
}

/// A database profile can keep its store in: opened, migrated and looked after for as long as
/// profile runs.
public protocol ProfileDatabase: Sendable, CustomStringConvertible {
    /// Opens the store, runs `body` with it, and closes it when `body` returns or throws.
    ///
    /// - Throws: ``ServiceError`` `storeUnavailable` when the database cannot be opened or
    ///   migrated; what `body` throws.
    func withStorage<T: Sendable>(
        _ context: ProfileStorageContext, _ body: @Sendable (any ProfileStorage) async throws -> T
    ) async throws -> T
}

/// profile's store in a SQLite file (or in memory, for tests): the embedded default.
public struct SQLiteProfileDatabase: ProfileDatabase {
    /// The file; `nil` keeps everything in memory.
    public var path: String?

    public init(path: String?) {
        self.path = path
    }

    public var description: String { path.map { "SQLite at \($0)" } ?? "SQLite in memory" }

    public func withStorage<T: Sendable>(
        _ context: ProfileStorageContext, _ body: @Sendable (any ProfileStorage) async throws -> T
    ) async throws -> T {
        let (logger, cache) = (context.logger, context.cache)
        return try await withSQLiteStore(
            path: path, retention: context.eventRetention, logger: logger, open: { try ProfileStore.openDatabase(path: $0) }
        ) { writer in
            let store = ProfileStore(
                writer: writer, outbox: Outbox(source: ServiceName.profile, publisher: context.publisher), logger: logger,
                afterCommit: { uid, profile, sequence in
                    if let profile { cache.store(profile, sequence: sequence) } else { cache.remove(uid) }
                })
            return try await body(store)
        }
    }
}

/// The rules every profile store applies before it touches its database.
package enum ProfileRules {
    package static let profileExists = ServiceError(
        .profileExists, "This person already has a profile; change it with profile.update.")

    package static let createAbandoned = ServiceError(
        .invalidRequest,
        "This create's attempt was abandoned (its set-up was given up and cleaned away); a new set-up makes a new attempt.",
        reason: CreateProfile.abandonedReason)

    package static let profileNotFound = ServiceError(
        .profileNotFound, "This person has no profile to change; create it with profile.create.")

    /// The username as stored (NFC) and its uniqueness key, from one bounded check: the name is
    /// normalized once per request.
    package static func validated(_ username: String) throws(ServiceError) -> (name: String, key: String) {
        let checked = UsernameRules.check(username)
        guard let key = checked.uniquenessKey else { throw .username(checked.problem ?? .invalidCharacters) }
        return (checked.normalized, key)
    }

    /// An image path must name one of the person's own images exactly as image-upload makes
    /// them (``StoredImagePath``): `<uid>/<name>.<extension>`, where the name is a UUID or an
    /// idempotency key and the extension an image kind's. Anything else (another person's
    /// image, a thumbnail, `<uid>/evil<script>.html`) is refused.
    package static func validate(imagePath: String?, of uid: String) throws(ServiceError) {
        guard let imagePath else { return }
        guard StoredImagePath.imageFileName(in: imagePath, uid: uid) != nil else {
            throw ServiceError(
                .invalidRequest,
                "imagePath must be the path image.upload returned for this person (<uid>/<name>.<png|jpeg|webp|heic>); "
                    + "leave it out when there is no image.")
        }
    }

    /// Everything a create checks before the store: the idempotency key, the username and the
    /// image path. - Returns: the username as stored and its uniqueness key.
    package static func checkCreate(
        uid: String, username: String, imagePath: String?, idempotencyKey: String?
    ) throws(ServiceError) -> (name: String, key: String) {
        if let problem = IdempotencyKey.problem(idempotencyKey) { throw problem }
        let checked = try validated(username)
        try validate(imagePath: imagePath, of: uid)
        return checked
    }
}
