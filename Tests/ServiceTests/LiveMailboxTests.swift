import Foundation
import Messaging
import PropertyBased
@testable import ServiceRuntime
import Synchronization
import Testing

/// `LiveMailbox`, the bounded queue between an event feed's live subscription and its follower:
/// events come out oldest first and the newest are dropped when it is full; a wait ends exactly
/// once, with `ready` (an event or a wake-up), `finished` (ended and empty) or `timedOut` (the
/// timeout or cancellation); a wake-up with nobody waiting is kept for the next wait.
@Suite("LiveMailbox: the event feed's live queue", .timeLimit(.minutes(1)))
struct LiveMailboxTests {
    /// Long enough that no wait in these tests ends by timing out unless it means to.
    static let forever = Duration.seconds(3_600)

    static func event(_ sequence: UInt64) -> Message {
        Message(
            topic: "test.event", header: EnvelopeHeader(type: "test.event", source: "test", sequence: sequence),
            body: Data("{}".utf8))
    }

    static func sequences(_ messages: [Message]) -> [UInt64] { messages.map(\.header.sequence) }

    @Test("queued events make a wait ready at once and come out oldest first, at most the count asked")
    func oldestFirst() async {
        let mailbox = LiveMailbox(capacity: 10)
        #expect(mailbox.isEmpty)
        for sequence in 1...3 { mailbox.push(Self.event(UInt64(sequence))) }
        #expect(!mailbox.isEmpty)
        #expect(await mailbox.wait(timeout: Self.forever) == .ready)
        #expect(Self.sequences(mailbox.take(max: 2)) == [1, 2])
        #expect(Self.sequences(mailbox.take(max: 5)) == [3])
        #expect(mailbox.take(max: 5).isEmpty)
        #expect(mailbox.isEmpty)
    }

    @Test("when the queue is full the newest events are dropped")
    func dropsTheNewest() {
        let mailbox = LiveMailbox(capacity: 2)
        for sequence in 1...5 { mailbox.push(Self.event(UInt64(sequence))) }
        #expect(Self.sequences(mailbox.take(max: 10)) == [1, 2])
        mailbox.push(Self.event(6))
        #expect(Self.sequences(mailbox.take(max: 10)) == [6], "room again once taken")
    }

    @Test("a capacity below one holds one event")
    func capacityAtLeastOne() {
        let mailbox = LiveMailbox(capacity: 0)
        mailbox.push(Self.event(1))
        mailbox.push(Self.event(2))
        #expect(Self.sequences(mailbox.take(max: 10)) == [1])
    }

    @Test("a push wakes the task waiting with nothing queued")
    func pushWakesTheWaiter() async {
        let mailbox = LiveMailbox(capacity: 4)
        async let wake = mailbox.wait(timeout: Self.forever)
        mailbox.push(Self.event(1))
        #expect(await wake == .ready)
        #expect(Self.sequences(mailbox.take(max: 4)) == [1])
    }

    @Test("a wake-up ends the wait with ready even with nothing queued")
    func wakeWithNothingQueued() async {
        let mailbox = LiveMailbox(capacity: 4)
        async let wake = mailbox.wait(timeout: Self.forever)
        mailbox.wake()
        #expect(await wake == .ready)
        #expect(mailbox.isEmpty)
    }

    @Test("a wake-up with nobody waiting is kept for the next wait, and for that one only")
    func wakeIsKeptOnce() async {
        let mailbox = LiveMailbox(capacity: 4)
        mailbox.wake()
        mailbox.wake()
        #expect(await mailbox.wait(timeout: Self.forever) == .ready)
        #expect(await mailbox.wait(timeout: .zero) == .timedOut, "two wake-ups before a wait count as one")
    }

    @Test("with nothing queued and no wake-up, the wait times out")
    func timesOut() async {
        let mailbox = LiveMailbox(capacity: 4)
        #expect(await mailbox.wait(timeout: .milliseconds(1)) == .timedOut)
        #expect(await mailbox.wait(timeout: .zero) == .timedOut)
        // A timed-out wait leaves nothing behind: the next push makes the next wait ready.
        mailbox.push(Self.event(1))
        #expect(await mailbox.wait(timeout: Self.forever) == .ready)
    }

    @Test("finishing ends the wait with finished, but only after the queued events")
    func finishAfterQueued() async {
        let mailbox = LiveMailbox(capacity: 4)
        mailbox.push(Self.event(1))
        mailbox.finish()
        #expect(await mailbox.wait(timeout: Self.forever) == .ready, "a queued event comes before the end")
        #expect(Self.sequences(mailbox.take(max: 4)) == [1])
        #expect(await mailbox.wait(timeout: Self.forever) == .finished)
        #expect(await mailbox.wait(timeout: Self.forever) == .finished, "and stays finished")
    }

    @Test("finishing wakes the task waiting with finished")
    func finishWakesTheWaiter() async {
        let mailbox = LiveMailbox(capacity: 4)
        async let wake = mailbox.wait(timeout: Self.forever)
        mailbox.finish()
        #expect(await wake == .finished)
    }

    @Test("cancelling the waiting task ends its wait with timedOut, and leaves the mailbox working")
    func cancellationEndsTheWait() async {
        let mailbox = LiveMailbox(capacity: 4)
        let waiter = Task { await mailbox.wait(timeout: Self.forever) }
        waiter.cancel()
        #expect(await waiter.value == .timedOut)
        mailbox.push(Self.event(1))
        #expect(await mailbox.wait(timeout: Self.forever) == .ready)
    }

    @Test("a task cancelled before it waits times out at once when nothing is queued, and is ready when something is")
    func cancelledBeforeWaiting() async {
        let mailbox = LiveMailbox(capacity: 4)
        let empty = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return await mailbox.wait(timeout: Self.forever)
        }
        #expect(await empty.value == .timedOut)
        mailbox.push(Self.event(1))
        let full = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return await mailbox.wait(timeout: Self.forever)
        }
        #expect(await full.value == .ready)
    }

    @Test("a wait raced by push, wake, finish and cancellation ends exactly once, and the event stays queued")
    func racedWaitEndsOnce() async {
        for round in 0..<300 {
            let mailbox = LiveMailbox(capacity: 4)
            let waiter = Task { await mailbox.wait(timeout: Self.forever) }
            await withTaskGroup(of: Void.self) { group in
                group.addTask { mailbox.push(Self.event(UInt64(round))) }
                group.addTask { mailbox.wake() }
                group.addTask { mailbox.finish() }
                group.addTask { waiter.cancel() }
            }
            _ = await waiter.value
            // Whoever ended the wait, the event was queued and nothing took it.
            #expect(await mailbox.wait(timeout: Self.forever) == .ready)
            #expect(Self.sequences(mailbox.take(max: 4)) == [UInt64(round)])
            #expect(await mailbox.wait(timeout: Self.forever) == .finished)
        }
    }

    @Test("a follower that waits and takes sees every pushed event in order, then the end, whatever the interleaving")
    func followerSeesEverything() async {
        await propertyCheck(count: 100, input: Gen.int(in: 1...200), Gen.int(in: 1...16)) { count, page in
            let mailbox = LiveMailbox(capacity: 1_000)
            let producer = Task.detached {
                for sequence in 1...count {
                    mailbox.push(Self.event(UInt64(sequence)))
                    if sequence.isMultiple(of: 7) { mailbox.wake() }
                }
                mailbox.finish()
            }
            var seen: [UInt64] = []
            following: while true {
                switch await mailbox.wait(timeout: Self.forever) {
                case .ready: seen += Self.sequences(mailbox.take(max: page))
                case .finished: break following
                case .timedOut: Issue.record("a wait timed out")
                }
            }
            await producer.value
            #expect(seen == (1...count).map(UInt64.init))
        }
    }

    @Test("a follower behind a small queue sees the oldest event and only events in order, never one twice")
    func smallQueueDropsButKeepsOrder() async {
        await propertyCheck(count: 100, input: Gen.int(in: 1...200), Gen.int(in: 1...8)) { count, capacity in
            let mailbox = LiveMailbox(capacity: capacity)
            let producer = Task.detached {
                for sequence in 1...count { mailbox.push(Self.event(UInt64(sequence))) }
                mailbox.finish()
            }
            var seen: [UInt64] = []
            following: while true {
                switch await mailbox.wait(timeout: Self.forever) {
                case .ready: seen += Self.sequences(mailbox.take(max: 1))
                case .finished: break following
                case .timedOut: Issue.record("a wait timed out")
                }
            }
            await producer.value
            #expect(seen.first == 1, "the first event always finds room")
            #expect(zip(seen, seen.dropFirst()).allSatisfy { $0 < $1 }, "in order and never twice: \(seen)")
            #expect(seen.count <= count)
        }
    }
}
