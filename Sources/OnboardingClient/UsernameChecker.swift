import AsyncAlgorithms
import Messaging
import OnboardingAPI
import Synchronization

/// Checks a username as a person types it.
///
/// The format is checked on every change, at once and locally. Every change, valid or not, goes
/// through swift-async-algorithms' `debounce`; once typing has paused for ``pause`` (400 ms by
/// default), availability is asked of the profile service only if the text then present passes the
/// format rules, so a fast typist never floods it. An availability answer is shown only if the text
/// has not changed since it was typed: it never follows a state for newer text.
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
        let shown = ShownText(output)
        let changes = AsyncChannel<Change>()
        let (pause, clock, availability) = (self.pause, self.clock, self.availability)
        let task = Task {
            await withDiscardingTaskGroup { group in
                group.addTask {
                    for await text in input {
                        let change = shown.typed(text)
                        // Invalid text goes through the debounce too: any change restarts the pause.
                        await changes.send(change)
                    }
                    changes.finish()
                }
                group.addTask {
                    for await change in changes.debounce(for: pause, clock: clock) {
                        guard change.formatPasses, shown.isLatest(change) else { continue }
                        let text = change.text
                        let state: State
                        do {
                            let answer = try await availability(text)
                            state = answer.available ? .available(text) : .unavailable(text, answer.reason ?? .duplicated)
                        } catch {
                            state = .failed(text, (error as? ServiceError) ?? ServiceError(.internalError, "\(error)"))
                        }
                        shown.answer(state, for: change)
                    }
                }
            }
            output.finish()
        }
        output.onTermination = { _ in task.cancel() }
        return states
    }

    /// One text-field value, numbered in the order it was typed.
    fileprivate struct Change: Sendable {
        var text: String
        var number: Int
        var formatPasses: Bool
    }

    /// The latest change and the states shown for it. Recording a change with its format state, and
    /// showing an availability answer only if its change is still the latest, happen under one lock,
    /// so an answer for old text can never be shown after a state for newer text.
    private final class ShownText: Sendable {
        private let latest = Mutex(0)
        private let output: AsyncStream<State>.Continuation

        init(_ output: AsyncStream<State>.Continuation) { self.output = output }

        /// Records `text` as the latest change and shows its format state.
        func typed(_ text: String) -> Change {
            let problem = UsernameRules.formatProblem(text)
            return latest.withLock { latest in
                latest += 1
                // `yield` never blocks: doing it under the lock keeps the order of the states.
                output.yield(problem.map { .invalid(text, $0) } ?? .checking(text))
                return Change(text: text, number: latest, formatPasses: problem == nil)
            }
        }

        func isLatest(_ change: Change) -> Bool { latest.withLock { $0 == change.number } }

        /// Shows an availability answer, unless the text has changed since `change`.
        func answer(_ state: State, for change: Change) {
            latest.withLock { latest in
                if latest == change.number { output.yield(state) }
            }
        }
    }
}

extension UsernameChecker where C == ContinuousClock {
    public init(pause: Duration = .milliseconds(400), availability: @escaping @Sendable (String) async throws -> UsernameAvailability) {
        self.init(pause: pause, clock: ContinuousClock(), availability: availability)
    }
}
