import Foundation
import Synchronization

extension OnboardingClient {
    /// The signed-in person's route intents, from now on and without a gap: first the intent in
    /// force (when there is one), then each new decision as it is published; every decision once
    /// (deduplicated by `intentId`) and in route-sequence order. Call it right after
    /// ``signIn(provider:subject:idToken:)`` (or at launch, with a kept session) and show what
    /// arrives.
    ///
    /// ```swift
    /// let uid = try await client.signIn(provider: .kakao, subject: "minji").uid
    /// for await received in try await client.intents() {
    ///     switch received.intent.intent {
    ///     case .presentProfileSetup: showProfileSetup()
    ///     case .dismiss: hideProfileSetup()
    ///     }
    /// }
    /// ```
    ///
    /// Why not ``routeIntents(for:)``: a new person's uid is known only from the sign-in reply,
    /// so a subscription made then may start after their first intent went out, and a fresh
    /// subscription takes a moment to join on ZeroMQ (see `MessageBus`). This call subscribes
    /// first, then asks for the intent in force (``currentIntent()``), and asks again, with
    /// growing pauses, until a live intent has arrived (proof that the subscription has joined)
    /// or `joinWindow` has passed; whatever it learns twice it delivers once. An intent lost on
    /// the bus later (the orchestrator restarting, say) comes back with the next
    /// ``checkNow()``, which republishes the intent in force.
    ///
    /// The sequence ends when the iterating task is cancelled or the sequence is dropped. The
    /// session is the one signed in when the call is made; for another person, make a client
    /// with their ``Session`` (`OnboardingClient(bus:configuration:session:)`).
    ///
    /// - Parameter joinWindow: how long to keep asking for the intent in force while no live
    ///   intent has arrived.
    /// - Throws: `unauthenticated` when nobody is signed in, the bus's errors when it cannot
    ///   subscribe, and what ``currentIntent()`` throws (after its retries).
    public func intents(joinWindow: Duration = .seconds(10)) async throws -> IntentFeed {
        guard let session else {
            throw ServiceError(.unauthenticated, "Nobody is signed in. Sign in first, then ask for intents.")
        }
        let messages = try await bus.subscribe(
            to: [configuration.routes], topics: [Topics.route(uid: session.uid)], limits: MessageLimits())
        let inForce = try await currentIntent()

        let (stream, continuation) = AsyncStream.makeStream(of: ReceivedIntent.self)
        let filter = IntentFilter(continuation)
        filter.offer(inForce)
        let bus = self.bus
        let configuration = self.configuration
        let task = Task {
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    // Asks again until the subscription has proved it joined.
                    var pause = Duration.milliseconds(20)
                    let clock = ContinuousClock()
                    let deadline = clock.now.advanced(by: joinWindow)
                    while !filter.joined, clock.now.advanced(by: pause) < deadline {
                        do { try await Task.sleep(for: pause) } catch { return }
                        pause = min(pause * 2, .seconds(1))
                        if filter.joined { return }
                        if let state = try? await bus.call(
                            CurrentIntent(), to: configuration.orchestratorRPC, source: configuration.name,
                            sessionToken: session.sessionToken, timeout: configuration.timeout)
                        {
                            filter.offer(state)
                        }
                    }
                }
                for await message in messages {
                    guard message.header.type == RouteIntent.type,
                        let intent = try? message.payload(as: RouteIntent.self)
                    else { continue }
                    filter.offer(ReceivedIntent(intent: intent, time: message.header.time, sequence: message.header.sequence), live: true)
                }
                group.cancelAll()
            }
            continuation.finish()
        }
        continuation.onTermination = { _ in task.cancel() }
        return IntentFeed(stream: stream)
    }
}

/// A person's route intents, from the intent in force on: see ``OnboardingClient/intents(joinWindow:)``.
///
/// Each element is a decision not seen before (a new `intentId`), newer (by route `sequence`)
/// than every one before it. Iterate it from one task.
public struct IntentFeed: AsyncSequence, Sendable {
    public typealias Element = ReceivedIntent
    let stream: AsyncStream<ReceivedIntent>

    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: AsyncStream<ReceivedIntent>.AsyncIterator

        public mutating func next() async -> ReceivedIntent? {
            await base.next()
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: stream.makeAsyncIterator())
    }
}

/// Lets each decision through once, in sequence order, whether it came live or from
/// `onboarding.intent`. Threading: any task; state behind a mutex, and intents are yielded
/// while holding it so that two sources cannot reorder them.
private final class IntentFilter: Sendable {
    private struct State {
        var seen: Set<String> = []
        var lastSequence: UInt64 = 0
        var joined = false
    }

    private let state = Mutex(State())
    private let continuation: AsyncStream<ReceivedIntent>.Continuation

    init(_ continuation: AsyncStream<ReceivedIntent>.Continuation) {
        self.continuation = continuation
    }

    /// Whether a live intent has arrived: the subscription has joined.
    var joined: Bool { state.withLock { $0.joined } }

    func offer(_ routeState: RouteState) {
        guard let intent = routeState.intent, let sequence = routeState.sequence else { return }
        offer(ReceivedIntent(intent: intent, time: routeState.time ?? "", sequence: sequence), live: false)
    }

    func offer(_ received: ReceivedIntent, live: Bool) {
        state.withLock { state in
            if live { state.joined = true }
            guard received.sequence > state.lastSequence, state.seen.insert(received.intent.intentId).inserted else {
                return
            }
            state.lastSequence = received.sequence
            continuation.yield(received)
        }
    }
}
