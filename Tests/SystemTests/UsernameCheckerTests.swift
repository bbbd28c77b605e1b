import Messaging
import OnboardingAPI
import OnboardingClient
import Synchronization
import Testing

/// Records the availability checks a checker makes, with the virtual time of each.
final class AvailabilityRecorder: Sendable {
    let clock: ManualClock
    private let calls = Mutex<[(String, Duration)]>([])
    let taken: Set<String>

    init(clock: ManualClock, taken: Set<String> = []) {
        self.clock = clock
        self.taken = taken
    }

    var names: [String] { calls.withLock { $0.map(\.0) } }
    var times: [Duration] { calls.withLock { $0.map(\.1) } }

    func check(_ name: String) -> UsernameAvailability {
        calls.withLock { $0.append((name, clock.now.offset)) }
        let free = !taken.contains(name.lowercased())
        return UsernameAvailability(username: name, available: free, reason: free ? nil : .duplicated)
    }
}

/// The states a checker has shown so far.
final class ShownStates: Sendable {
    private let states = Mutex<[UsernameChecker<ManualClock>.State]>([])
    func append(_ state: UsernameChecker<ManualClock>.State) { states.withLock { $0.append(state) } }
    func withLock<T>(_ body: ([UsernameChecker<ManualClock>.State]) -> T) -> T { states.withLock { body($0) } }
}

    /// Feeds text-field values to a checker and reads the states it shows.
    final class Field: Sendable {
        let clock = ManualClock()
        let recorder: AvailabilityRecorder
        let typed: AsyncStream<String>.Continuation
        let shown = ShownStates()
        let task: Task<Void, Never>

        init(taken: Set<String> = []) {
            let recorder = AvailabilityRecorder(clock: clock, taken: taken)
            self.recorder = recorder
            let checker = UsernameChecker(pause: .milliseconds(400), clock: clock) { recorder.check($0) }
            let (input, typed) = AsyncStream.makeStream(of: String.self)
            self.typed = typed
            let states = checker.states(for: input)
            let shown = self.shown
            task = Task {
                for await state in states { shown.append(state) }
            }
        }

        func type(_ text: String) async {
            let before = shown.withLock { $0.count }
            typed.yield(text)
            await until { $0.count > before }
        }

        /// Lets virtual time pass in small steps until `condition` holds.
        func advance(until condition: @escaping ([UsernameChecker<ManualClock>.State]) -> Bool) async {
            for _ in 0..<2_000 {
                if shown.withLock({ condition($0) }) { return }
                clock.advance(by: .milliseconds(10))
                await Task.yield()
            }
            Issue.record("gave up waiting; shown so far: \(shown.withLock { $0 })")
        }

        /// Waits, without moving time, until `condition` holds.
        func until(_ condition: @escaping ([UsernameChecker<ManualClock>.State]) -> Bool) async {
            for _ in 0..<100_000 {
                if shown.withLock({ condition($0) }) { return }
                await Task.yield()
            }
            Issue.record("gave up waiting; shown so far: \(shown.withLock { $0 })")
        }

        var last: UsernameChecker<ManualClock>.State? { shown.withLock { $0.last } }
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
        field.task.cancel()
    }

    @Test("availability is asked once typing pauses for 400 ms, for the last text only")
    func debounced() async {
        let field = Field()
        for text in ["mi", "min", "mina", "minah"] { await field.type(text) }
        #expect(field.recorder.names.isEmpty)
        await field.advance { $0.last == .available("minah") }
        #expect(field.recorder.names == ["minah"])
        #expect(field.recorder.times.allSatisfy { $0 >= .milliseconds(400) })
        field.task.cancel()
    }

    @Test("text that breaks a format rule is never sent for an availability check")
    func invalidNeverAsked() async {
        let field = Field()
        await field.type("a")
        await field.type("mina-1")
        for _ in 0..<100 { field.clock.advance(by: .milliseconds(10)) }
        await field.type("mina_1")
        await field.advance { $0.last == .available("mina_1") }
        #expect(field.recorder.names == ["mina_1"])
        field.task.cancel()
    }

    @Test("a name someone holds is shown as duplicated")
    func duplicated() async {
        let field = Field(taken: ["mina"])
        await field.type("Mina")
        await field.advance { $0.last == .unavailable("Mina", .duplicated) }
        #expect(field.recorder.names == ["Mina"])
        field.task.cancel()
    }

    @Test("each pause asks again for what is there then")
    func eachPause() async {
        let field = Field()
        await field.type("mina")
        await field.advance { $0.last == .available("mina") }
        await field.type("minji")
        await field.advance { $0.last == .available("minji") }
        #expect(field.recorder.names == ["mina", "minji"])
        field.task.cancel()
    }
}
