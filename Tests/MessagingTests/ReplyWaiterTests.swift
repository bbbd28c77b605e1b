import Foundation
import Messaging
import Synchronization
import Testing

/// `ReplyWaiter`, the one-shot wait for a reply that both buses use: the first result wins and
/// is delivered exactly once whether it comes before or after the continuation is installed;
/// later results are refused; finish actions run once; cancellation is just another result.
@Suite("ReplyWaiter: one result, delivered exactly once", .timeLimit(.minutes(1)))
struct ReplyWaiterTests {
    /// A count that tasks share by reference.
    final class Count: Sendable {
        private let atomic = Atomic(0)
        func add() { atomic.add(1, ordering: .relaxed) }
        var value: Int { atomic.load(ordering: .relaxed) }
    }

    struct Failure: Error, Equatable {
        var number: Int
    }

    /// A message whose header id names `number`, to tell results apart.
    static func message(_ number: Int) -> Message {
        Message(header: EnvelopeHeader(id: "m\(number)", type: "test.reply", source: "test"), body: Data("{}".utf8))
    }

    /// Installs a continuation in `waiter`, runs `afterInstall`, and returns what it is resumed with.
    static func outcome(
        _ waiter: ReplyWaiter, afterInstall: @escaping @Sendable () -> Void = {}
    ) async -> Result<Message, any Error> {
        do {
            let message = try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Message, any Error>) in
                waiter.install(continuation)
                afterInstall()
            }
            return .success(message)
        } catch {
            return .failure(error)
        }
    }

    @Test("a reply that arrives after the continuation is installed resumes the caller with it")
    func replyAfterInstall() async throws {
        let waiter = ReplyWaiter()
        let won = Atomic(false)
        let result = await Self.outcome(waiter) { won.store(waiter.resume(returning: Self.message(1)), ordering: .relaxed) }
        #expect(try result.get().header.id == "m1")
        #expect(won.load(ordering: .relaxed) == true, "the reply was the first result")
        #expect(waiter.isFinished)
    }

    @Test("a reply that arrives before the continuation is installed is kept and delivered on install")
    func replyBeforeInstall() async throws {
        let waiter = ReplyWaiter()
        #expect(!waiter.isFinished)
        #expect(waiter.resume(returning: Self.message(2)))
        #expect(waiter.isFinished, "a kept result counts as finished")
        let result = await Self.outcome(waiter)
        #expect(try result.get().header.id == "m2")
    }

    @Test("a failure is thrown to the caller, before or after install")
    func failureIsThrown() async {
        let early = ReplyWaiter()
        early.resume(throwing: Failure(number: 1))
        let earlyResult = await Self.outcome(early)
        #expect(throws: Failure(number: 1)) { try earlyResult.get() }

        let late = ReplyWaiter()
        let lateResult = await Self.outcome(late) { late.resume(throwing: Failure(number: 2)) }
        #expect(throws: Failure(number: 2)) { try lateResult.get() }
    }

    @Test("only the first result is delivered; every later one is refused with false")
    func firstResultWins() async throws {
        let waiter = ReplyWaiter()
        let refusals = Mutex<[Bool]>([])
        let result = await Self.outcome(waiter) {
            let first = waiter.resume(returning: Self.message(1))
            let second = waiter.resume(returning: Self.message(2))
            let third = waiter.resume(throwing: Failure(number: 3))
            let fourth = waiter.finish(.success(Self.message(4)))
            refusals.withLock { $0 = [first, second, third, fourth] }
        }
        #expect(refusals.withLock { $0 } == [true, false, false, false])
        #expect(try result.get().header.id == "m1")
    }

    @Test("results after an early one are refused, and the early one is what the caller gets")
    func earlyResultIsNotReplaced() async throws {
        let waiter = ReplyWaiter()
        #expect(waiter.resume(throwing: Failure(number: 1)))
        #expect(!waiter.resume(returning: Self.message(2)))
        #expect(!waiter.resume(throwing: Failure(number: 3)))
        let result = await Self.outcome(waiter)
        #expect(throws: Failure(number: 1)) { try result.get() }
    }

    @Test("finish actions wait for the result, then run once each, in the order they were added")
    func finishActionsRunOnce() async throws {
        let waiter = ReplyWaiter()
        let ran = Mutex<[Int]>([])
        waiter.onFinish { ran.withLock { $0.append(1) } }
        waiter.onFinish { ran.withLock { $0.append(2) } }
        #expect(ran.withLock { $0 }.isEmpty, "no action runs before a result")
        let result = await Self.outcome(waiter) {
            waiter.resume(returning: Self.message(1))
            waiter.resume(returning: Self.message(2))
            waiter.resume(throwing: Failure(number: 3))
        }
        _ = try result.get()
        #expect(ran.withLock { $0 } == [1, 2])
    }

    @Test("a finish action added after the result runs at once, and only once")
    func lateFinishActionRunsAtOnce() {
        let waiter = ReplyWaiter()
        waiter.resume(throwing: Failure(number: 1))
        let runs = Atomic(0)
        waiter.onFinish { runs.add(1, ordering: .relaxed) }
        #expect(runs.load(ordering: .relaxed) == 1)
        waiter.resume(throwing: Failure(number: 2))
        #expect(runs.load(ordering: .relaxed) == 1)
    }

    @Test("a finish action runs when the result is kept early too, before any continuation exists")
    func finishActionRunsOnEarlyResult() async throws {
        let waiter = ReplyWaiter()
        let runs = Atomic(0)
        waiter.onFinish { runs.add(1, ordering: .relaxed) }
        waiter.resume(returning: Self.message(1))
        #expect(runs.load(ordering: .relaxed) == 1)
        let result = await Self.outcome(waiter)
        #expect(try result.get().header.id == "m1")
        #expect(runs.load(ordering: .relaxed) == 1)
    }

    @Test("cancelling the caller finishes the wait with CancellationError, and a late reply is refused")
    func cancellationIsAResult() async throws {
        let waiter = ReplyWaiter()
        let (installed, signal) = AsyncStream.makeStream(of: Void.self)
        let caller = Task {
            await withTaskCancellationHandler {
                await Self.outcome(waiter) { signal.yield() }
            } onCancel: {
                waiter.resume(throwing: CancellationError())
            }
        }
        for await _ in installed { break }
        caller.cancel()
        let result = await caller.value
        #expect(throws: CancellationError.self) { try result.get() }
        #expect(!waiter.resume(returning: Self.message(1)), "the reply after cancellation is late")
    }

    @Test("a caller cancelled before it installs still gets CancellationError, once")
    func cancelledBeforeInstall() async throws {
        let waiter = ReplyWaiter()
        let (started, signal) = AsyncStream.makeStream(of: Void.self)
        let (go, release) = AsyncStream.makeStream(of: Void.self)
        let caller = Task {
            signal.yield()
            for await _ in go { break }
            return await withTaskCancellationHandler {
                await Self.outcome(waiter)
            } onCancel: {
                waiter.resume(throwing: CancellationError())
            }
        }
        for await _ in started { break }
        caller.cancel()
        release.yield()
        let result = await caller.value
        #expect(throws: CancellationError.self) { try result.get() }
    }

    @Test("of many finishers racing, exactly one wins and its result is the one delivered")
    func racingFinishersOneWinner() async throws {
        for _ in 0..<200 {
            let waiter = ReplyWaiter()
            let actionRuns = Atomic(0)
            waiter.onFinish { actionRuns.add(1, ordering: .relaxed) }
            let caller = Task { await Self.outcome(waiter) }
            let winners = await withTaskGroup(of: Int?.self) { group in
                for number in 0..<8 {
                    group.addTask {
                        let won = number.isMultiple(of: 2)
                            ? waiter.resume(returning: Self.message(number))
                            : waiter.resume(throwing: Failure(number: number))
                        return won ? number : nil
                    }
                }
                var winners: [Int] = []
                for await winner in group { if let winner { winners.append(winner) } }
                return winners
            }
            try #require(winners.count == 1)
            let winner = winners[0]
            switch await caller.value {
            case .success(let message): #expect(message.header.id == "m\(winner)")
            case .failure(let error): #expect(error as? Failure == Failure(number: winner))
            }
            #expect(actionRuns.load(ordering: .relaxed) == 1)
        }
    }

    @Test("install racing the result on other threads delivers it exactly once")
    func installRacesResult() async throws {
        for number in 0..<300 {
            let waiter = ReplyWaiter()
            async let caller = Self.outcome(waiter)
            let finisher = Task.detached { waiter.resume(returning: Self.message(number)) }
            #expect(await finisher.value)
            let result = await caller
            #expect(try result.get().header.id == "m\(number)")
        }
    }

    @Test("a finish action added while the result arrives runs exactly once")
    func onFinishRacesFinish() async {
        for _ in 0..<300 {
            let waiter = ReplyWaiter()
            let runs = Count()
            await withTaskGroup(of: Void.self) { group in
                group.addTask { waiter.onFinish { runs.add() } }
                group.addTask { waiter.resume(throwing: Failure(number: 0)) }
                group.addTask { waiter.onFinish { runs.add() } }
            }
            #expect(runs.value == 2)
        }
    }
}
