import CoreMetrics
import Foundation
import Messaging
import OnboardingAPI
import ServiceRuntime
import Synchronization

/// The orchestrator's own metrics: decisions by intent and reason, the time from a sign-in to
/// its intent, and withdrawal clean-up steps (see ``MetricDefinition``).
///
/// A decision counts once its transaction has committed: ``decided(_:)`` notes it inside the
/// transaction, ``committed(at:)`` or ``rolledBack()`` settles the notes. One transaction
/// commits at a time, so one list of notes serves.
///
/// Thread safety: the handles are made in `init`; what is noted is behind one mutex, taken once
/// per event or intent, never contended (one transaction at a time, on one thread).
final class DecisionFigures: Sendable {
    private let decisions: [RouteIntent.Kind: [RouteIntent.Reason: Counter]]
    private let signInToIntent: CoreMetrics.Timer
    private let cleanUps: [OnboardingStateMachine.CleanupStep: (ok: Counter, failed: Counter)]
    private let notes = Mutex(Notes())

    private struct Notes {
        /// Intents decided in the transaction under way.
        var decided: [(uid: String, kind: RouteIntent.Kind, reason: RouteIntent.Reason)] = []
        /// When auth committed each sign-in whose intent has not been committed yet (the
        /// envelope's `time`), by uid.
        var signedIn: [String: String] = [:]
    }

    /// Sign-ins waiting for their intent that are remembered at most; beyond, the oldest notes
    /// are forgotten (those sign-ins go untimed), so people who sign in and need no intent do
    /// not grow it.
    static let maxWaiting = 50_000

    init(factory: any MetricsFactory = MetricsSystem.factory) {
        decisions = Dictionary(
            uniqueKeysWithValues: RouteIntent.Kind.allCases.map { kind in
                (
                    kind,
                    Dictionary(
                        uniqueKeysWithValues: RouteIntent.Reason.allCases.map { reason in
                            (
                                reason,
                                Counter(
                                    label: MetricDefinition.decisions.name,
                                    dimensions: [("intent", kind.rawValue), ("reason", reason.rawValue)], factory: factory)
                            )
                        })
                )
            })
        signInToIntent = Timer(label: MetricDefinition.signInToIntent.name, factory: factory)
        cleanUps = Dictionary(
            uniqueKeysWithValues: OnboardingStateMachine.CleanupStep.allCases.map { step in
                func counter(_ outcome: String) -> Counter {
                    Counter(
                        label: MetricDefinition.cleanUps.name, dimensions: [("step", step.rawValue), ("outcome", outcome)],
                        factory: factory)
                }
                return (step, (counter("ok"), counter("failed")))
            })
    }

    /// Auth committed `uid`'s sign-in at `time` (the event envelope's).
    func signedIn(_ uid: String, at time: String) {
        notes.withLock { notes in
            if notes.signedIn.count >= Self.maxWaiting { notes.signedIn.removeAll(keepingCapacity: true) }
            notes.signedIn[uid] = time
        }
    }

    /// `intent` was decided in the transaction under way.
    func decided(_ intent: RouteIntent) {
        notes.withLock { $0.decided.append((intent.uid, intent.intent, intent.reason)) }
    }

    /// The transaction under way committed at `now`: its decisions count.
    func committed(at now: Date = Date()) {
        let (decided, signIns) = notes.withLock { notes -> ([(uid: String, kind: RouteIntent.Kind, reason: RouteIntent.Reason)], [String]) in
            defer { notes.decided.removeAll(keepingCapacity: true) }
            var times: [String] = []
            for decision in notes.decided {
                if let time = notes.signedIn.removeValue(forKey: decision.uid), decision.reason == .signedIn { times.append(time) }
            }
            return (notes.decided, times)
        }
        for decision in decided { decisions[decision.kind]?[decision.reason]?.increment() }
        for time in signIns {
            guard let signedIn = Timestamp.parseFast(time) else { continue }
            signInToIntent.recordNanoseconds(Int64(max(0, now.timeIntervalSince(signedIn)) * 1e9))
        }
    }

    /// The transaction under way rolled back: its decisions do not count.
    func rolledBack() {
        notes.withLock { $0.decided.removeAll(keepingCapacity: true) }
    }

    /// A withdrawal clean-up step ended: done, or failed (to be tried again).
    func cleanUp(_ step: OnboardingStateMachine.CleanupStep, succeeded: Bool) {
        guard let counters = cleanUps[step] else { return }
        (succeeded ? counters.ok : counters.failed).increment()
    }
}
