import Messaging

// onboarding-orchestrator's requests, replies and route intents, and the topics the intents are
// published on.

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

extension RouteIntent: WireWritable {
    public func write(to writer: inout WireWriter) {
        writer.member("intent", intent)
        writer.member("intentId", intentId)
        writer.member("reason", reason)
        writer.member("uid", uid)
    }
}

// MARK: - The hot path's payloads, read without `Decodable`

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
