import Foundation
import OnboardingAPI

/// A small, fast pseudo-random generator whose whole sequence follows from its seed (SplitMix64),
/// so that `--seed` repeats a run's choices: who sets up, with an image, who withdraws, who signs
/// in on two devices, whose app checks often, and which fault happens when.
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

/// A fault the run inflicts on the compose deployment, and when.
public struct PlannedFault: Sendable, Hashable {
    public enum Kind: Sendable, Hashable {
        /// SIGKILL one service; compose restarts it.
        case kill(String)
        /// SIGSTOP one service for `milliseconds`, then SIGCONT. `afterSetUpBegins`: the hang
        /// starts a moment after some person's set-up was sent, so it catches set-ups in flight.
        case hang(String, milliseconds: Int, afterSetUpBegins: Bool)
        /// SIGKILL two services at once.
        case killTwo(String, String)
        /// Stop every service at once with `signal` (SIGTERM: they drain and exit; SIGKILL) and
        /// let compose start them again on the same data.
        case restartAll(signal: StopSignal)
        /// SIGSTOP compose's PostgreSQL (the postmaster and every backend) for `milliseconds`,
        /// then SIGCONT.
        case pauseDatabase(milliseconds: Int)
        /// Restart compose's PostgreSQL at once (`pg_ctl restart -m immediate`: no shutdown
        /// checkpoint, every connection cut; it recovers from its WAL).
        case restartDatabase
    }

    /// The lock name of the database faults: they never overlap one another.
    public static let database = "postgres"

    public enum StopSignal: String, Sendable, Hashable, Codable {
        case term = "SIGTERM"
        case kill = "SIGKILL"
    }

    public var kind: Kind
    /// Where in the drive it happens, as a share of people finished, in `0..<1`.
    public var point: Double

    public init(_ kind: Kind, at point: Double) {
        self.kind = kind
        self.point = point
    }

    /// The services it touches (compose's names).
    public func services(all: [String]) -> [String] {
        switch kind {
        case .kill(let service), .hang(let service, _, _): return [service]
        case .killTwo(let first, let second): return [first, second]
        case .restartAll: return all
        case .pauseDatabase, .restartDatabase: return [Self.database]
        }
    }

    /// "hang profile 2.8 s after a set-up began", "SIGKILL auth + profile", …
    public var label: String {
        switch kind {
        case .kill(let service): return "SIGKILL \(service)"
        case .hang(let service, let ms, let afterSetUp):
            return "SIGSTOP \(service) for \(String(format: "%.1f", Double(ms) / 1000)) s\(afterSetUp ? " right after a set-up began" : "")"
        case .killTwo(let first, let second): return "SIGKILL \(first) + \(second) at once"
        case .restartAll(let signal): return "\(signal.rawValue) every service at once (whole-system stop and start)"
        case .pauseDatabase(let ms): return "SIGSTOP PostgreSQL for \(String(format: "%.1f", Double(ms) / 1000)) s"
        case .restartDatabase: return "restart PostgreSQL at once (pg_ctl restart -m immediate)"
        }
    }
}

/// How many faults of each kind a run inflicts.
public struct FaultCounts: Sendable, Hashable {
    /// SIGKILLs of each service.
    public var killsPerService: Int
    /// SIGSTOP/SIGCONT hangs of each service.
    public var hangsPerService: Int
    /// How long a hang lasts, in milliseconds (each hang draws from this range).
    public var hangMilliseconds: ClosedRange<Int>
    /// Times two services are SIGKILLed at once.
    public var doubleKills: Int
    /// Whole-system stops and starts (the first with SIGTERM, then SIGKILL, alternating).
    public var systemRestarts: Int
    /// Pauses of compose's PostgreSQL (each as long as a hang).
    public var databasePauses: Int
    /// Immediate restarts of compose's PostgreSQL.
    public var databaseRestarts: Int

    public init(
        killsPerService: Int = 3, hangsPerService: Int = 2, hangMilliseconds: ClosedRange<Int> = 2_000...4_000,
        doubleKills: Int = 2, systemRestarts: Int = 2, databasePauses: Int = 0, databaseRestarts: Int = 0
    ) {
        self.killsPerService = killsPerService
        self.hangsPerService = hangsPerService
        self.hangMilliseconds = hangMilliseconds
        self.doubleKills = doubleKills
        self.systemRestarts = systemRestarts
        self.databasePauses = databasePauses
        self.databaseRestarts = databaseRestarts
    }

    /// Only SIGKILLs of each service, as the chaos test did before hangs and the rest.
    public static func killsOnly(_ kills: Int) -> FaultCounts {
        FaultCounts(killsPerService: kills, hangsPerService: 0, doubleKills: 0, systemRestarts: 0)
    }
}

/// The choices of a whole run.
public struct RunPlan: Sendable {
    public var seed: UInt64
    /// Random per run (not from the seed): keeps subjects and usernames of different runs apart.
    public var nonce: String
    public var people: [PersonPlan]
    /// Every fault of the run, ordered by where in the drive it happens.
    public var faults: [PlannedFault]

    /// For each service, where in the drive (as a share of people finished) each of its single
    /// SIGKILLs happens, in order.
    public var killPoints: [String: [Double]] {
        var points: [String: [Double]] = [:]
        for fault in faults {
            if case .kill(let service) = fault.kind { points[service, default: []].append(fault.point) }
        }
        return points.mapValues { $0.sorted() }
    }

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

    /// Makes the plan for `people` people and the `faults` of `services`.
    ///
    /// Everything but the nonce follows from `seed`. Usernames are 9 characters of `[a-z0-9_]`,
    /// made from the nonce and the person's index (so they differ between runs), unique within the run.
    public static func make(
        seed: UInt64, nonce: String, people count: Int, shares: Shares = Shares(), faults counts: FaultCounts,
        services: [String]
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
        var faults: [PlannedFault] = []
        for service in services {
            for point in spread(counts.killsPerService, using: &random) {
                faults.append(PlannedFault(.kill(service), at: point))
            }
        }
        for service in services {
            for (k, point) in spread(counts.hangsPerService, using: &random).enumerated() {
                let span = UInt64(counts.hangMilliseconds.upperBound - counts.hangMilliseconds.lowerBound + 1)
                let milliseconds = counts.hangMilliseconds.lowerBound + Int(random.next() % span)
                // Every other hang starts right after a set-up begins.
                faults.append(PlannedFault(
                    .hang(service, milliseconds: milliseconds, afterSetUpBegins: k.isMultiple(of: 2)), at: point))
            }
        }
        if services.count >= 2 {
            for point in spread(counts.doubleKills, using: &random) {
                let first = Int(random.next() % UInt64(services.count))
                var second = Int(random.next() % UInt64(services.count - 1))
                if second >= first { second += 1 }
                let pair = [services[first], services[second]].sorted {
                    services.firstIndex(of: $0)! < services.firstIndex(of: $1)!
                }
                faults.append(PlannedFault(.killTwo(pair[0], pair[1]), at: point))
            }
        }
        for (k, point) in spread(counts.systemRestarts, using: &random).enumerated() {
            faults.append(PlannedFault(.restartAll(signal: k.isMultiple(of: 2) ? .term : .kill), at: point))
        }
        for point in spread(counts.databasePauses, using: &random) {
            let span = UInt64(counts.hangMilliseconds.upperBound - counts.hangMilliseconds.lowerBound + 1)
            faults.append(PlannedFault(.pauseDatabase(milliseconds: counts.hangMilliseconds.lowerBound + Int(random.next() % span)), at: point))
        }
        for point in spread(counts.databaseRestarts, using: &random) {
            faults.append(PlannedFault(.restartDatabase, at: point))
        }
        faults.sort { $0.point < $1.point }
        return RunPlan(seed: seed, nonce: nonce, people: people, faults: faults)
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
