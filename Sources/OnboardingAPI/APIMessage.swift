import Foundation
import Messaging

/// A request a service answers: its envelope `type` and the payload type of its reply.
///
/// A successful reply has type `"<type>.reply"`; a refusal has type `"error"` and a
/// ``ServiceError`` payload.
public protocol APIRequest: Codable, Sendable {
    associatedtype Response: Codable & Sendable
    static var type: String { get }
}

extension APIRequest {
    public static var replyType: String { type + ".reply" }
}

/// An event a service publishes: its envelope `type`, which is also its topic.
public protocol APIEvent: Codable, Sendable {
    static var type: String { get }
}

/// The empty reply of requests that return nothing but success.
public struct Acknowledged: Codable, Sendable, Hashable {
    public init() {}
}

// MARK: - Every service

/// `health`: answered by every service, so scripts can wait until it is up.
public struct HealthCheck: APIRequest {
    public typealias Response = HealthStatus
    public static let type = "health"
    public init() {}
}

public struct HealthStatus: Codable, Sendable, Hashable {
    public var service: String
    /// Always `ok` when the service answers at all.
    public var status: String
    public var startedAt: String
    public var statistics: BusStatistics
    /// How the service follows other services' events (absent when it follows none).
    public var feeds: [FeedStatistics]?
    /// Auth only: the withdrawals still to be unlinked at their providers (absent elsewhere).
    public var unlink: UnlinkQueueStatus?

    public init(
        service: String, status: String = "ok", startedAt: String, statistics: BusStatistics,
        feeds: [FeedStatistics]? = nil, unlink: UnlinkQueueStatus? = nil
    ) {
        self.service = service
        self.status = status
        self.startedAt = startedAt
        self.statistics = statistics
        self.feeds = feeds
        self.unlink = unlink
    }
}

/// Auth's queue of provider unlinks after withdrawals (in its `health` reply).
public struct UnlinkQueueStatus: Codable, Sendable, Hashable {
    /// Unlinks waiting to be sent, or to be retried after a failure.
    public var pending: Int
    /// How long the oldest pending unlink has waited, in whole seconds (absent: none pending).
    public var oldestPendingSeconds: Int?
    /// The latest failure, retried or refused, with the provider's error code but never a token
    /// (absent: none since auth started, and none recorded on a pending unlink).
    public var lastError: String?
    /// When ``lastError`` happened.
    public var lastErrorAt: String?

    public init(pending: Int, oldestPendingSeconds: Int? = nil, lastError: String? = nil, lastErrorAt: String? = nil) {
        self.pending = pending
        self.oldestPendingSeconds = oldestPendingSeconds
        self.lastError = lastError
        self.lastErrorAt = lastErrorAt
    }
}

// MARK: - auth

/// The social providers a person can sign in with.
public enum Provider: String, Codable, Sendable, CaseIterable {
    case google, apple, kakao, naver
}

/// `auth.signIn`: turns a provider account into a uid and a new session.
public struct SignIn: APIRequest {
    public typealias Response = SignInResult
    public static let type = "auth.signIn"

    public var provider: Provider
    /// The provider's id for the account. Trusted only in local dev mode, which accepts it
    /// without a token; otherwise the subject comes from the verified token and this is ignored
    /// (send the id the provider gave the app, or an empty string).
    public var subject: String
    /// Google, Apple, Kakao: the OpenID Connect ID token the provider's sign-in gave the app.
    public var idToken: String?
    /// Naver: the OAuth access token the Naver sign-in gave the app (Naver has no ID token).
    public var accessToken: String?
    /// The raw nonce the app made and passed to the provider's sign-in, if it made one: the ID
    /// token must then carry it (Apple: its SHA-256 in lowercase hex, as Apple puts it).
    public var nonce: String?
    /// Apple: the authorization code of the same sign-in. Outside dev mode, with Apple unlinking
    /// configured, auth exchanges it at Apple for the refresh token that unlinks the account at
    /// Apple when the person withdraws; a sign-in without it still works, but is not unlinked.
    public var authorizationCode: String?

    public init(
        provider: Provider, subject: String, idToken: String? = nil, accessToken: String? = nil, nonce: String? = nil,
        authorizationCode: String? = nil
    ) {
        self.provider = provider
        self.subject = subject
        self.idToken = idToken
        self.accessToken = accessToken
        self.nonce = nonce
        self.authorizationCode = authorizationCode
    }
}

public struct SignInResult: Codable, Sendable, Hashable {
    public var uid: String
    /// Carry this in `sessionToken` of every later user-scoped request.
    public var sessionToken: String
    public var provider: Provider
    public var isNewAccount: Bool

    public init(uid: String, sessionToken: String, provider: Provider, isNewAccount: Bool) {
        self.uid = uid
        self.sessionToken = sessionToken
        self.provider = provider
        self.isNewAccount = isNewAccount
    }
}

/// `auth.signOut`: ends the session named by the envelope's `sessionToken`, or with
/// ``everywhere`` every session of its account.
public struct SignOut: APIRequest {
    public typealias Response = AccountResult
    public static let type = "auth.signOut"
    /// `true`: end every session of the account (sign out on every device). Absent: this one.
    public var everywhere: Bool?
    public init(everywhere: Bool? = nil) { self.everywhere = everywhere }
}

/// `auth.withdraw`: deletes the account of the envelope's `sessionToken`, and with it every
/// session; the orchestrator then deletes the profile and images.
public struct Withdraw: APIRequest {
    public typealias Response = AccountResult
    public static let type = "auth.withdraw"
    public init() {}
}

public struct AccountResult: Codable, Sendable, Hashable {
    public var uid: String
    public init(uid: String) { self.uid = uid }
}

/// `auth.verifySession`: which uid a session token belongs to (for other services).
public struct VerifySession: APIRequest {
    public typealias Response = AccountResult
    public static let type = "auth.verifySession"

    public var sessionToken: String
    public init(sessionToken: String) { self.sessionToken = sessionToken }
}

/// `auth.signedIn`
public struct SignedIn: APIEvent, Hashable {
    public static let type = "auth.signedIn"
    public var uid: String
    public var provider: Provider
    public var isNewAccount: Bool
    /// How many live sessions the person has with this one, counted in the sign-in's own
    /// transaction. Absent from an auth that does not count them.
    public var sessions: Int?

    public init(uid: String, provider: Provider, isNewAccount: Bool, sessions: Int? = nil) {
        self.uid = uid
        self.provider = provider
        self.isNewAccount = isNewAccount
        self.sessions = sessions
    }
}

/// `auth.signedOut`
public struct SignedOut: APIEvent, Hashable {
    public static let type = "auth.signedOut"
    public var uid: String
    /// How many live sessions the person has left, counted in the sign-out's own transaction.
    /// Absent from an auth that does not count them.
    public var sessions: Int?

    public init(uid: String, sessions: Int? = nil) {
        self.uid = uid
        self.sessions = sessions
    }
}

/// `auth.withdrawn`
public struct Withdrawn: APIEvent, Hashable {
    public static let type = "auth.withdrawn"
    public var uid: String
    public init(uid: String) { self.uid = uid }
}

// MARK: - profile

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

    public init(username: String, imagePath: String? = nil, idempotencyKey: String? = nil) {
        self.username = username
        self.imagePath = imagePath
        self.idempotencyKey = idempotencyKey
    }
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

// MARK: - image-upload

/// The image kinds accepted, judged by their first bytes and then decoded.
public enum ImageKind: String, Codable, Sendable, CaseIterable {
    case png, jpeg, webp, heic

    public var fileExtension: String { rawValue }
}

/// `image.upload`: the image bytes travel as the binary frame after the envelope.
public struct UploadImage: APIRequest {
    public typealias Response = StoredImage
    public static let type = "image.upload"

    /// What the sender says the bytes are. Informational only: the bytes decide.
    public var contentType: String?
    /// Makes a retried upload safe: an upload that repeats a key this person has used is
    /// answered with the image stored the first time, and stores nothing new. See ``IdempotencyKey``.
    public var idempotencyKey: String?

    public init(contentType: String? = nil, idempotencyKey: String? = nil) {
        self.contentType = contentType
        self.idempotencyKey = idempotencyKey
    }
}

public struct StoredImage: Codable, Sendable, Hashable {
    /// Where the image is stored, relative to image-upload's data directory: `<uid>/<file>`
    /// (see ``StoredImagePath``). The profile keeps this path.
    public var path: String
    /// The kind as stored: the uploaded kind, except HEIC, which is stored as JPEG.
    public var kind: ImageKind
    /// The stored file's size: the re-encoded image, not the upload.
    public var bytes: Int
    /// The square thumbnail stored beside the image, of the same kind:
    /// `<uid>/<name>.thumb.<extension>`. Absent only for an image stored by an earlier version,
    /// before thumbnails were made.
    public var thumbnailPath: String?

    public init(path: String, kind: ImageKind, bytes: Int, thumbnailPath: String? = nil) {
        self.path = path
        self.kind = kind
        self.bytes = bytes
        self.thumbnailPath = thumbnailPath
    }
}

/// `image.delete`: one image of the envelope's `uid`.
public struct DeleteImage: APIRequest {
    public typealias Response = DeletedImages
    public static let type = "image.delete"

    public var path: String
    public init(path: String) { self.path = path }
}

/// `image.deleteAll`: every image of the envelope's `uid`, except `keep`.
public struct DeleteAllImages: APIRequest {
    public typealias Response = DeletedImages
    public static let type = "image.deleteAll"

    /// A path (`<uid>/<file>`) to leave in place: the image the person's profile points at,
    /// when stray images of an unfinished set-up are removed.
    public var keep: String?
    public init(keep: String? = nil) { self.keep = keep }
}

public struct DeletedImages: Codable, Sendable, Hashable {
    public var deleted: Int
    public init(deleted: Int) { self.deleted = deleted }
}

// MARK: - onboarding-orchestrator

/// `onboarding.check`: "check me now", sent by the app whenever Home appears. Answered with the
/// decision; when the profile is missing, `presentProfileSetup` is also emitted on the route topic.
public struct CheckOnboarding: APIRequest {
    public typealias Response = OnboardingStatus
    public static let type = "onboarding.check"
    public init() {}
}

public struct OnboardingStatus: Codable, Sendable, Hashable {
    public var uid: String
    public var hasProfile: Bool
    /// `presentProfileSetup` when the profile is missing, otherwise absent.
    public var intent: RouteIntent.Kind?

    public init(uid: String, hasProfile: Bool, intent: RouteIntent.Kind?) {
        self.uid = uid
        self.hasProfile = hasProfile
        self.intent = intent
    }
}

/// `onboarding.setUpProfile`: upload the optional image (binary frame), create the profile,
/// then emit `dismiss`.
public struct SetUpProfile: APIRequest {
    public typealias Response = ProfileResult
    public static let type = "onboarding.setUpProfile"

    public var username: String
    /// What the sender says the image is. Informational only: the bytes decide.
    public var contentType: String?
    /// Makes a retried set-up safe: one that repeats the key of the set-up that created the
    /// profile is answered with that profile. Use a new key for each set-up the person confirms,
    /// and the same key when resending after a timeout. See ``IdempotencyKey``.
    public var idempotencyKey: String?

    public init(username: String, contentType: String? = nil, idempotencyKey: String? = nil) {
        self.username = username
        self.contentType = contentType
        self.idempotencyKey = idempotencyKey
    }
}

/// `route.intent`, published on topic `route.<uid>`: what the app should show.
public struct RouteIntent: APIEvent, Hashable {
    public static let type = "route.intent"

    public enum Kind: String, Codable, Sendable, CaseIterable {
        /// The person has no profile: ask them to set one up.
        case presentProfileSetup
        /// The profile now exists: take the set-up away.
        case dismiss
    }

    public enum Reason: String, Codable, Sendable, CaseIterable {
        /// Right after signing in.
        case signedIn
        /// The app asked ("check me now").
        case checkRequested
        /// The profile was created.
        case profileCreated
        /// The profile was deleted while the account stays.
        case profileDeleted
    }

    /// Stable for one decision, so an app that receives an intent twice can tell.
    public var intentId: String
    public var uid: String
    public var intent: Kind
    public var reason: Reason

    public init(intentId: String, uid: String, intent: Kind, reason: Reason) {
        self.intentId = intentId
        self.uid = uid
        self.intent = intent
        self.reason = reason
    }
}

/// The topic scheme.
public enum Topics {
    /// The prefix of every route topic: subscribe to it to see every person's intents.
    public static let routePrefix = "route."

    /// One person's route topic. Uids are fixed-length (lowercase UUIDs), so no person's topic
    /// is a prefix of another's.
    public static func route(uid: String) -> String { routePrefix + uid }
}

// MARK: - The hot path's payloads, written without `Encodable` (keys in sorted order)

extension SignInResult: WireWritable {
    public func write(to writer: inout WireWriter) {
        writer.member("isNewAccount", isNewAccount)
        writer.member("provider", provider)
        writer.member("sessionToken", sessionToken)
        writer.member("uid", uid)
    }
}

extension SignedIn: WireWritable {
    public func write(to writer: inout WireWriter) {
        writer.member("isNewAccount", isNewAccount)
        writer.member("provider", provider)
        writer.member("sessions", sessions)
        writer.member("uid", uid)
    }
}

extension AccountResult: WireWritable {
    public func write(to writer: inout WireWriter) {
        writer.member("uid", uid)
    }
}

extension RouteIntent: WireWritable {
    public func write(to writer: inout WireWriter) {
        writer.member("intent", intent)
        writer.member("intentId", intentId)
        writer.member("reason", reason)
        writer.member("uid", uid)
    }
}

// MARK: - The hot path's payloads, read without `Decodable`

extension SignIn: WireReadable {
    public init(wire object: WireObject) throws {
        self.init(
            provider: try object.value("provider"), subject: try object.string("subject"),
            idToken: try object.optionalString("idToken"), accessToken: try object.optionalString("accessToken"),
            nonce: try object.optionalString("nonce"), authorizationCode: try object.optionalString("authorizationCode"))
    }
}

extension SignInResult: WireReadable {
    public init(wire object: WireObject) throws {
        self.init(
            uid: try object.string("uid"), sessionToken: try object.string("sessionToken"),
            provider: try object.value("provider"), isNewAccount: try object.bool("isNewAccount"))
    }
}

extension SignedIn: WireReadable {
    public init(wire object: WireObject) throws {
        self.init(
            uid: try object.string("uid"), provider: try object.value("provider"), isNewAccount: try object.bool("isNewAccount"),
            sessions: try object.optionalInteger("sessions"))
    }
}

extension VerifySession: WireReadable {
    public init(wire object: WireObject) throws {
        self.init(sessionToken: try object.string("sessionToken"))
    }
}

extension AccountResult: WireReadable {
    public init(wire object: WireObject) throws {
        self.init(uid: try object.string("uid"))
    }
}

extension CheckOnboarding: WireReadable {
    public init(wire _: WireObject) throws {
        self.init()
    }
}

extension RouteIntent: WireReadable {
    public init(wire object: WireObject) throws {
        self.init(
            intentId: try object.string("intentId"), uid: try object.string("uid"), intent: try object.value("intent"),
            reason: try object.value("reason"))
    }
}
