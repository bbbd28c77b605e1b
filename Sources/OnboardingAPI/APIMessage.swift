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
