import Messaging
import OnboardingAPI
import OnboardingClient
import Synchronization
import Testing

/// Counts things that happen, so a test can wait for the next one instead of polling.
final class Events: Sendable {
    private struct Waiter {
        var after: Int
        var continuation: CheckedContinuation<Bool, Never>
        var timer: Task<Void, Never>
    }

    private struct State {
        var count = 0
        var nextID = 0
        var waiters: [Int: Waiter] = [:]
    }

    private let state = Mutex(State())

    /// How many things have happened so far.
    var count: Int { state.withLock { $0.count } }

    func happened() {
        let ready = state.withLock { state -> [Waiter] in
            state.count += 1
            let ready = state.waiters.filter { $0.value.after < state.count }
            for id in ready.keys { state.waiters[id] = nil }
            return Array(ready.values)
        }
        for waiter in ready {
            waiter.timer.cancel()
            waiter.continuation.resume(returning: true)
        }
    }

    /// Waits until more than `seen` things have happened; false if that takes longer than `timeout`.
    func wait(after seen: Int, timeout: Duration = .seconds(30)) async -> Bool {
        await withCheckedContinuation { continuation in
            let already = state.withLock { state -> Bool in
                if state.count > seen { return true }
                state.nextID += 1
                let id = state.nextID
                let timer = Task { [self] in
                    try? await Task.sleep(for: timeout)
                    self.state.withLock { $0.waiters.removeValue(forKey: id) }?.continuation.resume(returning: false)
                }
                state.waiters[id] = Waiter(after: seen, continuation: continuation, timer: timer)
                return false
            }
            if already { continuation.resume(returning: true) }
        }
    }

    /// Waits until `condition` holds, looking again each time something happens. Returns false if
    /// nothing happens for `timeout` while it does not hold.
    func wait(until condition: () -> Bool, timeout: Duration = .seconds(30)) async -> Bool {
        while true {
            let seen = count
            if condition() { return true }
            guard await wait(after: seen, timeout: timeout) else { return false }
        }
    }
}

/// Records the availability checks a checker makes, with the virtual time of each. With
/// `holdAnswers`, each check waits until the test releases it, so a test can type while it is
/// in flight.
final class AvailabilityRecorder: Sendable {
    let clock: ManualClock
    let events: Events
    let taken: Set<String>
    let holdAnswers: Bool
    private let calls = Mutex<[(String, Duration)]>([])
    private let pending = Mutex<[(String, CheckedContinuation<Void, Never>)]>([])

    init(clock: ManualClock, events: Events, taken: Set<String> = [], holdAnswers: Bool = false) {
        self.clock = clock
        self.events = events
        self.taken = taken
        self.holdAnswers = holdAnswers
    }

    var names: [String] { calls.withLock { $0.map(\.0) } }
    var times: [Duration] { calls.withLock { $0.map(\.1) } }
    /// The names of the checks waiting to be released.
    var held: [String] { pending.withLock { $0.map(\.0) } }

    func check(_ name: String) async -> UsernameAvailability {
        calls.withLock { $0.append((name, clock.now.offset)) }
        if holdAnswers {
            await withCheckedContinuation { continuation in
                pending.withLock { $0.append((name, continuation)) }
                events.happened()
            }
        } else {
            events.happened()
        }
        let free = !taken.contains(name.lowercased())
        return UsernameAvailability(username: name, available: free, reason: free ? nil : .duplicated)
    }

    /// Lets the held check for `name` answer.
    func release(_ name: String) {
        let continuation = pending.withLock { pending -> CheckedContinuation<Void, Never>? in
            guard let index = pending.firstIndex(where: { $0.0 == name }) else { return nil }
            return pending.remove(at: index).1
        }
        guard let continuation else {
            Issue.record("no check for \(name) is held; held: \(held)")
            return
        }
        continuation.resume()
    }
}

/// The states a checker has shown so far.
final class ShownStates: Sendable {
    private let states = Mutex<[UsernameChecker<ManualClock>.State]>([])
    private let events: Events

    init(events: Events) { self.events = events }

    var all: [UsernameChecker<ManualClock>.State] { states.withLock { $0 } }

    func append(_ state: UsernameChecker<ManualClock>.State) {
        states.withLock { $0.append(state) }
        events.happened()
    }

    func withLock<T>(_ body: ([UsernameChecker<ManualClock>.State]) -> T) -> T { states.withLock { body($0) } }
}

/// Feeds text-field values to a checker and reads the states it shows.
///
/// Nothing here polls: waiting looks again only when a state is shown, an availability check is
/// made, or a task starts sleeping on the virtual clock.
final class Field: Sendable {
    let events: Events
    let clock: ManualClock
    let recorder: AvailabilityRecorder
    let typed: AsyncStream<String>.Continuation
    let shown: ShownStates
    let task: Task<Void, Never>

    init(taken: Set<String> = [], holdAnswers: Bool = false) {
        let events = Events()
        self.events = events
        clock = ManualClock(onSleep: { events.happened() })
        let recorder = AvailabilityRecorder(clock: clock, events: events, taken: taken, holdAnswers: holdAnswers)
        self.recorder = recorder
        shown = ShownStates(events: events)
        let checker = UsernameChecker(pause: .milliseconds(400), clock: clock) { await recorder.check($0) }
        let (input, typed) = AsyncStream.makeStream(of: String.self)
        self.typed = typed
        let states = checker.states(for: input)
        let shown = self.shown
        task = Task {
            for await state in states { shown.append(state) }
        }
    }

    /// Types `text` and waits until its format state is shown.
    func type(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) async {
        let before = shown.withLock { $0.count }
        typed.yield(text)
        await until(sourceLocation: sourceLocation) { $0.count > before }
    }

    /// Lets virtual time pass, from one sleeper's deadline to the next, until `condition` holds.
    func advance(
        sourceLocation: SourceLocation = #_sourceLocation,
        until condition: ([UsernameChecker<ManualClock>.State]) -> Bool
    ) async {
        for _ in 0..<1_000 {
            let seen = events.count
            if shown.withLock(condition) { return }
            if clock.advanceToNextDeadline() { continue }
            guard await events.wait(after: seen) else { break }
        }
        Issue.record("gave up waiting; shown so far: \(shown.all)", sourceLocation: sourceLocation)
    }

    /// Waits until the checker sleeps on the clock (its pause has begun), then moves time on by `duration`.
    func pause(for duration: Duration, sourceLocation: SourceLocation = #_sourceLocation) async {
        if await !events.wait(until: { clock.hasSleepers }) {
            Issue.record("nothing ever slept on the clock; shown so far: \(shown.all)", sourceLocation: sourceLocation)
        }
        clock.advance(by: duration)
    }

    /// Waits, without moving time, until `condition` holds.
    func until(
        sourceLocation: SourceLocation = #_sourceLocation,
        _ condition: ([UsernameChecker<ManualClock>.State]) -> Bool
    ) async {
        if await !events.wait(until: { shown.withLock(condition) }) {
            Issue.record("gave up waiting; shown so far: \(shown.all)", sourceLocation: sourceLocation)
        }
    }

    var last: UsernameChecker<ManualClock>.State? { shown.withLock { $0.last } }

    func stop() {
        typed.finish()
        task.cancel()
    }
}

/// The state shown at once for `text`.
func formatState(_ text: String) -> UsernameChecker<ManualClock>.State {
    UsernameRules.formatProblem(text).map { .invalid(text, $0) } ?? .checking(text)
}

@Suite("Checking a username while it is typed")
struct UsernameCheckerTests {
    @Test("the format is checked on every change, at once")
    func formatAtOnce() async {
        let field = Field()
        await field.type("")
        #expect(field.last == .invalid("", .empty))
        await field.type("m")
        #expect(field.last == .invalid("m", .tooShort))
        await field.type("mina!")
        #expect(field.last == .invalid("mina!", .invalidCharacters))
        await field.type("mina")
        #expect(field.last == .checking("mina"))
        #expect(field.recorder.names.isEmpty)
        field.stop()
    }

    @Test("availability is asked once typing pauses for 400 ms, for the last text only")
    func debounced() async {
        let field = Field()
        for text in ["mi", "min", "mina", "minah"] { await field.type(text) }
        #expect(field.recorder.names.isEmpty)
        await field.advance { $0.last == .available("minah") }
        #expect(field.recorder.names == ["minah"])
        #expect(field.recorder.times.allSatisfy { $0 >= .milliseconds(400) })
        field.stop()
    }

    @Test("text that breaks a format rule is never sent for an availability check")
    func invalidNeverAsked() async {
        let field = Field()
        await field.type("a")
        await field.type("mina-1")
        await field.pause(for: .seconds(1))
        await field.type("mina_1")
        await field.advance { $0.last == .available("mina_1") }
        #expect(field.recorder.names == ["mina_1"])
        field.stop()
    }

    @Test("a change to text that breaks a rule restarts the pause: nothing is asked for the text before it")
    func invalidRestartsPause() async {
        let field = Field()
        await field.type("mina")
        await field.type("mina!")
        await field.pause(for: .seconds(1))
        // A later check, answered in order after anything the pause set off, shows what was asked.
        await field.type("minah")
        await field.advance { $0.last == .available("minah") }
        #expect(field.recorder.names == ["minah"])
        #expect(field.shown.all == [.checking("mina"), .invalid("mina!", .invalidCharacters), .checking("minah"), .available("minah")])
        field.stop()
    }

    @Test(
        "an answer for text that has changed while it was asked is never shown",
        arguments: [["minah"], ["mina!"], ["mina!", "mina"]])
    func staleAnswerDropped(changes: [String]) async {
        let field = Field(holdAnswers: true)
        await field.type("mina")
        await field.advance { _ in field.recorder.held == ["mina"] }
        for text in changes { await field.type(text) }
        field.recorder.release("mina")
        await field.type("minji")
        await field.advance { _ in field.recorder.held == ["minji"] }
        field.recorder.release("minji")
        await field.until { $0.last == .available("minji") }
        #expect(field.recorder.names == ["mina", "minji"])
        #expect(field.shown.all == [.checking("mina")] + changes.map(formatState) + [.checking("minji"), .available("minji")])
        field.stop()
    }

    @Test("a name someone holds is shown as duplicated")
    func duplicated() async {
        let field = Field(taken: ["mina"])
        await field.type("Mina")
        await field.advance { $0.last == .unavailable("Mina", .duplicated) }
        #expect(field.recorder.names == ["Mina"])
        field.stop()
    }

    @Test("each pause asks again for what is there then")
    func eachPause() async {
        let field = Field()
        await field.type("mina")
        await field.advance { $0.last == .available("mina") }
        await field.type("minji")
        await field.advance { $0.last == .available("minji") }
        #expect(field.recorder.names == ["mina", "minji"])
        field.stop()
    }
}
