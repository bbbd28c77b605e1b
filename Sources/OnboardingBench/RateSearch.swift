/// How `--rate max` picks its steps: start at a rate, double while steps pass; after the first
/// failure, bisect between the highest passing and the lowest failing rate until they are within
/// `precision` of each other (10 %: fail ≤ 1.1 × pass), or the steps run out. A first step that
/// fails halves the rate instead, down to `minimumRate`.
///
/// Pure: it only says which rate comes next.
struct RateSearch: Sendable, Equatable {
    var startRate: Double
    var growth: Double = 2
    var precision: Double = 0.1
    var maxSteps: Int = 12
    var minimumRate: Double = 10

    private(set) var highestPass: Double?
    private(set) var lowestFail: Double?
    private(set) var steps = 0

    init(startRate: Double, growth: Double = 2, precision: Double = 0.1, maxSteps: Int = 12, minimumRate: Double = 10) {
        self.startRate = startRate
        self.growth = growth
        self.precision = precision
        self.maxSteps = maxSteps
        self.minimumRate = minimumRate
    }

    /// The first rate to try.
    var first: Double { Self.round(startRate) }

    /// Records the outcome of a step at `rate` and says which rate to try next (`nil`: done).
    mutating func next(after rate: Double, passed: Bool) -> Double? {
        steps += 1
        if passed {
            highestPass = max(highestPass ?? rate, rate)
        } else {
            lowestFail = min(lowestFail ?? rate, rate)
        }
        guard steps < maxSteps else { return nil }
        switch (highestPass, lowestFail) {
        case (let pass?, nil):
            return Self.round(pass * growth)
        case (nil, let fail?):
            let lower = Self.round(fail / growth)
            return lower >= minimumRate && lower < fail ? lower : nil
        case (let pass?, let fail?):
            guard fail > pass * (1 + precision) else { return nil }
            let middle = Self.round((pass + fail) / 2)
            return middle > pass && middle < fail ? middle : nil
        case (nil, nil):
            return nil
        }
    }

    /// Rounds to three significant digits (2,750 → 2,750; 2,874.5 → 2,870), so rates read well.
    static func round(_ rate: Double) -> Double {
        guard rate >= 100 else { return rate.rounded() }
        var scale = 1.0
        while rate / scale >= 1000 { scale *= 10 }
        return (rate / scale).rounded() * scale
    }
}
