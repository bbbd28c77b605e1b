import AsyncAlgorithms
import Messaging
import OnboardingAPI
import Synchronization

/// Checks a username as a person types it.
///
/// The format is checked on every change, at once and locally. Availability is asked of the
/// profile service only once the format passes and typing has paused for ``pause`` (400 ms by
/// default), using swift-async-algorithms' `debounce`, so a fast typist never floods it. An
/// availability answer for text that has since changed is dropped.
public struct UsernameChecker<C: Clock>: Sendable where C.Duration == Duration {
    /// What to show under the text field.
    public enum State: Sendable, Hashable {
        /// The text breaks a format rule.
        case invalid(String, UsernameProblem)
        /// The format is fine; availability will be asked once typing pauses.
        case checking(String)
        case available(String)
        case unavailable(String, UsernameProblem)
        /// Availability could not be asked; the error says why.
        case failed(String, ServiceError)
    }

    public let pause: Duration
    private let clock: C
    private let availability: @Sendable (String) async throws -> UsernameAvailability

    /// - Parameter availability: asks whether a name is free (``OnboardingClient/checkUsername(_:)``).
    public init(
        pause: Duration = .milliseconds(400), clock: C,
        availability: @escaping @Sendable (String) async throws -> UsernameAvailability
    ) {
        self.pause = pause
        self.clock = clock
        self.availability = availability
    }

    /// The states to show for a sequence of text-field values. The returned sequence ends after
    /// `input` ends and the last check is answered, or when the iterating task is cancelled.
    public func states<Input: AsyncSequence & Sendable>(for input: Input) -> AsyncStream<State>
    where Input.Element == String, Input.Failure == Never {
        let (states, output) = AsyncStream.makeStream(of: State.self)
        let latest = LatestText()
        let checks = AsyncChannel<String>()
        let (pause, clock, availability) = (self.pause, self.clock, self.availability)
        let task = Task {
            await withDiscardingTaskGroup { group in
                group.addTask {
                    for await text in input {
                        latest.set(text)
                        if let problem = UsernameRules.formatProblem(text) {
                            output.yield(.invalid(text, problem))
                        } else {
                            await checks.send(text)
                            output.yield(.checking(text))
                        }
                    }
                    checks.finish()
                }
                group.addTask {
                    for await text in checks.debounce(for: pause, clock: clock) {
                        let state: State
                        do {
                            let answer = try await availability(text)
                            state = answer.available ? .available(text) : .unavailable(text, answer.reason ?? .duplicated)
                        } catch {
                            state = .failed(text, (error as? ServiceError) ?? ServiceError(.internalError, "\(error)"))
                        }
                        if latest.get() == text { output.yield(state) }
                    }
                }
            }
            output.finish()
        }
        output.onTermination = { _ in task.cancel() }
        return states
    }
}

extension UsernameChecker where C == ContinuousClock {
    public init(pause: Duration = .milliseconds(400), availability: @escaping @Sendable (String) async throws -> UsernameAvailability) {
        self.init(pause: pause, clock: ContinuousClock(), availability: availability)
    }
}

/// The text most recently typed.
private final class LatestText: Sendable {
    private let value = Mutex<String?>(nil)
    func set(_ text: String) { value.withLock { $0 = text } }
    func get() -> String? { value.withLock { $0 } }
}
