import Foundation
import Logging
import Messaging
import OnboardingAPI
import ServiceLifecycle
import ServiceRuntime
import Synchronization

/// The onboarding-orchestrator service: turns auth and profile events into route intents,
/// answers "check me now", runs profile set-up, and cleans up after withdrawals.
///
/// Decisions are made by ``OnboardingStateMachine`` and ``ProfileSetupSaga``; this type only
/// carries them out. Run it with ``run()`` (in a `ServiceGroup`, or a task in tests).
public struct OnboardingOrchestrator: Service {
    public struct Configuration: Sendable {
        /// Where the orchestrator answers `onboarding.check` and `onboarding.setUpProfile`.
        public var rpc: Endpoint
        /// Where route intents are published, on topics `route.<uid>`.
        public var routes: Endpoint
        public var authRPC: Endpoint
        public var authEvents: Endpoint
        public var profileRPC: Endpoint
        public var profileEvents: Endpoint
        public var imageRPC: Endpoint
        /// The largest image accepted with a set-up request.
        public var maxImageBytes: Int
        /// How long one call to another service may take.
        public var callTimeout: Duration
        public var retryPolicy: RetryPolicy
        /// The secret the orchestrator's calls to profile and image-upload carry.
        public var serviceToken: String?

        public init(
            rpc: Endpoint = Defaults.orchestratorRPC,
            routes: Endpoint = Defaults.routes,
            authRPC: Endpoint = Defaults.authRPC,
            authEvents: Endpoint = Defaults.authEvents,
            profileRPC: Endpoint = Defaults.profileRPC,
            profileEvents: Endpoint = Defaults.profileEvents,
            imageRPC: Endpoint = Defaults.imageRPC,
            maxImageBytes: Int = Defaults.maxImageBytes,
            callTimeout: Duration = .seconds(2),
            retryPolicy: RetryPolicy = RetryPolicy(),
            serviceToken: String? = nil
        ) {
            self.rpc = rpc
            self.routes = routes
            self.authRPC = authRPC
            self.authEvents = authEvents
            self.profileRPC = profileRPC
            self.profileEvents = profileEvents
            self.imageRPC = imageRPC
            self.maxImageBytes = maxImageBytes
            self.callTimeout = callTimeout
            self.retryPolicy = retryPolicy
            self.serviceToken = serviceToken
        }
    }

    public let configuration: Configuration
    private let bus: any MessageBus
    private let logger: Logger
    private let sessions: any SessionVerifier

    /// - Parameter sessions: verifies session tokens; by default asks auth.
    public init(configuration: Configuration, bus: any MessageBus, logger: Logger, sessions: (any SessionVerifier)? = nil) {
        self.configuration = configuration
        self.bus = bus
        self.logger = logger
        self.sessions = sessions ?? RemoteSessionVerifier(
            bus: bus, authEndpoint: configuration.authRPC, source: ServiceName.orchestrator)
    }

    public func run() async throws {
        let publisher = try await bus.publisher(at: configuration.routes)
        defer { publisher.close() }
        let (work, workQueue) = AsyncStream.makeStream(of: Work.self)
        let engine = Engine(configuration: configuration, bus: bus, publisher: publisher, logger: logger, work: workQueue)

        let eventLimits = MessageLimits(queueLimit: 65_536)
        let authEvents = try await bus.subscribe(to: [configuration.authEvents], topics: ["auth."], limits: eventLimits)
        let profileEvents = try await bus.subscribe(to: [configuration.profileEvents], topics: ["profile."], limits: eventLimits)
        logger.info("publishing route intents at \(configuration.routes); following events from \(configuration.authEvents) and \(configuration.profileEvents)")

        let server = RequestServer(
            bus: bus, endpoint: configuration.rpc,
            // Set-up requests may carry images: few wait and few run at once, so what is held in
            // memory stays bounded ((16 + 32) × twice the image limit).
            limits: MessageLimits(
                maxEnvelopeBytes: 64 * 1024,
                maxAttachmentBytes: configuration.maxImageBytes.multipliedReportingOverflow(by: 2).overflow
                    ? .max : configuration.maxImageBytes * 2,
                queueLimit: 16),
            dispatcher: engine.dispatcher(sessions: sessions), logger: logger, maxInFlight: 32)

        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { await engine.follow(authEvents) }
            group.addTask { await engine.follow(profileEvents) }
            group.addTask {
                await withDiscardingTaskGroup { workers in
                    for await job in work { workers.addTask { await job.run() } }
                }
            }
            // Returns on graceful shutdown once every request in flight has been answered, with
            // the event followers and the work queue still running to answer them.
            try await server.run()
            workQueue.finish()
            group.cancelAll()
        }
    }
}

/// A piece of asynchronous work the engine asked for (a call to another service, a timer).
struct Work: Sendable {
    let run: @Sendable () async -> Void
}

/// Carries out the state machine's actions.
///
/// Thread safety: the state machine and the table of waiting callers each sit behind a mutex;
/// actions are performed outside the locks. Slow work (calls, timers) is handed to the work
/// queue, which `OnboardingOrchestrator.run()` drains into child tasks.
final class Engine: Sendable {
    let configuration: OnboardingOrchestrator.Configuration
    let bus: any MessageBus
    let publisher: any EventPublisher
    let logger: Logger
    let work: AsyncStream<Work>.Continuation
    private let machine: Mutex<OnboardingStateMachine>
    private let waiters = Mutex<[OnboardingStateMachine.WaiterID: CheckedContinuation<Result<OnboardingStatus, ServiceError>, Never>]>([:])
    private let nextWaiter = Atomic<UInt64>(0)
    private let routeSequence = Atomic<UInt64>(0)
    private let source = ServiceName.orchestrator

    init(configuration: OnboardingOrchestrator.Configuration, bus: any MessageBus, publisher: any EventPublisher,
         logger: Logger, work: AsyncStream<Work>.Continuation) {
        self.configuration = configuration
        self.bus = bus
        self.publisher = publisher
        self.logger = logger
        self.work = work
        self.machine = Mutex(OnboardingStateMachine(retryPolicy: configuration.retryPolicy))
    }

    // MARK: Inputs

    func send(_ input: OnboardingStateMachine.Input) {
        let actions = machine.withLock { $0.handle(input) }
        for action in actions { perform(action) }
    }

    func follow(_ events: AsyncStream<Message>) async {
        for await event in events {
            do {
                switch event.header.type {
                case SignedIn.type:
                    let signedIn = try event.payload(as: SignedIn.self)
                    send(.signedIn(uid: signedIn.uid, isNewAccount: signedIn.isNewAccount))
                case SignedOut.type: send(.signedOut(uid: try event.payload(as: SignedOut.self).uid))
                case Withdrawn.type: send(.withdrawn(uid: try event.payload(as: Withdrawn.self).uid))
                case ProfileCreated.type: send(.profileCreated(uid: try event.payload(as: ProfileCreated.self).profile.uid))
                case ProfileDeleted.type:
                    let deleted = try event.payload(as: ProfileDeleted.self)
                    send(.profileDeleted(uid: deleted.uid, reason: deleted.reason))
                default: break
                }
            } catch {
                logger.warning("ignored an unreadable \(event.header.type) event from \(event.header.source): \(error)")
            }
        }
    }

    // MARK: Actions

    private func perform(_ action: OnboardingStateMachine.Action) {
        switch action {
        case .checkProfile(let uid, let check):
            enqueue { engine in
                do {
                    let result = try await engine.bus.call(
                        GetProfile(), to: engine.configuration.profileRPC, source: engine.source, uid: uid, serviceToken: engine.configuration.serviceToken,
                        timeout: engine.configuration.callTimeout)
                    engine.send(.profileChecked(uid: uid, check: check, exists: result.profile != nil))
                } catch {
                    engine.send(.profileCheckFailed(uid: uid, check: check, error: Self.serviceError(error)))
                }
            }
        case .retryCheck(let uid, let check, let delay, let attempt, let error):
            logger.warning("profile check for \(uid) failed (\(error)); retry \(attempt) in \(delay)")
            enqueue { engine in
                guard (try? await Task.sleep(for: delay)) != nil else { return }
                engine.send(.checkRetryDue(uid: uid, check: check))
            }
        case .emit(let kind, let uid, let reason):
            emit(kind, uid: uid, reason: reason)
        case .answer(let waiter, let status):
            resume(waiter, with: .success(status))
        case .answerFailure(let waiter, let error):
            resume(waiter, with: .failure(error))
        case .evictProfileCache(let uid):
            enqueue { engine in
                do {
                    _ = try await engine.bus.call(
                        EvictCachedProfile(), to: engine.configuration.profileRPC, source: engine.source, uid: uid, serviceToken: engine.configuration.serviceToken,
                        timeout: engine.configuration.callTimeout)
                } catch {
                    engine.logger.warning("could not clear the cached profile of \(uid): \(error)")
                }
            }
        case .cleanUp(let uid, let step):
            enqueue { engine in
                do {
                    switch step {
                    case .deleteProfile:
                        _ = try await engine.bus.call(
                            DeleteProfile(reason: .withdrawal), to: engine.configuration.profileRPC,
                            source: engine.source, uid: uid, serviceToken: engine.configuration.serviceToken, timeout: engine.configuration.callTimeout)
                    case .deleteImages:
                        _ = try await engine.bus.call(
                            DeleteAllImages(), to: engine.configuration.imageRPC,
                            source: engine.source, uid: uid, serviceToken: engine.configuration.serviceToken, timeout: engine.configuration.callTimeout)
                    }
                    engine.send(.cleanupFinished(uid: uid, step: step))
                } catch {
                    engine.send(.cleanupFailed(uid: uid, step: step, error: Self.serviceError(error)))
                }
            }
        case .retryCleanup(let uid, let step, let delay, let attempt, let error):
            logger.warning("withdrawal clean-up \(step.rawValue) for \(uid) failed (\(error)); retry \(attempt) in \(delay)")
            enqueue { engine in
                guard (try? await Task.sleep(for: delay)) != nil else { return }
                engine.send(.cleanupRetryDue(uid: uid, step: step))
            }
        }
    }

    private func enqueue(_ job: @escaping @Sendable (Engine) async -> Void) {
        work.yield(Work { [self] in await job(self) })
    }

    private func emit(_ kind: RouteIntent.Kind, uid: String, reason: RouteIntent.Reason) {
        let intent = RouteIntent(intentId: UUID().uuidString.lowercased(), uid: uid, intent: kind, reason: reason)
        let sequence = routeSequence.wrappingAdd(1, ordering: .relaxed).newValue
        do {
            try publisher.publish(intent, source: source, sequence: sequence, uid: uid, topic: Topics.route(uid: uid))
            logger.debug("\(kind.rawValue) → \(uid) (\(reason.rawValue))")
        } catch {
            logger.error("could not publish \(kind.rawValue) for \(uid): \(error)")
        }
    }

    private func resume(_ waiter: OnboardingStateMachine.WaiterID, with result: Result<OnboardingStatus, ServiceError>) {
        let continuation = waiters.withLock { $0.removeValue(forKey: waiter) }
        continuation?.resume(returning: result)
    }

    static func serviceError(_ error: any Error) -> ServiceError {
        (error as? ServiceError) ?? ServiceError(.internalError, "\(error)")
    }

    // MARK: Requests

    func dispatcher(sessions: any SessionVerifier) -> RequestDispatcher {
        var dispatcher = RequestDispatcher(source: source, sessions: sessions, serviceToken: nil, logger: logger)
        dispatcher.on(CheckOnboarding.self, access: .session) { [self] _, context in
            try await check(uid: try context.requireUID())
        }
        dispatcher.on(SetUpProfile.self, access: .session, attachment: .optional) { [self] request, context in
            try await setUp(request, uid: try context.requireUID(), image: context.attachment, correlationId: context.message.header.id)
        }
        return dispatcher
    }

    /// "Check me now": the same decision as after sign-in, also answered to the caller.
    func check(uid: String) async throws -> OnboardingStatus {
        let waiter = nextWaiter.wrappingAdd(1, ordering: .relaxed).newValue
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                waiters.withLock { $0[waiter] = continuation }
                // Cancelled before the continuation was stored: onCancel found nothing to resume.
                if Task.isCancelled {
                    resume(waiter, with: .failure(ServiceError(.shuttingDown, "The orchestrator is stopping; ask again in a moment.")))
                } else {
                    send(.checkRequested(uid: uid, waiter: waiter))
                }
            }
        } onCancel: {
            resume(waiter, with: .failure(ServiceError(.shuttingDown, "The orchestrator is stopping; ask again in a moment.")))
        }
        return try result.get()
    }

    /// Profile set-up: upload, create, then `dismiss`; an uploaded image is removed when the
    /// profile was not created.
    func setUp(_ request: SetUpProfile, uid: String, image: Data?, correlationId: String) async throws -> ProfileResult {
        var saga = ProfileSetupSaga(username: request.username, hasImage: image != nil)
        var step = saga.start()
        let profileRPC = configuration.profileRPC, imageRPC = configuration.imageRPC, timeout = configuration.callTimeout
        while true {
            switch step {
            case .uploadImage:
                do {
                    let stored = try await bus.call(
                        UploadImage(contentType: request.contentType), to: imageRPC, source: source, uid: uid, serviceToken: configuration.serviceToken,
                        correlationId: correlationId, attachment: image, timeout: timeout)
                    step = saga.next(after: .uploaded(path: stored.path))
                } catch {
                    step = saga.next(after: .uploadFailed(Self.dependencyError(error, service: ServiceName.imageUpload)))
                }
            case .createProfile(let username, let imagePath):
                do {
                    let created = try await bus.call(
                        CreateProfile(username: username, imagePath: imagePath), to: profileRPC, source: source,
                        uid: uid, serviceToken: configuration.serviceToken, correlationId: correlationId, timeout: timeout)
                    guard let profile = created.profile else {
                        throw ServiceError(.invalidMessage, "profile.create answered without a profile.")
                    }
                    step = saga.next(after: .created(profile))
                } catch {
                    step = saga.next(after: .createFailed(Self.serviceError(error)))
                }
            case .lookUpProfile:
                do {
                    let found = try await bus.call(GetProfile(), to: profileRPC, source: source, uid: uid, serviceToken: configuration.serviceToken, timeout: timeout)
                    step = saga.next(after: .lookedUp(found.profile))
                } catch {
                    step = saga.next(after: .lookUpFailed(Self.serviceError(error)))
                }
            case .deleteImage(let path):
                do {
                    _ = try await bus.call(DeleteImage(path: path), to: imageRPC, source: source, uid: uid, serviceToken: configuration.serviceToken, timeout: timeout)
                    step = saga.next(after: .imageDeleted)
                } catch {
                    logger.error("could not remove image \(path) of a profile that was not created: \(error)")
                    step = saga.next(after: .imageDeleteFailed(Self.serviceError(error)))
                }
            case .succeed(let profile):
                send(.profileCreated(uid: uid))
                return ProfileResult(profile: profile)
            case .fail(let error):
                throw Self.dependencyError(error, service: ServiceName.profile)
            }
        }
    }

    /// Bus failures (timeout, nothing listening) become `dependencyUnavailable`; a service's
    /// own refusal passes through unchanged.
    static func dependencyError(_ error: any Error, service: String) -> ServiceError {
        let error = serviceError(error)
        switch error.code {
        case .timeout, .noResponder, .closed: return .dependency(service, error)
        default: return error
        }
    }
}
