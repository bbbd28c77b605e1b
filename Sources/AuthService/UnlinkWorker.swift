import AuthIdentity
import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingSettings
import Synchronization

/// How auth unlinks withdrawn accounts at their providers.
public struct UnlinkConfiguration: Sendable {
    /// Each provider's credentials and endpoints; a provider left `nil` is not unlinked.
    public var providers: UnlinkSettings
    /// The delay before each retry (30 s doubling to 6 hours; tests make it short).
    public var backoff: UnlinkBackoff
    /// How long one unlink call may take.
    public var requestTimeout: TimeInterval
    /// How long exchanging Apple's authorization code may hold up a sign-in.
    public var exchangeTimeout: TimeInterval
    /// How many due jobs are sent at once.
    public var concurrency: Int
    public var http: any IdentityHTTPClient
    /// Told what became of each job, from the worker's task (tests wait on it). Must not block.
    public var observer: (@Sendable (UnlinkEvent) -> Void)?

    public init(
        providers: UnlinkSettings = UnlinkSettings(), backoff: UnlinkBackoff = UnlinkBackoff(), requestTimeout: TimeInterval = 10,
        exchangeTimeout: TimeInterval = 2, concurrency: Int = 8, http: any IdentityHTTPClient = AsyncHTTPIdentityClient(),
        observer: (@Sendable (UnlinkEvent) -> Void)? = nil
    ) {
        self.providers = providers
        self.backoff = backoff
        self.requestTimeout = requestTimeout
        self.exchangeTimeout = exchangeTimeout
        self.concurrency = max(1, concurrency)
        self.http = http
        self.observer = observer
    }

    /// The providers' unlink settings from the settings a program was started with, the rest
    /// as defaults.
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` naming a setting that cannot work.
    public init(_ settings: Settings) throws {
        self.init(providers: try UnlinkSettings(settings))
    }
}

/// Sends the queued unlinks (``UnlinkJob``) to the providers: due jobs at once, failures again
/// after ``UnlinkConfiguration/backoff``, until each is unlinked or refused for good. It wakes
/// when a withdrawal queues a job (``wake()``) and when the next retry is due; after a restart
/// it takes up the jobs still queued. Also keeps, at sign-in, what a later unlink will need
/// (``recordGrant(for:uid:)``).
///
/// Thread safety: `Sendable`. ``run()`` runs in one task (auth's, for as long as auth runs);
/// the other methods are called from request handlers. All I/O is async (async-http-client,
/// GRDB's async writes): nothing blocks a concurrency thread or touches the bus.
final class UnlinkWorker: Sendable {
    let configuration: UnlinkConfiguration
    private let store: any AuthStorage
    private let logger: Logger
    private let unlinker: ProviderUnlinker
    private let signal = WakeSignal()
    private struct State {
        var warnedNotConfigured: Set<Provider> = []
        /// The newest failure since start: (message, timestamp).
        var lastFailure: (error: String, at: String)?
    }
    private let state = Mutex(State())

    init(configuration: UnlinkConfiguration, store: any AuthStorage, logger: Logger) {
        self.configuration = configuration
        self.store = store
        self.logger = logger
        self.unlinker = ProviderUnlinker(http: configuration.http, timeout: configuration.requestTimeout)
    }

    /// How long a job this worker claimed stays its own: well past what sending it can take, so
    /// that another replica takes it up only when this one died with it.
    private var lease: TimeInterval { max(60, 4 * configuration.requestTimeout) }

    /// A job was queued: look at the queue now.
    func wake() { signal.wake() }

    /// Runs the worker while `body` runs, and stops it when `body` returns or throws.
    func running<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await self.run() }
            let result = try await body()
            group.cancelAll()
            return result
        }
    }

    /// Sends due jobs until cancelled. A job being sent when cancelled is left as it was, and
    /// sent again after the restart (unlinking twice is harmless at every provider); on a store
    /// shared by replicas, once its claim's lease has run out (at least a minute).
    func run() async {
        for line in configuration.providers.summary { logger.info("\(line)") }
        var signal = self.signal.makeWaiter()
        while !Task.isCancelled {
            let now = store.clock()
            var pause: TimeInterval?
            do {
                let due = try await store.claimDueUnlinkJobs(at: now, limit: configuration.concurrency, lease: lease)
                if !due.isEmpty {
                    let failed = await withTaskGroup(of: Bool.self) { group in
                        for job in due { group.addTask { await self.process(job) } }
                        return await group.contains(false)
                    }
                    // A store that fails holds the next round back a little.
                    if failed { await signal.wait(timeout: .seconds(1)) }
                    continue
                }
                // A job due but not read back (an unknown provider) must not spin the loop.
                pause = try await store.nextUnlinkAttempt().map { $0 > now ? $0.timeIntervalSince(now) : 5 }
            } catch {
                if Task.isCancelled { return }
                logger.error("the unlink queue cannot be read (\(error)); trying again in 5 s")
                pause = 5
            }
            await signal.wait(timeout: pause.map { .milliseconds(Int64(min($0, 86_400) * 1000)) })
        }
    }

    /// Sends one job and records what became of it. Returns `false` when the store failed.
    private func process(_ job: UnlinkJob) async -> Bool {
        let metadata: Logger.Metadata = ["uid": "\(job.uid)", "provider": "\(job.provider.rawValue)"]
        do {
            switch job.plan(configuration.providers) {
            case .drop(let reason):
                try await store.apply(.refused(""), to: job, at: store.clock())
                if case .notConfigured(let provider) = reason {
                    let first = state.withLock { $0.warnedNotConfigured.insert(provider).inserted }
                    if first { logger.notice("\(reason) (said once per provider)") }
                } else {
                    logger.info("unlink skipped: \(reason)", metadata: metadata)
                }
                configuration.observer?(.dropped(uid: job.uid, provider: job.provider, reason))
            case .send(let target):
                let outcome: UnlinkOutcome
                do {
                    outcome = await unlinker.send(try await target.request())
                } catch {
                    outcome = .retryLater("the \(job.provider.rawValue) request could not be made (\(error))")
                }
                // Shutting down: the answer may be a cancellation, not the provider's.
                guard !Task.isCancelled else { return true }
                let now = store.clock()
                let step = job.step(after: outcome, now: now, backoff: configuration.backoff)
                try await store.apply(step, to: job, at: now)
                report(step, job: job, at: now, metadata: metadata)
            }
            return true
        } catch {
            if Task.isCancelled || error is CancellationError { return true }
            logger.error("the unlink queue cannot be written (\(error))", metadata: metadata)
            return false
        }
    }

    private func report(_ step: UnlinkStep, job: UnlinkJob, at now: Date, metadata: Logger.Metadata) {
        switch step {
        case .unlinked:
            logger.info("unlinked at the provider", metadata: metadata)
            configuration.observer?(.unlinked(uid: job.uid, provider: job.provider))
        case .retry(let at, let attempts, let error):
            remember(error, at: now)
            logger.warning(
                "unlink failed; retrying at \(Timestamp.format(at)): \(error)",
                metadata: metadata.merging(["attempts": "\(attempts)"]) { $1 })
            configuration.observer?(.retrying(uid: job.uid, provider: job.provider, attempts: attempts, error: error))
        case .refused(let error):
            remember(error, at: now)
            logger.notice("unlink refused for good; dropped: \(error)", metadata: metadata)
            configuration.observer?(.refused(uid: job.uid, provider: job.provider, error: error))
        }
    }

    private func remember(_ error: String, at now: Date) {
        state.withLock { $0.lastFailure = (error, Timestamp.format(now)) }
    }

    // MARK: Health

    /// The queue for `health`: counted in the store, with the newest failure seen since start
    /// when it is newer than any recorded on a pending job (a refusal leaves none there).
    func status() async throws -> UnlinkQueueStatus {
        var status = try await store.unlinkQueueStatus(at: store.clock())
        if let failure = state.withLock({ $0.lastFailure }), failure.at >= (status.lastErrorAt ?? "") {
            status.lastError = failure.error
            status.lastErrorAt = failure.at
        }
        return status
    }

    // MARK: Sign-in

    /// Keeps what unlinking the account of this verified sign-in will need: Apple's refresh
    /// token (its authorization code exchanged now), Naver's or Google's access token; nothing
    /// for Kakao (its unlink names the user). Only for providers whose unlinking is configured.
    /// Never fails the sign-in: a failure is logged (without the token) and the account is then
    /// not unlinked at the provider unless a later sign-in stores a token.
    func recordGrant(for request: SignIn, uid: String) async {
        let providers = configuration.providers
        let metadata: Logger.Metadata = ["uid": "\(uid)", "provider": "\(request.provider.rawValue)"]
        let token: String
        switch request.provider {
        case .kakao:
            return
        case .naver, .google:
            guard providers.isConfigured(request.provider), let access = request.accessToken, !access.isEmpty else { return }
            token = access
        case .apple:
            guard let apple = providers.apple, let code = request.authorizationCode, !code.isEmpty else { return }
            do {
                token = try await AppleCodeExchange.exchange(
                    code: code, settings: apple, http: configuration.http, timeout: configuration.exchangeTimeout)
            } catch {
                logger.warning(
                    "Apple's authorization code could not be exchanged (\(error)); this account is not unlinked at Apple on withdrawal unless a later sign-in's code is",
                    metadata: metadata)
                return
            }
        }
        do {
            try await store.recordGrant(uid: uid, provider: request.provider, token: token)
        } catch {
            logger.warning("the token for unlinking could not be stored (\(error))", metadata: metadata)
        }
    }
}
