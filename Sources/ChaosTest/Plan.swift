import Foundation
import OnboardingAPI

/// A small, fast pseudo-random generator whose whole sequence follows from its seed (SplitMix64),
/// so that `--seed` repeats a run's choices: who sets up, with an image, who withdraws, who signs
/// in on two devices, whose app checks often, and when each service is killed.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    private var state: UInt64

    public init(seed: UInt64) { self.state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// What one simulated person will do, decided before the run.
public struct PersonPlan: Sendable, Hashable {
    /// 0-based position in the run.
    public var index: Int
    public var provider: Provider
    /// The provider subject: unique to this run (it carries the run's nonce), so a run against a
    /// system that already holds people still makes new accounts.
    public var subject: String
    /// The username to set up with, or `nil` for a person who never sets up a profile.
    public var username: String?
    /// Whether the set-up carries an image.
    public var withImage: Bool
    /// Whether the person withdraws at the end.
    public var withdraws: Bool
    /// On how many devices the person signs in (1 or 2): a second device signs in while the
    /// first is signed in, and later one of them signs out while the other stays.
    public var devices: Int
    /// Whether the person's app sends "check me now" whenever Home appears: after each sign-in,
    /// while the set-up is in flight, and at other moments.
    public var checksOften: Bool
    /// Whether the person ends signed out on every device (instead of signed in), when they do
    /// not withdraw.
    public var endsSignedOut: Bool
    /// The seed of the person's own choices during the journey (which device sets up, which
    /// signs out first, when a check is sent).
    public var seed: UInt64

    public init(
        index: Int, provider: Provider, subject: String, username: String?, withImage: Bool, withdraws: Bool,
        devices: Int = 1, checksOften: Bool = false, endsSignedOut: Bool = false, seed: UInt64 = 0
    ) {
        self.index = index
        self.provider = provider
        self.subject = subject
        self.username = username
        self.withImage = withImage
        self.withdraws = withdraws
        self.devices = devices
        self.checksOften = checksOften
        self.endsSignedOut = endsSignedOut
        self.seed = seed
    }

    public var setsUp: Bool { username != nil }

    /// A short description for reports: "set up with image, two devices, withdrawn".
    public var summary: String {
        var parts: [String] = []
        if let username { parts.append(withImage ? "set up as \(username) with image" : "set up as \(username)") }
        else { parts.append("never set up") }
        if devices > 1 { parts.append("two devices") }
        if checksOften { parts.append("checks often") }
        if withdraws { parts.append("withdrew") } else if endsSignedOut { parts.append("ends signed out") }
        return parts.joined(separator: ", ")
    }
}

/// The choices of a whole run.
public struct RunPlan: Sendable {
    public var seed: UInt64
    /// Random per run (not from the seed): keeps subjects and usernames of different runs apart.
    public var nonce: String
    public var people: [PersonPlan]
    /// For each service, where in the drive (as a share of people finished, in `0..<1`) each
    /// kill happens, in order.
    public var killPoints: [String: [Double]]

    /// The shares of people who set up a profile, who add an image to it, who withdraw, who
    /// sign in on two devices, whose app checks often, and (of those who do not withdraw) who
    /// end signed out.
    public struct Shares: Sendable, Hashable {
        public var setUp: Double
        public var image: Double
        public var withdraw: Double
        public var twoDevices: Double
        public var checks: Double
        public var endSignedOut: Double

        public init(
            setUp: Double = 0.8, image: Double = 0.5, withdraw: Double = 0.4, twoDevices: Double = 0.3,
            checks: Double = 0.5, endSignedOut: Double = 0.25
        ) {
            self.setUp = setUp
            self.image = image
            self.withdraw = withdraw
            self.twoDevices = twoDevices
            self.checks = checks
            self.endSignedOut = endSignedOut
        }
    }

    /// Makes the plan for `people` people and `kills` kills of each of `services`.
    ///
    /// Everything but the nonce follows from `seed`. Usernames are 9 characters of `[a-z0-9_]`,
    /// made from the nonce and the person's index (so they differ between runs), unique within the run.
    public static func make(
        seed: UInt64, nonce: String, people count: Int, shares: Shares = Shares(), kills: Int, services: [String]
    ) -> RunPlan {
        var random = SeededGenerator(seed: seed)
        let providers = Provider.allCases
        var taken = Set<String>()
        var people: [PersonPlan] = []
        people.reserveCapacity(count)
        for index in 0..<count {
            let provider = providers[Int(random.next() % UInt64(providers.count))]
            let setsUp = Double.random(in: 0..<1, using: &random) < shares.setUp
            let withImage = setsUp && Double.random(in: 0..<1, using: &random) < shares.image
            let withdraws = Double.random(in: 0..<1, using: &random) < shares.withdraw
            let devices = Double.random(in: 0..<1, using: &random) < shares.twoDevices ? 2 : 1
            let checksOften = Double.random(in: 0..<1, using: &random) < shares.checks
            let endsSignedOut = !withdraws && Double.random(in: 0..<1, using: &random) < shares.endSignedOut
            let personSeed = random.next()
            var username: String?
            if setsUp {
                var attempt: UInt64 = 0
                repeat {
                    username = Self.username(nonce: nonce, index: index, attempt: attempt)
                    attempt += 1
                } while taken.contains(username!)
                taken.insert(username!)
            }
            people.append(PersonPlan(
                index: index, provider: provider, subject: "chaos-\(nonce)-\(index)", username: username,
                withImage: withImage, withdraws: withdraws, devices: devices, checksOften: checksOften,
                endsSignedOut: endsSignedOut, seed: personSeed))
        }
        var killPoints: [String: [Double]] = [:]
        for service in services {
            killPoints[service] = spread(kills, using: &random)
        }
        return RunPlan(seed: seed, nonce: nonce, people: people, killPoints: killPoints)
    }

    /// `count` points over the drive: point k of n lands around (k+1)/(n+1), give or take a third
    /// of the gap, so faults of one kind have time to end between them; sorted, in 0.02...0.95.
    static func spread(_ count: Int, using random: inout SeededGenerator) -> [Double] {
        guard count > 0 else { return [] }
        let gap = 1.0 / Double(count + 1)
        return (0..<count).map { k in
            let centre = gap * Double(k + 1)
            return min(max(centre + Double.random(in: -gap / 3...gap / 3, using: &random), 0.02), 0.95)
        }.sorted()
    }

    /// A username of 9 characters of `[a-z0-9_]` from a hash of the nonce, the index and the attempt.
    static func username(nonce: String, index: Int, attempt: UInt64) -> String {
        var hash: UInt64 = 0xCBF2_9CE4_8422_2325  // FNV-1a over the nonce, then mixed with the index
        for byte in nonce.utf8 {
            hash = (hash ^ UInt64(byte)) &* 0x100_0000_01B3
        }
        var mixer = SeededGenerator(seed: hash ^ (UInt64(index) &* 0x9E37_79B9_7F4A_7C15) ^ (attempt << 48))
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz0123456789_")
        // Start with a letter so the name reads as one.
        var name = String(alphabet[Int(mixer.next() % 26)])
        for _ in 1..<UsernameRules.maximumLength {
            name.append(alphabet[Int(mixer.next() % UInt64(alphabet.count))])
        }
        return name
    }

    /// A fresh nonce: 8 lowercase hex digits.
    public static func makeNonce() -> String {
        var system = SystemRandomNumberGenerator()
        let value = UInt32.random(in: .min ... .max, using: &system)
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 8 - digits.count) + digits
    }
}
