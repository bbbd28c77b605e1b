import Foundation
import Messaging
import Synchronization
import Testing
@testable import ZeroMQMessaging

/// `CommandQueue`, the mailbox between async callers and the ZeroMQ bus's I/O thread, driven
/// directly with a thread of the test's own playing the I/O thread: commands come out once each
/// and in order, a burst costs one eventfd wake-up, commands from the I/O thread itself wake
/// nothing, shutdown closes the queue once, and no wake-up is lost under racing producers.
@Suite("CommandQueue: the mailbox to the ZeroMQ I/O thread", .timeLimit(.minutes(1)))
struct CommandQueueTests {
    /// A flag that tasks share by reference.
    final class Flag: Sendable {
        let value = Atomic(false)
    }

    /// A command that names `number` (`cancelRequest` carries nothing but an id).
    static func command(_ number: UInt64) -> Command { .cancelRequest(id: number) }

    /// What the commands are: their numbers, and "shutdown" for `.shutdown`.
    static func labels(_ commands: [Command]) -> [String] {
        commands.map { command in
            switch command {
            case .cancelRequest(let id): "\(id)"
            case .shutdown: "shutdown"
            default: "other"
            }
        }
    }

    /// Whether a wake-up is pending on the eventfd, without consuming it.
    static func wakePending(_ queue: CommandQueue) -> Bool {
        var item = pollfd(fd: queue.wakeFD, events: Int16(POLLIN), revents: 0)
        return poll(&item, 1, 0) == 1 && item.revents & Int16(POLLIN) != 0
    }

    /// Consumes the eventfd and returns its counter: how many times producers wrote it.
    static func drainWakeCounter(_ queue: CommandQueue) -> UInt64 {
        var counter: UInt64 = 0
        let count = read(queue.wakeFD, &counter, MemoryLayout<UInt64>.size)
        return count == MemoryLayout<UInt64>.size ? counter : 0
    }

    /// Runs `body` on a new thread of its own (the I/O thread's stand-in) and returns its result.
    static func onThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            let thread = Thread { continuation.resume(returning: body()) }
            thread.start()
        }
    }

    @Test("commands from other threads come out in submission order, each once, and the queue is then empty")
    func submissionOrder() {
        let queue = CommandQueue()
        for number in 1...5 { #expect(queue.submit(Self.command(UInt64(number)))) }
        #expect(Self.labels(queue.takeCommands()) == ["1", "2", "3", "4", "5"])
        #expect(queue.takeCommands().isEmpty)
        #expect(queue.takeLocalCommands().isEmpty)
    }

    @Test("a burst of commands writes the eventfd once")
    func burstWakesOnce() {
        let queue = CommandQueue()
        #expect(!Self.wakePending(queue))
        for number in 1...100 { queue.submit(Self.command(UInt64(number))) }
        #expect(Self.drainWakeCounter(queue) == 1)
        #expect(queue.takeCommands().count == 100)
    }

    @Test("once the I/O thread has taken the commands, the next one wakes it again")
    func wakesAgainAfterTaking() {
        let queue = CommandQueue()
        queue.submit(Self.command(1))
        #expect(Self.wakePending(queue))
        #expect(Self.labels(queue.takeCommands()) == ["1"])
        #expect(!Self.wakePending(queue), "taking consumes the wake-up")
        queue.submit(Self.command(2))
        #expect(Self.wakePending(queue))
        #expect(Self.labels(queue.takeCommands()) == ["2"])
    }

    @Test("a command submitted while a wake-up is unread but before the take goes out with that take")
    func commandAfterReadBeforeSwap() {
        let queue = CommandQueue()
        queue.submit(Self.command(1))
        // The I/O thread has read the eventfd (as `takeCommands` does first) but not swapped yet:
        // a producer still sees the wake-up pending and writes nothing.
        #expect(Self.drainWakeCounter(queue) == 1)
        queue.submit(Self.command(2))
        #expect(!Self.wakePending(queue))
        #expect(Self.labels(queue.takeCommands()) == ["1", "2"])
        queue.submit(Self.command(3))
        #expect(Self.wakePending(queue), "after the swap, the next producer writes again")
    }

    @Test("commands submitted on the I/O thread wake nothing and come out of takeLocalCommands, in order")
    func localCommands() async {
        let queue = CommandQueue()
        let (woke, taken, local, again) = await Self.onThread { () -> (Bool, [String], [String], [String]) in
            queue.adoptLoopThread(send: { _ in })
            for number in 1...3 { queue.submit(Self.command(UInt64(number))) }
            return (
                Self.wakePending(queue), Self.labels(queue.takeCommands()), Self.labels(queue.takeLocalCommands()),
                Self.labels(queue.takeLocalCommands())
            )
        }
        #expect(!woke)
        #expect(taken.isEmpty)
        #expect(local == ["1", "2", "3"])
        #expect(again.isEmpty, "taking empties the local queue")
    }

    @Test("on the I/O thread, a reply or an event with nothing queued before it is sent at once; otherwise it queues in order")
    func sendsAtOnce() async {
        let queue = CommandQueue()
        let (sentFirst, queued, sentLater, fromOthers) = await Self.onThread {
            () -> ([String], [String], [String], [String]) in
            let sent = Mutex<[String]>([])
            queue.adoptLoopThread(send: { command in sent.withLock { $0.append(Self.sendLabel(command)) } })
            queue.submit(.publish(id: 1, message: OutgoingMessage(topic: "a", body: Data())))
            let sentFirst = sent.withLock { $0 }
            // Behind a command that waits for the loop, an event waits too, in order.
            queue.submit(Self.command(7))
            queue.submit(.publish(id: 1, message: OutgoingMessage(topic: "b", body: Data())))
            let local = queue.takeLocalCommands().map(Self.sendLabel)
            // Nothing queued again: the next one goes at once.
            queue.submit(.reply(serverID: 2, route: [], message: OutgoingMessage(body: Data())))
            // While the loop carries out commands it has taken, the rest of them came first: an
            // event submitted by one of them queues behind them.
            var carried: [String] = []
            queue.carryOut([Self.command(9), Self.command(10)]) { command in
                carried.append(Self.sendLabel(command))
                if carried.count == 1 { queue.submit(.publish(id: 1, message: OutgoingMessage(topic: "d", body: Data()))) }
            }
            carried += queue.takeLocalCommands().map(Self.sendLabel)
            let sentLater = sent.withLock { $0 }
            return (sentFirst, local + carried, sentLater, Self.labels(queue.takeCommands()))
        }
        #expect(sentFirst == ["publish a"])
        #expect(queued == ["7", "publish b", "9", "10", "publish d"])
        #expect(sentLater == ["publish a", "reply"])
        #expect(fromOthers.isEmpty)
        // While commands from other threads wait, an event from the loop queues behind them.
        queue.submit(Self.command(8))
        let (taken, sentBehind) = await Self.onThread { () -> ([String], Int) in
            let sent = Mutex(0)
            queue.adoptLoopThread(send: { _ in sent.withLock { $0 += 1 } })
            queue.submit(.publish(id: 1, message: OutgoingMessage(topic: "c", body: Data())))
            return (queue.takeCommands().map(Self.sendLabel), sent.withLock { $0 })
        }
        #expect(taken == ["8", "publish c"])
        #expect(sentBehind == 0)
    }

    static func sendLabel(_ command: Command) -> String {
        switch command {
        case .publish(_, let message): "publish \(message.topic ?? "")"
        case .reply: "reply"
        case .cancelRequest(let id): "\(id)"
        default: "other"
        }
    }

    @Test("a command from the I/O thread queues behind commands from other threads that are waiting")
    func localQueuesBehindWaiting() async {
        let queue = CommandQueue()
        queue.submit(Self.command(1))
        queue.submit(Self.command(2))
        let (taken, local, laterLocal) = await Self.onThread { () -> ([String], [String], [String]) in
            queue.adoptLoopThread(send: { _ in })
            queue.submit(Self.command(3))
            let taken = Self.labels(queue.takeCommands())
            let local = Self.labels(queue.takeLocalCommands())
            // Nothing waits now: the next one from this thread is local again.
            queue.submit(Self.command(4))
            return (taken, local, Self.labels(queue.takeLocalCommands()))
        }
        #expect(taken == ["1", "2", "3"])
        #expect(local.isEmpty)
        #expect(laterLocal == ["4"])
    }

    @Test("once shutdown is requested, submit refuses from any thread and shutdown is queued once, last")
    func shutdownClosesOnce() async {
        let queue = CommandQueue()
        #expect(queue.submit(Self.command(1)))
        queue.requestShutdown(waiter: nil)
        #expect(!queue.submit(Self.command(2)))
        queue.requestShutdown(waiter: nil)
        #expect(Self.drainWakeCounter(queue) == 1, "a wake-up already pending is not written again")
        let (refusedOnLoop, taken, local) = await Self.onThread { () -> (Bool, [String], [String]) in
            queue.adoptLoopThread(send: { _ in })
            let accepted = queue.submit(Self.command(3))
            return (!accepted, Self.labels(queue.takeCommands()), Self.labels(queue.takeLocalCommands()))
        }
        #expect(refusedOnLoop)
        #expect(taken == ["1", "shutdown"])
        #expect(local.isEmpty)
        queue.requestShutdown(waiter: nil)
        #expect(queue.takeCommands().isEmpty, "shutdown is queued only once")
    }

    @Test("shutdown on an idle queue wakes the I/O thread")
    func shutdownWakes() {
        let queue = CommandQueue()
        queue.requestShutdown(waiter: nil)
        #expect(Self.wakePending(queue))
        #expect(Self.labels(queue.takeCommands()) == ["shutdown"])
    }

    @Test("shutdown waiters resume only once the I/O thread has terminated, all of them; later ones at once")
    func shutdownWaiters() async {
        let queue = CommandQueue()
        let terminated = Flag()
        let (registered, signal) = AsyncStream.makeStream(of: Void.self)
        await withTaskGroup(of: Bool.self) { group in
            for _ in 0..<4 {
                group.addTask {
                    await withCheckedContinuation { waiter in
                        queue.requestShutdown(waiter: waiter)
                        signal.yield()
                    }
                    return terminated.value.load(ordering: .acquiring)
                }
            }
            var count = 0
            for await _ in registered {
                count += 1
                if count == 4 { break }
            }
            #expect(Self.labels(queue.takeCommands()) == ["shutdown"])
            terminated.value.store(true, ordering: .releasing)
            queue.markTerminated()
            for await sawTermination in group { #expect(sawTermination) }
        }
        // After termination a waiter is resumed at once.
        await withCheckedContinuation { queue.requestShutdown(waiter: $0) }
        #expect(queue.takeCommands().isEmpty)
    }

    @Test("commands from racing threads all reach the I/O thread once each, each thread's in order, with no wake-up lost")
    func racingProducers() async {
        let queue = CommandQueue()
        let producers: UInt64 = 4
        let perProducer: UInt64 = 5_000
        let total = Int(producers * perProducer)
        // The I/O thread's stand-in sleeps in poll(2) until the eventfd says there is work, and
        // takes commands only then: a lost wake-up strands commands and the test fails. Its poll
        // wakes now and then only to see whether the test was cancelled (its time limit).
        let cancelled = Flag()
        async let received = withTaskCancellationHandler {
            await Self.onThread { () -> [UInt64] in
                queue.adoptLoopThread(send: { _ in })
                var received: [UInt64] = []
                received.reserveCapacity(total)
                while received.count < total, !cancelled.value.load(ordering: .acquiring) {
                    var item = pollfd(fd: queue.wakeFD, events: Int16(POLLIN), revents: 0)
                    guard poll(&item, 1, 100) == 1 else { continue }
                    for command in queue.takeCommands() {
                        if case .cancelRequest(let id) = command { received.append(id) }
                    }
                }
                return received
            }
        } onCancel: {
            cancelled.value.store(true, ordering: .releasing)
        }
        await withTaskGroup(of: Void.self) { group in
            for producer in 0..<producers {
                group.addTask {
                    await Self.onThread {
                        for number in 0..<perProducer { queue.submit(Self.command(producer * 1_000_000 + number)) }
                    }
                }
            }
        }
        let ids = await received
        #expect(ids.count == total)
        for producer in 0..<producers {
            let own = ids.filter { $0 / 1_000_000 == producer }.map { $0 % 1_000_000 }
            let onceEachInOrder = own.elementsEqual(0..<perProducer)
            #expect(onceEachInOrder, "producer \(producer): \(own.count) of \(perProducer) commands, or out of order")
        }
    }

    @Test("ids are unique across racing threads, counting up from 1")
    func uniqueIDs() async {
        let queue = CommandQueue()
        let ids = await withTaskGroup(of: [UInt64].self) { group in
            for _ in 0..<4 {
                group.addTask { (0..<1_000).map { _ in queue.makeID() } }
            }
            var all: [UInt64] = []
            for await some in group { all += some }
            return all
        }
        #expect(Set(ids).count == 4_000)
        #expect(ids.min() == 1)
        #expect(ids.max() == 4_000)
    }
}
