import Foundation

/// Publish/subscribe and request/reply between processes (or within one, for tests).
///
/// Two implementations exist: `ZeroMQBus` (module `ZeroMQMessaging`) for real deployments and
/// ``InProcessBus`` for tests. One contract test suite runs against both (the in-process bus with
/// its slow joiner on), so they keep the same contract:
///
/// - **Events.** A publisher binds an endpoint; subscribers connect to one or more endpoints and
///   receive the messages whose topic starts with one of their topic prefixes. Delivery is
///   best effort, as with ZeroMQ PUB/SUB: a subscriber only sees what is published after it has
///   joined, and one that falls more than ``MessageLimits/queueLimit`` behind loses the newest
///   messages (counted in ``BusStatistics/droppedEvents``). Every event carries a per-publisher
///   sequence number so that a subscriber can see a gap and ask the publisher for what it missed.
/// - **Joining is not instant.** ``subscribe(to:topics:limits:)`` returns before the
///   subscription has joined: on ZeroMQ the connection and the subscription still have to reach
///   the publisher (the "slow joiner"), so events published right after it returns may be lost,
///   some or all of them. What holds on both buses: nothing published before `subscribe` is
///   delivered; the events that arrive from one publisher arrive in the order it published them;
///   once one has arrived, every later matching event of that publisher arrives too (within the
///   queue limit, and while the connection lasts: a publisher that restarts is joined anew).
///   ``InProcessBus`` joins at once unless its `joinDelay` says otherwise. Code that must not
///   miss an event subscribes first and then fetches the current state (the zguide's Clone
///   pattern, as `EventFeed` and `OnboardingClient.intents()` do).
/// - **Requests.** A server binds an endpoint and answers requests; a caller sends a request and
///   gets the reply, or a ``ServiceError``: `timeout` when no reply came in time (the server may
///   or may not have acted), `noResponder` when nothing listens at the endpoint. A request that
///   the server cannot read is answered by the bus itself with `invalidMessage`,
///   `unsupportedVersion`, `unexpectedFrames` or `messageTooLarge`, naming the request in
///   `correlationId` unless its envelope frame was over the limit (not read) or has no readable
///   `id` (``Message/errorReply(_:refusing:limits:source:)``); one that arrives while the
///   server's queue is full is answered with `overloaded`.
///
/// All methods may be called from any task; none blocks a thread.
public protocol MessageBus: Sendable {
    /// Binds a publisher at `endpoint`.
    ///
    /// - Throws: ``ServiceError`` with `addressInUse` or `invalidEndpoint`.
    func publisher(at endpoint: Endpoint) async throws -> any EventPublisher

    /// Connects to the publishers at `endpoints` and returns the events whose topic starts with
    /// one of `topics` (an empty string matches every topic).
    ///
    /// The subscription ends when the returned sequence is no longer iterated (the iterating task
    /// is cancelled or the sequence is dropped). Events that cannot be read are dropped and counted.
    func subscribe(to endpoints: [Endpoint], topics: [String], limits: MessageLimits) async throws -> AsyncStream<Message>

    /// Binds a request server at `endpoint` and returns the requests that arrive.
    ///
    /// Stop iterating the sequence to unbind.
    /// - Throws: ``ServiceError`` with `addressInUse` or `invalidEndpoint`.
    func serve(at endpoint: Endpoint, limits: MessageLimits) async throws -> AsyncStream<IncomingRequest>

    /// Sends `message` to the server at `endpoint` and waits up to `timeout` for its reply.
    ///
    /// Returns the reply as the server sent it, error replies included (see ``Message/serviceError``).
    /// - Throws: ``ServiceError`` with `timeout`, `noResponder`, `messageTooLarge`, `closed`, or
    ///   `invalidMessage` when the reply cannot be read. Cancelling the calling task throws
    ///   `CancellationError`.
    func request(_ message: OutgoingMessage, to endpoint: Endpoint, timeout: Duration) async throws -> Message

    /// What the bus has counted so far.
    var statistics: BusStatistics { get }

    /// Binds a request server at `endpoint` whose requests `handler` answers on the bus's own
    /// thread, in batches: every request read from the endpoint in one pass, in arrival order.
    ///
    /// This is the hot path of a service (see `BusLoop.swift`): the handler reads each request
    /// once, may commit the whole batch in one transaction, and answers. Replies and events leave
    /// in the order they were sent (on ZeroMQ when the call returns, with no hand-off to another
    /// thread; in process, at once). The handler must not wait for other services. ZeroMQ hands
    /// over every request read in one pass; the in-process bus one request per call.
    /// A request the bus cannot take (frames over the limits) is answered by the bus, as with
    /// ``serve(at:limits:)``. The bus sets no bound on requests the handler leaves unanswered
    /// (handed to other work): the handler bounds them, answering `overloaded` beyond its limit.
    ///
    /// - Throws: ``ServiceError`` with `addressInUse` or `invalidEndpoint`.
    func serve(
        at endpoint: Endpoint, limits: MessageLimits, onLoop handler: @escaping @Sendable ([RawRequest]) -> Void
    ) async throws -> any BusLoopRegistration

    /// Sends `message` to the server at `endpoint` and hands its reply (error replies included),
    /// or the failure (`timeout`, `noResponder`, `messageTooLarge`, `closed`, `invalidMessage`),
    /// to `callback` on the bus's own thread, once (after the bus has shut down: at once, on the
    /// calling thread, with `closed`). Never blocks; called from a loop handler, the request
    /// leaves when the handler returns. The callback must not wait for other services.
    func request(
        _ message: OutgoingMessage, to endpoint: Endpoint, timeout: Duration,
        onLoop callback: @escaping @Sendable (Result<Message, ServiceError>) -> Void)

    /// Runs `job` on the bus's own thread, in turn with the other work there: the way into a
    /// service's hot path from a task (a timer, a call's outcome). What the job sends leaves after
    /// what was sent before it ran.
    ///
    /// - Returns: `false` when the bus has shut down and the job will never run.
    @discardableResult
    func perform(onLoop job: @escaping @Sendable () -> Void) -> Bool

    /// Connects to the publishers at `endpoints` and hands the events whose topic starts with one
    /// of `topics` to `handler` on the bus's own thread, in batches, in arrival order. Delivery
    /// is as with ``subscribe(to:topics:limits:)``: only what is published after the subscription
    /// has joined. The handler must not wait for other services.
    func subscribe(
        to endpoints: [Endpoint], topics: [String], limits: MessageLimits,
        onLoop handler: @escaping @Sendable ([RawEvent]) -> Void
    ) async throws -> any BusLoopRegistration
}

/// Sends events from one bound endpoint.
public protocol EventPublisher: Sendable {
    /// The endpoint this publisher is bound to.
    var endpoint: Endpoint { get }

    /// Queues `message` for every current subscriber whose prefix matches `message.topic`.
    ///
    /// Never blocks. - Throws: ``ServiceError`` with `closed` after ``close()``, or
    /// `invalidMessage` when `message.topic` is `nil`.
    func publish(_ message: OutgoingMessage) throws

    /// Unbinds. Later calls to ``publish(_:)`` throw `closed`.
    func close()
}

/// A request received by a server, with the means to answer it once.
public struct IncomingRequest: Sendable {
    public let message: Message
    /// When the bus took the request off the wire.
    public let received: ContinuousClock.Instant
    /// Told of the reply (see ``ReplyObserver``).
    public var observer: (any ReplyObserver)?
    private let responder: @Sendable (OutgoingMessage) -> Void

    public init(
        message: Message, received: ContinuousClock.Instant = .now, responder: @escaping @Sendable (OutgoingMessage) -> Void
    ) {
        self.message = message
        self.received = received
        self.responder = responder
    }

    /// Sends `reply` to the caller. Only the first reply to a request is delivered.
    public func reply(_ reply: OutgoingMessage) {
        observer?.replied(reply, received: received)
        responder(reply)
    }

    /// Replies with `payload` in an envelope of type `type` that answers this request.
    ///
    /// - Parameter uid: the person the reply is about; by default the request's `uid`.
    public func reply<Payload: Codable & Sendable>(
        type: String, source: String, payload: Payload, uid: String? = nil, attachment: Data? = nil
    ) {
        var header = message.replyHeader(type: type, source: source)
        if let uid { header.uid = uid }
        let envelope = Envelope(header: header, payload: payload)
        do {
            reply(OutgoingMessage(body: try envelope.encoded(), attachment: attachment))
        } catch {
            fail(ServiceError(.internalError, "The reply could not be encoded: \(error)"), source: source)
        }
    }

    /// Replies with an error.
    public func fail(_ error: ServiceError, source: String) {
        reply(message.errorReply(error, source: source))
    }
}

/// Counts kept by a bus, for logs, health replies and tests.
public struct BusStatistics: Sendable, Hashable, Codable {
    /// Events that a subscriber's queue had no room for.
    public var droppedEvents: Int = 0
    /// Events that arrived but could not be read.
    public var unreadableEvents: Int = 0
    /// Requests refused because the server's queue was full.
    public var overloadedRequests: Int = 0
    /// Requests refused because they could not be read or broke a limit.
    public var rejectedRequests: Int = 0
    /// Replies that arrived after their caller had given up.
    public var lateReplies: Int = 0
    /// Connections refused because the client's CURVE key is not known (or it offered none),
    /// or because it could not complete the CURVE handshake.
    public var refusedHandshakes: Int = 0
    /// Connections to a server that failed the CURVE handshake: it could not prove the key
    /// known for it (a squatter on its port), or it refused this process's key.
    public var failedHandshakes: Int = 0
    /// Subscribers of this process's publishers that are not reading now (named in the log).
    public var slowSubscribers: Int = 0
    /// Replies dropped because their caller was not reading its replies.
    public var droppedReplies: Int = 0

    public init() {}
}

extension ErrorCode {
    /// Another socket is already bound at the endpoint.
    public static let addressInUse: ErrorCode = "addressInUse"
    /// The endpoint is not one this bus can use.
    public static let invalidEndpoint: ErrorCode = "invalidEndpoint"
}

extension MessageLimits {
    /// Checks the frames of a received request against these limits.
    ///
    /// - Parameters:
    ///   - envelopeBytes: the size of the JSON frame.
    ///   - attachmentBytes: the size of the binary frame, or `nil` when there is none.
    ///   - extraFrames: how many frames came after the binary one.
    /// - Returns: the error to answer with, or `nil` when the request is within limits.
    public func violation(envelopeBytes: Int, attachmentBytes: Int?, extraFrames: Int) -> ServiceError? {
        if envelopeBytes > maxEnvelopeBytes {
            return ServiceError(
                .messageTooLarge,
                "The envelope is \(envelopeBytes) bytes; this endpoint accepts at most \(maxEnvelopeBytes).")
        }
        if extraFrames > 0 {
            return ServiceError(
                .unexpectedFrames,
                "A request has one JSON frame and at most one binary frame; this one had \(extraFrames) more.")
        }
        if let attachmentBytes {
            if maxAttachmentBytes == 0 {
                return ServiceError(.unexpectedFrames, "This endpoint takes no binary frame; send the JSON envelope alone.")
            }
            if attachmentBytes > maxAttachmentBytes {
                return ServiceError(
                    .messageTooLarge,
                    "The binary frame is \(attachmentBytes) bytes; this endpoint accepts at most \(maxAttachmentBytes).")
            }
        }
        return nil
    }
}

extension String {
    /// Whether a subscription to `prefix` receives an event with this topic.
    @inlinable
    public func matchesTopicPrefix(_ prefix: String) -> Bool {
        prefix.isEmpty || self.utf8.starts(with: prefix.utf8)
    }
}
