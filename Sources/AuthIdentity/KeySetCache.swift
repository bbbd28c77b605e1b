import Foundation
import Logging
import OnboardingAPI
import Synchronization

/// One provider's key set, fetched over HTTP and kept for as long as the provider says.
///
/// - The set is kept for the answer's `Cache-Control: max-age`, bounded by the settings
///   (5 minutes to 24 hours; one hour when there is none). An expired set is fetched again
///   before use.
/// - A token naming a key the set lacks may fetch it again (the provider rotated its keys), but
///   at most once per ``IdentityProviderSettings/unknownKeyRefetchInterval`` (60 s): a stream of
///   tokens with made-up `kid`s costs the provider one request a minute.
/// - Callers waiting at once share one fetch. A failed fetch is not remembered: the next
///   caller tries again.
///
/// Thread safety: every method may be called from any task or thread; ``fresh(now:)`` only takes
/// a lock and never waits on I/O.
public final class KeySetCache: Sendable {
    public let provider: Provider
    public let url: String
    private let http: any IdentityHTTPClient
    private let lifetime: ClosedRange<TimeInterval>
    private let defaultLifetime: TimeInterval
    private let refetchInterval: TimeInterval
    private let timeout: TimeInterval
    private let clock: @Sendable () -> Date
    private let logger: Logger

    private struct State {
        var keys: ProviderKeySet?
        var expiresAt = Date.distantPast
        var lastFetchStarted: Date?
        var inFlight: Task<ProviderKeySet, any Error>?
        var fetches = 0
    }
    private let state = Mutex(State())

    public init(
        provider: Provider, url: String, http: any IdentityHTTPClient, settings: IdentityProviderSettings,
        clock: @escaping @Sendable () -> Date, logger: Logger
    ) {
        self.provider = provider
        self.url = url
        self.http = http
        self.lifetime = settings.keyCacheLifetime
        self.defaultLifetime = settings.defaultKeyCacheLifetime
        self.refetchInterval = settings.unknownKeyRefetchInterval
        self.timeout = settings.requestTimeout
        self.clock = clock
        self.logger = logger
    }

    /// The cached set if it has not expired at `now`; never fetches.
    public func fresh(now: Date) -> ProviderKeySet? {
        state.withLock { $0.expiresAt > now ? $0.keys : nil }
    }

    /// How many fetches were started (for health and tests).
    public var fetchCount: Int { state.withLock { $0.fetches } }

    /// The cached set, or a newly fetched one when there is none or it expired.
    ///
    /// - Throws: ``KeySetError`` when the set could not be fetched or read.
    public func current() async throws -> ProviderKeySet {
        if let keys = fresh(now: clock()) { return keys }
        guard let keys = try await startOrJoinFetch(onlyIfStartedBefore: nil) else {
            throw KeySetError("no fetch was started")  // unreachable: without a cutoff a fetch always starts
        }
        return keys
    }

    /// Fetches the set again because a token names a key it lacks, unless a fetch started
    /// within the refetch interval; then answers `nil` (the key is unknown).
    ///
    /// - Throws: ``KeySetError`` when the set could not be fetched or read.
    public func refetchForUnknownKey() async throws -> ProviderKeySet? {
        let cutoff = clock().addingTimeInterval(-refetchInterval)
        return try await startOrJoinFetch(onlyIfStartedBefore: cutoff)
    }

    /// Joins the fetch in flight, or starts one unless one started after `cutoff` (then `nil`).
    private func startOrJoinFetch(onlyIfStartedBefore cutoff: Date?) async throws -> ProviderKeySet? {
        let task: Task<ProviderKeySet, any Error>? = state.withLock { state in
            if let running = state.inFlight { return running }
            if let cutoff, let last = state.lastFetchStarted, last > cutoff { return nil }
            state.lastFetchStarted = clock()
            state.fetches += 1
            let task = Task { try await self.load() }
            state.inFlight = task
            return task
        }
        guard let task else { return nil }
        return try await task.value
    }

    /// One fetch; stores its result and clears the in-flight task.
    private func load() async throws -> ProviderKeySet {
        do {
            let answer = try await http.get(url, bearer: nil, timeout: timeout)
            guard answer.status == 200 else {
                throw KeySetError("\(url) answered HTTP \(answer.status)")
            }
            let keys = try await ProviderKeySet.parse(answer.body)
            guard !keys.keys.isEmpty else { throw KeySetError("\(url) published no usable signing key") }
            let seconds = Self.lifetime(cacheControl: answer.headers["cache-control"], default: defaultLifetime, within: lifetime)
            let now = clock()
            state.withLock { state in
                state.keys = keys
                state.expiresAt = now.addingTimeInterval(seconds)
                state.inFlight = nil
            }
            logger.info(
                "fetched \(provider.rawValue)'s signing keys",
                metadata: ["keys": "\(keys.keys.keys.sorted())", "cachedSeconds": "\(Int(seconds))", "url": "\(url)"])
            return keys
        } catch {
            state.withLock { $0.inFlight = nil }
            logger.warning("could not fetch \(provider.rawValue)'s signing keys from \(url): \(error)")
            if let error = error as? KeySetError { throw error }
            throw KeySetError("\(url) did not answer (\(error))")
        }
    }

    /// The cache lifetime an answer's `Cache-Control` asks for, within `bounds`: `max-age`, or
    /// the lower bound for `no-cache`/`no-store`, or `fallback` when it says neither.
    public static func lifetime(cacheControl: String?, default fallback: TimeInterval, within bounds: ClosedRange<TimeInterval>)
        -> TimeInterval
    {
        var seconds = fallback
        for directive in (cacheControl ?? "").split(separator: ",") {
            let parts = directive.trimmingCharacters(in: .whitespaces).lowercased().split(separator: "=", maxSplits: 1)
            switch parts.first {
            case "max-age":
                if parts.count == 2, let value = Double(parts[1].trimmingCharacters(in: CharacterSet(charactersIn: "\" "))) {
                    seconds = value
                }
            case "no-cache", "no-store":
                seconds = 0
            default:
                break
            }
        }
        return min(max(seconds, bounds.lowerBound), bounds.upperBound)
    }
}
