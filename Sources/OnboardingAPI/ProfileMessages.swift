public struct Profile: Codable, Sendable, Hashable {
    public var uid: String
    /// As entered, in NFC.
    public var username: String
    /// The path image-upload returned, if the person chose an image.
    public var imagePath: String?
    public var createdAt: String
    public var updatedAt: String

    public init(uid: String, username: String, imagePath: String?, createdAt: String, updatedAt: String) {
        self.uid = uid
        self.username = username
        self.imagePath = imagePath
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }
}

/// `profile.get`: the person's profile, or no `profile` field when there is none (a normal
/// answer, not an error).
public struct GetProfile: APIRequest {
    public typealias Response = ProfileResult
    public static let type = "profile.get"
    public init() {}
}

public struct ProfileResult: Codable, Sendable, Hashable {
    public var profile: Profile?
    /// How new the answer is, on the profile store's event sequence: every change to this
    /// person's profile that the store recorded up to this `profile.*` event sequence number is
    /// reflected in it. Compare it with the `sequence` of `profile.*` events to tell which of an
    /// answer and an event is newer. Absent only from a store that does not number its answers.
    public var asOfSequence: UInt64?

    public init(profile: Profile?, asOfSequence: UInt64? = nil) {
        self.profile = profile
        self.asOfSequence = asOfSequence
    }
}

/// `profile.create`: the person's first profile (onboarding).
public struct CreateProfile: APIRequest {
    public typealias Response = ProfileResult
    public static let type = "profile.create"

    public var username: String
    public var imagePath: String?
    /// Makes a retried create safe: a create that repeats the key of the request that created
    /// the person's profile is answered with that profile instead of `profileExists`.
    /// See ``IdempotencyKey``.
    public var idempotencyKey: String?
    /// The caller's number for this try (the orchestrator numbers its set-up attempts, each
    /// higher than any before it): a create whose attempt is at or below what
    /// ``AbandonCreates`` gave for the person is refused (`invalidRequest`, reason
    /// `createAbandoned`), unless it repeats the key of the create that made the profile.
    public var attempt: UInt64?

    /// The `reason` of the `invalidRequest` that refuses a create whose attempt was abandoned.
    public static let abandonedReason = "createAbandoned"

    public init(username: String, imagePath: String? = nil, idempotencyKey: String? = nil, attempt: UInt64? = nil) {
        self.username = username
        self.imagePath = imagePath
        self.idempotencyKey = idempotencyKey
        self.attempt = attempt
    }
}

/// `profile.abandonCreates`: every `profile.create` for the envelope's `uid` whose `attempt` is
/// at or below `throughAttempt` and that has not reached the store yet will be refused, and the
/// answer is the profile as it is then (a create that reached the store first made it).
///
/// A create sent before its caller gave up on it (a timeout) may still be on its way: queued at a
/// paused replica, or waiting for the database. The orchestrator abandons its attempts before it
/// removes images a profile could have pointed at, so no later create can point at one it removed.
public struct AbandonCreates: APIRequest {
    public typealias Response = ProfileResult
    public static let type = "profile.abandonCreates"

    public var throughAttempt: UInt64
    public init(throughAttempt: UInt64) { self.throughAttempt = throughAttempt }
}

/// `profile.update`: changes the fields given; absent fields stay as they are.
public struct UpdateProfile: APIRequest {
    public typealias Response = ProfileResult
    public static let type = "profile.update"

    public var username: String?
    public var imagePath: String?

    public init(username: String? = nil, imagePath: String? = nil) {
        self.username = username
        self.imagePath = imagePath
    }
}

/// Why a profile was deleted.
public enum DeletionReason: String, Codable, Sendable {
    /// The person (or an operator) deleted it; the account stays, so onboarding starts again.
    /// The only reason an app may give.
    case request
    /// The account was withdrawn. Given only by our services (the orchestrator's clean-up).
    case withdrawal
}

/// `profile.delete`: the person's profile, freeing its username.
///
/// From an app (with a session) the reason is always ``DeletionReason/request``; `withdrawal`
/// from a session is refused (`invalidRequest`, reason `withdrawalNotAllowed`): withdrawing is
/// `auth.withdraw`, after which the services delete the profile themselves.
public struct DeleteProfile: APIRequest {
    public typealias Response = DeleteProfileResult
    public static let type = "profile.delete"

    public var reason: DeletionReason
    public init(reason: DeletionReason = .request) { self.reason = reason }
}

public struct DeleteProfileResult: Codable, Sendable, Hashable {
    /// `false` when there was no profile to delete.
    public var deleted: Bool
    public init(deleted: Bool) { self.deleted = deleted }
}

/// `profile.checkUsername`: whether a username could be claimed now.
public struct CheckUsername: APIRequest {
    public typealias Response = UsernameAvailability
    public static let type = "profile.checkUsername"

    public var username: String
    public init(username: String) { self.username = username }
}

public struct UsernameAvailability: Codable, Sendable, Hashable {
    /// The name in the form it would be stored (NFC).
    public var username: String
    public var available: Bool
    /// Why it is not available.
    public var reason: UsernameProblem?

    public init(username: String, available: Bool, reason: UsernameProblem?) {
        self.username = username
        self.available = available
        self.reason = reason
    }
}

/// `profile.evictCache`: forget the cached profile of the envelope's `uid` (sign-out).
public struct EvictCachedProfile: APIRequest {
    public typealias Response = Acknowledged
    public static let type = "profile.evictCache"
    public init() {}
}

/// `profile.created`
public struct ProfileCreated: APIEvent, Hashable {
    public static let type = "profile.created"
    public var profile: Profile
    public init(profile: Profile) { self.profile = profile }
}

/// `profile.updated`
public struct ProfileUpdated: APIEvent, Hashable {
    public static let type = "profile.updated"
    public var profile: Profile
    public init(profile: Profile) { self.profile = profile }
}

/// `profile.deleted`
public struct ProfileDeleted: APIEvent, Hashable {
    public static let type = "profile.deleted"
    public var uid: String
    public var reason: DeletionReason
    public init(uid: String, reason: DeletionReason) {
        self.uid = uid
        self.reason = reason
    }
}
