import OnboardingAPI
@testable import ProfileService
import Testing

extension ProfileServiceTests {
    @Suite("Profile cache")
    struct ProfileCacheTests {
        static func profile(_ uid: String, _ username: String = "mina") -> Profile {
            Profile(uid: uid, username: username, imagePath: nil, createdAt: "t0", updatedAt: "t0")
        }

        func fill(_ cache: ProfileCache, _ uid: String, with profile: Profile?) {
            guard case .miss(let ticket) = cache.lookup(uid) else {
                Issue.record("\(uid) was already cached")
                return
            }
            cache.fill(uid, with: ProfileResult(profile: profile, asOfSequence: 7), ticket: ticket)
        }

        /// A cached answer as `fill` stores it, or as `store` does with sequence 9.
        static func hit(_ profile: Profile?, _ sequence: UInt64 = 7) -> ProfileCache.Lookup {
            .hit(ProfileResult(profile: profile, asOfSequence: sequence))
        }

        @Test("a \"no profile\" answer is cached like a profile")
        func cachesAbsence() {
            let cache = ProfileCache(capacity: 10)
            fill(cache, "u1", with: nil)
            fill(cache, "u2", with: Self.profile("u2"))
            #expect(cache.lookup("u1") == Self.hit(nil))
            #expect(cache.lookup("u2") == Self.hit(Self.profile("u2")))
        }

        @Test("a write refreshes the cache and a removal clears it")
        func writesAndRemovals() {
            let cache = ProfileCache(capacity: 10)
            fill(cache, "u1", with: nil)
            cache.store(Self.profile("u1", "Mina"), sequence: 9)
            #expect(cache.lookup("u1") == Self.hit(Self.profile("u1", "Mina"), 9))
            cache.remove("u1")
            guard case .miss = cache.lookup("u1") else {
                Issue.record("u1 is still cached after removal")
                return
            }
        }

        @Test("a read that started before a write cannot put the older answer back")
        func staleFillIsDropped() {
            let cache = ProfileCache(capacity: 10)
            guard case .miss(let ticket) = cache.lookup("u1") else { return }
            cache.store(Self.profile("u1", "newer"), sequence: 9)
            cache.fill("u1", with: ProfileResult(profile: nil, asOfSequence: 8), ticket: ticket)
            #expect(cache.lookup("u1") == Self.hit(Self.profile("u1", "newer"), 9))

            guard case .miss(let late) = cache.lookup("u2") else { return }
            cache.remove("u2")
            cache.fill("u2", with: ProfileResult(profile: Self.profile("u2", "older"), asOfSequence: 3), ticket: late)
            #expect(cache.count == 1)
        }

        @Test("when full, the person asked about least recently is forgotten")
        func boundedByRecency() {
            let cache = ProfileCache(capacity: 2)
            fill(cache, "u1", with: nil)
            fill(cache, "u2", with: nil)
            _ = cache.lookup("u1")
            fill(cache, "u3", with: nil)
            #expect(cache.count == 2)
            #expect(cache.lookup("u1") == Self.hit(nil))
            #expect(cache.lookup("u3") == Self.hit(nil))
            guard case .miss = cache.lookup("u2") else {
                Issue.record("u2 should have been forgotten")
                return
            }
        }

        @Test("the LRU list stays consistent through any mix of sets, reads and removals")
        func lruAgainstModel() throws {
            var lru = LRUCache<Int, Int>(capacity: 5)
            var model: [Int] = []  // keys, most recent first
            var values: [Int: Int] = [:]
            var generator = SystemRandomNumberGenerator()
            for step in 0..<5_000 {
                let key = Int.random(in: 0..<9, using: &generator)
                switch Int.random(in: 0..<3, using: &generator) {
                case 0:
                    let evicted = lru.set(step, for: key)
                    values[key] = step
                    model.removeAll { $0 == key }
                    model.insert(key, at: 0)
                    var expectedEviction: Int?
                    if model.count > 5 {
                        expectedEviction = model.removeLast()
                        values[expectedEviction!] = nil
                    }
                    try #require(evicted == expectedEviction)
                case 1:
                    try #require(lru.value(for: key) == values[key])
                    if values[key] != nil {
                        model.removeAll { $0 == key }
                        model.insert(key, at: 0)
                    }
                default:
                    lru.removeValue(for: key)
                    values[key] = nil
                    model.removeAll { $0 == key }
                }
                try #require(lru.keysByRecency == model, "after step \(step)")
                try #require(lru.count == model.count)
            }
        }
    }
}
