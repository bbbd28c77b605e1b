import Foundation
import OnboardingClient
import Synchronization

/// Plays one service on a bus, so that a test decides what its callers get: answer a request
/// type with a value, fail it with a typed error, answer late, or never.
///
/// ```swift
/// let profile = try await StandInService.start(on: bus, at: SystemEndpoints.inProcess.profileRPC)
/// profile.answer(CheckUsername.self, with: UsernameAvailability(username: "minji", available: true, reason: nil))
/// profile.fail(GetProfile.self, with: ServiceError(.storeUnavailable, "The store is down."))
/// profile.answer(GetProfile.self, after: .seconds(1)) { _, _ in ProfileResult(profile: nil) }
/// profile.ignore(CreateProfile.self)          // the caller's own timeout
/// ```
///
/// It answers `health` from the start. A request of a type you have not set up is refused with
/// `unknownType`, as a real service refuses one it does not know, and is listed in
/// ``unexpectedRequests``: check that it is empty at the end of a test. Every request is kept in
/// ``requests`` (in arrival order). ``stop()`` unbinds the endpoint: from then on callers get
/// `noResponder`.
///
/// Set-ups may change while requests arrive; each request follows the set-up in place when it
/// arrived. Requests are handled concurrently, so a late answer holds up no other.
///
/// Thread safety: every member may be used from any task.
public final class StandInService: Sendable {
    /// What to do with one request: its answer (an encoded reply), or nothing to never answer.
    typealias Handler = @Sendable (Message) async throws -> OutgoingMessage?

    private struct Rule {
        var delay: Duration
        var handler: Handler
    }

    private struct Waiter {
        var count: Int
        var type: String?
        var continuation: CheckedContinuation<Void, Never>
        var timer: Task<Void, Never>
    }

    private struct State {
        var rules: [String: Rule] = [:]
        var requests: [Message] = []
        var unexpected: [Message] = []
        var waiters: [Int: Waiter] = [:]
        var nextWaiter = 0
    }

    /// Where it answers.
    public let endpoint: Endpoint
    /// The name it signs its replies with.
    public let name: String
    private let state = Mutex(State())
    private let serving = Mutex<Task<Void, Never>?>(nil)

    private init(endpoint: Endpoint, name: String) {
        self.endpoint = endpoint
        self.name = name
    }

    /// Binds `endpoint` on `bus` and starts answering.
    ///
    /// - Parameters:
    ///   - name: the `source` of its replies; by default the endpoint.
    ///   - limits: what it accepts; by default envelopes of 64 KiB and binary frames of 16 MiB.
    /// - Throws: the bus's `addressInUse` when something else serves there.
    public static func start(
        on bus: any MessageBus, at endpoint: Endpoint, name: String? = nil,
        limits: MessageLimits = MessageLimits(maxAttachmentBytes: 16 << 20)
    ) async throws -> StandInService {
        let service = StandInService(endpoint: endpoint, name: name ?? endpoint.rawValue)
        let startedAt = Timestamp.now()
        let serviceName = service.name
        service.answer(HealthCheck.self) { _, _ in
            HealthStatus(service: serviceName, startedAt: startedAt, statistics: bus.statistics)
        }
        let requests = try await bus.serve(at: endpoint, limits: limits)
        let task = Task {
            await withDiscardingTaskGroup { group in
                for await request in requests {
                    group.addTask { await service.handle(request) }
                }
            }
        }
        service.serving.withLock { $0 = task }
        return service
    }

    /// Unbinds the endpoint; requests still waiting for a late answer get `shuttingDown`.
    public func stop() async {
        let task = serving.withLock { task in
            defer { task = nil }
            return task
        }
        task?.cancel()
        await task?.value
    }

    // MARK: Setting up answers

    /// Answers every `Request` with what `handler` returns (it gets the request and the whole
    /// message: header, `uid`, `sessionToken`, attachment), after `delay`. A ``ServiceError``
    /// that `handler` throws is the answer instead; any other error is answered as `internalError`.
    public func answer<Request: APIRequest>(
        _: Request.Type, after delay: Duration = .zero,
        _ handler: @escaping @Sendable (Request, Message) async throws -> Request.Response
    ) {
        let name = self.name
        setRule(for: Request.type, Rule(delay: delay) { message in
            let request = try message.payload(as: Request.self)
            let response = try await handler(request, message)
            let envelope = Envelope(header: message.replyHeader(type: Request.replyType, source: name), payload: response)
            return try OutgoingMessage(envelope)
        })
    }

    /// Answers every `Request` with `response`, after `delay`.
    public func answer<Request: APIRequest>(_ type: Request.Type, with response: Request.Response, after delay: Duration = .zero) {
        answer(type, after: delay) { _, _ in response }
    }

    /// Refuses every `Request` with `error`, after `delay`. Any code goes, the bus's own
    /// included: `.timeout` or `.noResponder` here reach the caller as if the bus had said so,
    /// at once, without waiting for a timer.
    public func fail<Request: APIRequest>(_: Request.Type, with error: ServiceError, after delay: Duration = .zero) {
        setRule(for: Request.type, Rule(delay: delay) { _ in throw error })
    }

    /// Never answers a `Request`: the caller waits for its own timeout.
    public func ignore<Request: APIRequest>(_: Request.Type) {
        setRule(for: Request.type, Rule(delay: .zero) { _ in nil })
    }

    /// Forgets the set-up for `Request`: it is unexpected again.
    public func reset<Request: APIRequest>(_: Request.Type) {
        _ = state.withLock { $0.rules.removeValue(forKey: Request.type) }
    }

    private func setRule(for type: String, _ rule: Rule) {
        state.withLock { $0.rules[type] = rule }
    }

    // MARK: What arrived

    /// Every request received, in arrival order.
    public var requests: [Message] { state.withLock { $0.requests } }

    /// The requests of type `Request` received, decoded, in arrival order.
    public func requests<Request: APIRequest>(of _: Request.Type) -> [Request] {
        requests.filter { $0.header.type == Request.type }.compactMap { try? $0.payload(as: Request.self) }
    }

    /// Requests of a type nobody set up (answered with `unknownType`).
    public var unexpectedRequests: [Message] { state.withLock { $0.unexpected } }

    /// Waits until `count` requests (of `Request` when given) have arrived, counting those
    /// before the call, or until `timeout` has passed.
    ///
    /// - Returns: whether they arrived in time.
    @discardableResult
    public func waitForRequests<Request: APIRequest>(
        _ count: Int = 1, of _: Request.Type, timeout: Duration = .seconds(10)
    ) async -> Bool {
        await waitForRequests(count, type: Request.type, timeout: timeout)
    }

    private func waitForRequests(_ count: Int, type: String?, timeout: Duration) async -> Bool {
        func arrived(_ state: State) -> Bool {
            state.requests.lazy.filter { type == nil || $0.header.type == type }.count >= count
        }
        await withCheckedContinuation { continuation in
            let done = state.withLock { state in
                if arrived(state) { return true }
                state.nextWaiter += 1
                let id = state.nextWaiter
                // Races the arrival of requests: whichever removes the waiter resumes it.
                let timer = Task { [weak self] in
                    try? await Task.sleep(for: timeout)
                    self?.state.withLock { $0.waiters.removeValue(forKey: id) }?.continuation.resume()
                }
                state.waiters[id] = Waiter(count: count, type: type, continuation: continuation, timer: timer)
                return false
            }
            if done { continuation.resume() }
        }
        return state.withLock { arrived($0) }
    }

    // MARK: Answering

    private func handle(_ incoming: IncomingRequest) async {
        let message = incoming.message
        let (rule, woken) = state.withLock { state -> (Rule?, [CheckedContinuation<Void, Never>]) in
            state.requests.append(message)
            let rule = state.rules[message.header.type]
            if rule == nil { state.unexpected.append(message) }
            var woken: [CheckedContinuation<Void, Never>] = []
            for (id, waiter) in state.waiters {
                let count = state.requests.lazy.filter { waiter.type == nil || $0.header.type == waiter.type }.count
                guard count >= waiter.count else { continue }
                waiter.timer.cancel()
                woken.append(waiter.continuation)
                state.waiters[id] = nil
            }
            return (rule, woken)
        }
        for continuation in woken { continuation.resume() }
        guard let rule else {
            incoming.fail(
                ServiceError(
                    .unknownType,
                    "The stand-in at \(endpoint) has no answer set up for \(message.header.type); "
                        + "set one with answer(_:with:), fail(_:with:) or ignore(_:)."),
                source: name)
            return
        }
        if rule.delay > .zero {
            do {
                try await Task.sleep(for: rule.delay)
            } catch {
                incoming.fail(ServiceError(.shuttingDown, "The stand-in at \(endpoint) stopped."), source: name)
                return
            }
        }
        do {
            if let reply = try await rule.handler(message) { incoming.reply(reply) }
        } catch let error as ServiceError {
            incoming.fail(error, source: name)
        } catch {
            incoming.fail(ServiceError(.internalError, "The stand-in's handler failed: \(error)"), source: name)
        }
    }
}
