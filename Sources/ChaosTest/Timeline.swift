import Foundation
import OnboardingAPI

/// One thing the driver did for a person (or saw), in the order it did them. A person's steps
/// run one after another, except checks sent while a set-up or sign-out is in flight, which are
/// recorded as ``racingCheck`` and change nothing the checks rely on.
public enum Deed: Sendable, Hashable, CustomStringConvertible {
    /// A sign-in on `device` was answered. `uncertain`: an attempt timed out before the one
    /// answered, so auth may have opened a session the driver never got (a second session).
    case signIn(device: Int, uncertain: Bool)
    /// The sign-out of `device`'s session was answered.
    case signOut(device: Int)
    /// The set-up was answered with the profile.
    case setUp
    /// `onboarding.intent` showed this intent in force (the driver waits for
    /// `presentProfileSetup` as an app does).
    case sawIntent(id: String, kind: RouteIntent.Kind)
    /// "Check me now" was answered (`hasProfile`).
    case check(device: Int, hasProfile: Bool)
    /// A check sent while a set-up or sign-out was in flight was answered (or refused).
    case racingCheck(device: Int, answer: String)
    /// The withdrawal was answered.
    case withdraw

    public var description: String {
        switch self {
        case .signIn(let device, let uncertain): return "sign-in on device \(device + 1)\(uncertain ? " (resent after a timeout)" : "")"
        case .signOut(let device): return "sign-out on device \(device + 1)"
        case .setUp: return "set-up answered"
        case .sawIntent(let id, let kind): return "onboarding.intent: \(kind.rawValue) \(id)"
        case .check(let device, let hasProfile): return "check on device \(device + 1): hasProfile \(hasProfile)"
        case .racingCheck(let device, let answer): return "check on device \(device + 1) racing a step: \(answer)"
        case .withdraw: return "withdrawal answered"
        }
    }
}

/// What a person's deeds say about their sessions, as the driver knows them.
public struct Timeline: Sendable, Hashable {
    /// Sign-outs that left no session of the driver's signed in and were followed by another
    /// sign-in: each allows one more decision (a new `intentId`) for the same missing profile.
    public var fullSignOutsFollowedBySignIn = 0
    /// Whether every session was signed out at some point after the set-up was answered (then
    /// the `dismiss` may have been cleared from force).
    public var fullSignOutAfterSetUp = false
    /// Whether a sign-in was resent after a timeout (auth may hold a session the driver does
    /// not know of, so "every session signed out" is the driver's view only).
    public var uncertainSessions = false
    /// Whether the driver holds a session at the end.
    public var signedInAtEnd = false
    /// `presentProfileSetup` ids the driver saw in force before its last full sign-out that
    /// was followed by a sign-in.
    public var presentSeenBeforeLastFullSignOut: Set<String> = []

    public init() {}

    public init(_ deeds: [Deed]) {
        var signedIn = Set<Int>()
        var setUp = false
        var fullSignOutPending = false
        var seen = Set<String>()
        for deed in deeds {
            switch deed {
            case .signIn(let device, let uncertain):
                if uncertain { uncertainSessions = true }
                if signedIn.isEmpty, fullSignOutPending {
                    fullSignOutsFollowedBySignIn += 1
                    presentSeenBeforeLastFullSignOut.formUnion(seen)
                    fullSignOutPending = false
                }
                signedIn.insert(device)
            case .signOut(let device):
                signedIn.remove(device)
                if signedIn.isEmpty {
                    fullSignOutPending = true
                    if setUp { fullSignOutAfterSetUp = true }
                }
            case .setUp:
                setUp = true
            case .sawIntent(let id, let kind):
                if kind == .presentProfileSetup { seen.insert(id) }
            case .withdraw:
                signedIn.removeAll()
            case .check, .racingCheck:
                break
            }
        }
        signedInAtEnd = !signedIn.isEmpty
    }
}
