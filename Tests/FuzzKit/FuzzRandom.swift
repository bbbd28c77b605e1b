import Foundation

/// A seeded random number generator (SplitMix64): the same seed gives the same numbers on every
/// run and platform, so a failing fuzz case can be reproduced from its seed and index.
///
/// A value type: copy it to fork a stream. Not thread safe (each task uses its own).
public struct FuzzRandom: RandomNumberGenerator, Sendable {
    private var state: UInt64

    public init(seed: UInt64) {
        state = seed
    }

    /// The stream for case `index` of a run with `seed`: each case draws from its own stream, so
    /// a case does not depend on how many numbers the cases before it used.
    public init(seed: UInt64, case index: Int) {
        var mixer = FuzzRandom(seed: seed ^ (UInt64(truncatingIfNeeded: index) &* 0xD1B5_4A32_D192_ED03))
        state = mixer.next() ^ 0x5851_F42D_4C95_7F2D
    }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A number in `range`.
    public mutating func int(_ range: Range<Int>) -> Int {
        Int.random(in: range, using: &self)
    }

    public mutating func int(_ range: ClosedRange<Int>) -> Int {
        Int.random(in: range, using: &self)
    }

    /// `true` with probability `probability` (0...1).
    public mutating func chance(_ probability: Double) -> Bool {
        Double.random(in: 0..<1, using: &self) < probability
    }

    /// One element of a non-empty array.
    public mutating func pick<T>(_ items: [T]) -> T {
        precondition(!items.isEmpty, "pick from an empty array")
        return items[int(0..<items.count)]
    }

    /// One of `options`, each as likely as its weight.
    public mutating func weighted<T>(_ options: [(weight: Int, value: T)]) -> T {
        let total = options.reduce(0) { $0 + max(0, $1.weight) }
        precondition(total > 0, "weighted pick without positive weights")
        var roll = int(0..<total)
        for option in options where option.weight > 0 {
            if roll < option.weight { return option.value }
            roll -= option.weight
        }
        return options[options.count - 1].value
    }

    /// `count` random bytes.
    public mutating func bytes(_ count: Int) -> [UInt8] {
        var result: [UInt8] = []
        result.reserveCapacity(count)
        while result.count < count {
            var word = next()
            for _ in 0..<min(8, count - result.count) {
                result.append(UInt8(truncatingIfNeeded: word))
                word >>= 8
            }
        }
        return result
    }

    /// A size that is usually small and sometimes large: up to `limit`.
    public mutating func size(upTo limit: Int) -> Int {
        let bound = weighted([(6, 16), (3, 256), (2, 4096), (1, limit)])
        return int(0...max(0, min(bound, limit)))
    }
}

/// How many cases a fuzz test runs and with which seed, from the environment.
///
/// - `FUZZ_SEED`: the seed, decimal or `0x` hexadecimal; `random` picks a fresh one (printed, so a
///   failure can be replayed). Without it every run uses the test's fixed default seed.
/// - `FUZZ_ITERATIONS`: how many cases each fuzz test runs (for long runs, e.g. `100000`).
/// - `FUZZ_TRACE=1`: print each case before it runs, so a crash names the case that caused it.
public struct FuzzSettings: Sendable, CustomStringConvertible {
    public var name: String
    public var seed: UInt64
    public var iterations: Int
    public var trace: Bool

    public init(name: String, seed: UInt64, iterations: Int, trace: Bool = false) {
        self.name = name
        self.seed = seed
        self.iterations = iterations
        self.trace = trace
    }

    public static func fromEnvironment(
        _ name: String, defaultIterations: Int, defaultSeed: UInt64,
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> FuzzSettings {
        var seed = defaultSeed
        if let text = environment["FUZZ_SEED"]?.trimmingCharacters(in: .whitespaces), !text.isEmpty {
            if text.lowercased() == "random" {
                seed = UInt64.random(in: .min ... .max)
            } else if text.lowercased().hasPrefix("0x"), let value = UInt64(text.dropFirst(2), radix: 16) {
                seed = value
            } else if let value = UInt64(text) {
                seed = value
            }
        }
        var iterations = defaultIterations
        if let text = environment["FUZZ_ITERATIONS"], let value = Int(text.trimmingCharacters(in: .whitespaces)), value > 0 {
            iterations = value
        }
        let trace = ["1", "true", "yes"].contains(environment["FUZZ_TRACE"]?.lowercased() ?? "")
        return FuzzSettings(name: name, seed: seed, iterations: iterations, trace: trace)
    }

    /// The seed as `FUZZ_SEED` takes it.
    public var seedText: String { "0x" + String(seed, radix: 16) }

    public var description: String {
        "\(name): seed \(seedText), \(iterations) cases (replay: FUZZ_SEED=\(seedText) FUZZ_ITERATIONS=\(iterations))"
    }

    /// Prints `what` about case `index` when tracing.
    public func traceCase(_ index: Int, _ what: @autoclosure () -> String) {
        if trace { print("[fuzz] \(label(index)): \(what())") }
    }

    /// Names case `index` for a failure message.
    public func label(_ index: Int) -> String {
        "\(name) case \(index) (FUZZ_SEED=\(seedText))"
    }
}

/// A short, printable view of bytes for failure messages: the first `limit` bytes, with anything
/// that is not printable ASCII escaped, and the total length.
public func fuzzPreview(_ bytes: some Collection<UInt8>, limit: Int = 240) -> String {
    var text = ""
    for byte in bytes.prefix(limit) {
        switch byte {
        case 0x20...0x7E where byte != 0x5C: text.unicodeScalars.append(Unicode.Scalar(byte))
        case 0x5C: text += "\\\\"
        case 0x0A: text += "\\n"
        default: text += "\\x" + (byte < 0x10 ? "0" : "") + String(byte, radix: 16)
        }
    }
    if bytes.count > limit { text += "… (\(bytes.count) bytes)" }
    return text
}
