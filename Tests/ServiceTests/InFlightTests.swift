import Foundation
import Messaging
import PropertyBased
@testable import ServiceRuntime
import Synchronization
import Testing

/// `InFlight`, the request server's count of work in flight: it admits at most `limit` requests
/// at once and holds the rest back until a release, refuses everything once draining begins, counts
/// a tracked request until its first reply only, and says "drained" once (when draining with
/// nothing running or unanswered) or when the waiting task is cancelled.
@Suite("InFlight: the request server's admission and drain", .timeLimit(.minutes(1)))
struct InFlightTests {
    /// A flag that tasks share by reference.
    final class Flag: Sendable {
        private let atomic = Atomic(false)
        func set() { atomic.store(true, ordering: .releasing) }
        var isSet: Bool { atomic.load(ordering: .acquiring) }
    }

    /// A count that tasks share by reference.
    final class Count: Sendable {
        private let atomic = Atomic(0)
        @discardableResult
        func add() -> Int { atomic.add(1, ordering: .sequentiallyConsistent).newValue }
        func subtract() { atomic.subtract(1, ordering: .sequentiallyConsistent) }
        func raise(to value: Int) { atomic.max(value, ordering: .sequentiallyConsistent) }
        var value: Int { atomic.load(ordering: .sequentiallyConsistent) }
    }

    /// A raw request whose replies are counted.
    static func counted(_ replies: Count) -> RawRequest {
        RawRequest(body: Data("{}".utf8), attachment: nil) { _ in replies.add() }
    }

    static let reply = OutgoingMessage(body: Data("{}".utf8))

    /// Waits for the drain, then says whether `flag` was set by then. Run it as a child task
    /// (`async let`), so that the suite's time limit cancels a drain that never comes.
    static func drained(_ work: InFlight, after flag: Flag) async -> Bool {
        await work.waitUntilDrained()
        return flag.isSet
    }

    @Test("up to the limit are admitted at once")
    func admitsUpToTheLimit() async {
        let work = InFlight(limit: 3)
        for _ in 0..<3 { #expect(await work.acquire()) }
        #expect(!work.isDraining)
    }

    @Test("a request beyond the limit is admitted only after a release")
    func holdsBeyondTheLimit() async {
        let work = InFlight(limit: 2)
        #expect(await work.acquire())
        #expect(await work.acquire())
        let released = Flag()
        let third = Task { () -> (admitted: Bool, afterRelease: Bool) in
            let admitted = await work.acquire()
            return (admitted, released.isSet)
        }
        released.set()
        work.release()
        let outcome = await third.value
        #expect(outcome.admitted)
        #expect(outcome.afterRelease, "admitted while both slots were taken")
    }

    @Test("once draining, a request is refused at once even with room")
    func drainingRefuses() async {
        let work = InFlight(limit: 5)
        work.beginDraining()
        #expect(work.isDraining)
        #expect(await work.acquire() == false)
    }

    @Test("draining refuses every request waiting for room, and a later release admits none")
    func drainingRefusesTheWaiting() async {
        let work = InFlight(limit: 1)
        #expect(await work.acquire())
        let drained = Flag()
        let answers = await withTaskGroup(of: (Bool, Bool).self) { group in
            for _ in 0..<5 {
                group.addTask {
                    let admitted = await work.acquire()
                    return (admitted, drained.isSet)
                }
            }
            drained.set()
            work.beginDraining()
            work.release()
            var answers: [(Bool, Bool)] = []
            for await answer in group { answers.append(answer) }
            return answers
        }
        #expect(answers.count == 5)
        for (admitted, afterDraining) in answers {
            #expect(!admitted)
            #expect(afterDraining, "answered only once draining began")
        }
    }

    @Test("with nothing in flight, the drain waits for draining to begin")
    func drainWaitsForDraining() async {
        let work = InFlight(limit: 1)
        let began = Flag()
        async let sawFlag = Self.drained(work, after: began)
        began.set()
        work.beginDraining()
        #expect(await sawFlag)
    }

    @Test("the drain waits for every admitted request to be released")
    func drainWaitsForReleases() async {
        let work = InFlight(limit: 3)
        for _ in 0..<3 { #expect(await work.acquire()) }
        work.beginDraining()
        let lastReleased = Flag()
        async let sawFlag = Self.drained(work, after: lastReleased)
        work.release()
        work.release()
        lastReleased.set()
        work.release()
        #expect(await sawFlag)
    }

    @Test("a drain that is already complete returns at once, however often it is asked")
    func drainedAlready() async {
        let work = InFlight(limit: 1)
        #expect(await work.acquire())
        work.release()
        work.beginDraining()
        await work.waitUntilDrained()
        await work.waitUntilDrained()
    }

    @Test("a tracked request holds the drain until its first reply, which alone is passed on")
    func trackedUntilFirstReply() async {
        let work = InFlight(limit: 1)
        let replies = Count()
        let tracked = work.tracking(Self.counted(replies))
        work.beginDraining()
        let answered = Flag()
        async let sawFlag = Self.drained(work, after: answered)
        answered.set()
        tracked.reply(Self.reply)
        #expect(await sawFlag, "drained before the tracked request was answered")
        tracked.reply(Self.reply)
        tracked.reply(Self.reply)
        #expect(replies.value == 1, "only the first reply reaches the caller")
    }

    @Test("extra replies to a tracked request do not count for others still unanswered")
    func extraRepliesDoNotCountTwice() async {
        let work = InFlight(limit: 1)
        let replies = Count()
        let first = work.tracking(Self.counted(replies))
        let second = work.tracking(Self.counted(replies))
        work.beginDraining()
        let secondAnswered = Flag()
        async let sawFlag = Self.drained(work, after: secondAnswered)
        first.reply(Self.reply)
        first.reply(Self.reply)
        first.reply(Self.reply)
        secondAnswered.set()
        second.reply(Self.reply)
        #expect(await sawFlag, "the first request's extra replies drained the second's count")
        #expect(replies.value == 2)
    }

    @Test("the drain waits for both the running and the unanswered, whichever finishes last", arguments: [true, false])
    func drainWaitsForRunningAndUnanswered(releaseFirst: Bool) async {
        let work = InFlight(limit: 1)
        let replies = Count()
        #expect(await work.acquire())
        let tracked = work.tracking(Self.counted(replies))
        work.beginDraining()
        let last = Flag()
        async let sawFlag = Self.drained(work, after: last)
        if releaseFirst {
            work.release()
            last.set()
            tracked.reply(Self.reply)
        } else {
            tracked.reply(Self.reply)
            last.set()
            work.release()
        }
        #expect(await sawFlag, "drained before the last of them finished")
    }

    @Test("cancelling the task that waits for the drain ends the wait, drained or not")
    func cancelledDrainWait() async {
        let work = InFlight(limit: 1)
        #expect(await work.acquire())
        let waiter = Task { await work.waitUntilDrained() }
        waiter.cancel()
        await waiter.value
        #expect(!work.isDraining)

        let alreadyCancelled = InFlight(limit: 1)
        #expect(await alreadyCancelled.acquire())
        let early = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            await alreadyCancelled.waitUntilDrained()
        }
        await early.value
    }

    @Test("racing requests never exceed the limit, and all are admitted and drained")
    func racingRequestsStayWithinTheLimit() async {
        await propertyCheck(count: 60, input: Gen.int(in: 1...4), Gen.int(in: 1...60)) { limit, requests in
            let work = InFlight(limit: limit)
            let running = Count()
            let most = Count()
            let admitted = Count()
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<requests {
                    group.addTask {
                        guard await work.acquire() else { return }
                        admitted.add()
                        let now = running.add()
                        most.raise(to: now)
                        await Task.yield()
                        running.subtract()
                        work.release()
                    }
                }
            }
            #expect(most.value <= limit)
            #expect(admitted.value == requests)
            work.beginDraining()
            await work.waitUntilDrained()
        }
    }

    @Test("draining during a rush: every request is admitted or refused once, and the drain waits for the admitted")
    func drainingDuringARush() async {
        await propertyCheck(count: 60, input: Gen.int(in: 1...3), Gen.int(in: 1...40), Gen.int(in: 0...40)) {
            limit, requests, drainAfter in
            let work = InFlight(limit: limit)
            let admitted = Count()
            let refused = Count()
            let running = Count()
            let drainedWhileRunning = Flag()
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    await work.waitUntilDrained()
                    if running.value != 0 { drainedWhileRunning.set() }
                }
                for number in 0..<requests {
                    if number == drainAfter { work.beginDraining() }
                    group.addTask {
                        guard await work.acquire() else {
                            refused.add()
                            return
                        }
                        admitted.add()
                        running.add()
                        await Task.yield()
                        running.subtract()
                        work.release()
                    }
                }
                if drainAfter >= requests { work.beginDraining() }
            }
            #expect(admitted.value + refused.value == requests)
            #expect(!drainedWhileRunning.isSet, "drained with a request still running")
        }
    }
}
