import OnboardingAPI
import Synchronization

/// The per-person cache in front of the ``ProfileStore``, holding profiles and "no profile"
/// answers alike (never failures), each with how new it is (``ProfileResult/asOfSequence``).
///
/// Reads go to the cache first; on a miss the caller reads the store and offers the answer back
/// with ``fill(_:with:ticket:)``. Writes go to the store and then refresh the cache with
/// ``store(_:)``; delete and eviction ``remove(_:)`` the entry. When full, the least recently
/// used person is forgotten.
///
/// A fill is dropped when any write or removal happened since its ``lookup(_:)``, so a read that
/// started before a write can never put the older answer back over the newer one. (This is
/// coarse on purpose: such a read simply is not cached, and the next one is.)
///
/// Thread safety: all state sits behind one `Mutex`; every method may be called from any task
/// and none blocks for longer than a dictionary update.
public final class ProfileCache: Sendable {
    /// What a lookup found.
    public enum Lookup: Sendable, Equatable {
        /// The cached answer: the profile, or none for "this person has no profile".
        case hit(ProfileResult)
        /// Nothing cached; read the store, then hand the answer to ``fill(_:with:ticket:)``.
        case miss(FillTicket)
    }

    /// Proof of when a missed lookup happened, so a late fill can be recognised.
    public struct FillTicket: Sendable, Equatable {
        fileprivate let changes: UInt64
    }

    private struct State {
        var entries: LRUCache<String, ProfileResult>
        var changes: UInt64 = 0
        var isTracking = true
    }

    private let state: Mutex<State>

    /// The most people whose answers are kept.
    public let capacity: Int

    /// - Parameter capacity: at least 1.
    public init(capacity: Int) {
        precondition(capacity >= 1, "A profile cache holds at least one entry.")
        self.capacity = capacity
        self.state = Mutex(State(entries: LRUCache(capacity: capacity)))
    }

    /// How many people have a cached answer.
    public var count: Int {
        state.withLock { $0.entries.count }
    }

    /// The cached answer for `uid`, or a ticket to fill it with.
    public func lookup(_ uid: String) -> Lookup {
        state.withLock { state in
            if state.isTracking, let cached = state.entries.value(for: uid) { return .hit(cached) }
            return .miss(FillTicket(changes: state.changes))
        }
    }

    /// Caches what the store answered for `uid` after a missed lookup, unless the cache was
    /// changed since then.
    public func fill(_ uid: String, with answer: ProfileResult, ticket: FillTicket) {
        state.withLock { state in
            guard state.isTracking, state.changes == ticket.changes else { return }
            // Of two reads that missed together, the newer answer stays.
            if let cached = state.entries.value(for: uid),
                (cached.asOfSequence ?? 0) > (answer.asOfSequence ?? 0)
            {
                return
            }
            state.entries.set(answer, for: uid)
        }
    }

    /// Caches `profile` as just written to the store by the event numbered `sequence`.
    public func store(_ profile: Profile, sequence: UInt64) {
        state.withLock { state in
            state.changes &+= 1
            guard state.isTracking else { return }
            state.entries.set(ProfileResult(profile: profile, asOfSequence: sequence), for: profile.uid)
        }
    }

    /// Forgets whatever is cached for `uid`.
    public func remove(_ uid: String) {
        state.withLock { state in
            state.changes &+= 1
            state.entries.removeValue(for: uid)
        }
    }

    /// Forgets what is cached for `uid` when it is older than `sequence`: another replica's
    /// change, numbered `sequence`, was committed (this one's own changes are cached newer).
    public func remove(_ uid: String, olderThan sequence: UInt64) {
        state.withLock { state in
            state.changes &+= 1
            if let cached = state.entries.peek(uid), (cached.asOfSequence ?? 0) >= sequence { return }
            state.entries.removeValue(for: uid)
        }
    }

    /// Whether answers are kept. A store shared by several replicas turns this off (forgetting
    /// everything) while it cannot hear of the others' changes, and on once it can again:
    /// meanwhile every lookup misses.
    public var isTracking: Bool {
        get { state.withLock { $0.isTracking } }
        set {
            state.withLock { state in
                state.isTracking = newValue
                Self.forgetAll(&state, capacity: capacity)
            }
        }
    }

    /// Forgets every answer (fills under way are dropped too).
    public func removeAll() {
        state.withLock { state in Self.forgetAll(&state, capacity: capacity) }
    }

    private static func forgetAll(_ state: inout State, capacity: Int) {
        state.changes &+= 1
        state.entries = LRUCache(capacity: capacity)
    }
}
