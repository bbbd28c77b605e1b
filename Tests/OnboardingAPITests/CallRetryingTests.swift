import Foundation
import Messaging
import OnboardingAPI
import Synchronization
import Testing

@Suite("Retrying calls")
struct CallRetryingTests {
    // MARK: The schedule, as a value

    @Suite("Retry schedule")
    struct ScheduleTests {
        let schedule = RetrySchedule(
            backoff: RetryPolicy(initial: .milliseconds(100), maximum: .seconds(1)), deadline: .seconds(10),
            attemptTimeout: .seconds(2))
        let timeout = ServiceError(.timeout, "no reply")

        @Test("backoff doubles from the initial delay and stops at the maximum")
        func backoff() {
            let policy = RetryPolicy(initial: .milliseconds(100), maximum: .seconds(1))
            #expect((1...6).map(policy.delay(attempt:)) == [
                .milliseconds(100), .milliseconds(200), .milliseconds(400), .milliseconds(800), .seconds(1), .seconds(1),
            ])
            #expect(policy.delay(attempt: 0) == .milliseconds(100))
            #expect(policy.delay(attempt: 1_000) == .seconds(1))
        }

        @Test("the failures that may pass are retried", arguments: [
            ErrorCode.timeout, .noResponder, .overloaded, .shuttingDown, .storeUnavailable, .dependencyUnavailable,
        ])
        func retriedCodes(code: ErrorCode) {
            let decision = schedule.decision(after: ServiceError(code, "x"), attempt: 1, elapsed: .zero, random: 0)
            #expect(decision == .retry(delay: .milliseconds(100), timeout: .seconds(2)))
        }

        @Test("a refusal, and our own bus closing, end the call at once", arguments: [
            ErrorCode.closed, .profileExists, .usernameTaken, .unauthenticated, .invalidRequest, .invalidMessage,
            .internalError, .imageRejected,
        ])
        func refusalsAreNotRetried(code: ErrorCode) {
            #expect(schedule.decision(after: ServiceError(code, "x"), attempt: 1, elapsed: .zero, random: 0) == .giveUp)
        }

        @Test("jitter takes up to half of the delay away")
        func jitter() {
            #expect(schedule.decision(after: timeout, attempt: 2, elapsed: .zero, random: 0)
                == .retry(delay: .milliseconds(200), timeout: .seconds(2)))
            #expect(schedule.decision(after: timeout, attempt: 2, elapsed: .zero, random: 0.5)
                == .retry(delay: .milliseconds(150), timeout: .seconds(2)))
            var unjittered = schedule
            unjittered.jitter = 0
            #expect(unjittered.decision(after: timeout, attempt: 2, elapsed: .zero, random: 0.99)
                == .retry(delay: .milliseconds(200), timeout: .seconds(2)))
        }

        @Test("near the deadline the last attempt gets only the time left, and then the call gives up")
        func deadline() {
            #expect(schedule.decision(after: timeout, attempt: 3, elapsed: .milliseconds(8_600), random: 0)
                == .retry(delay: .milliseconds(400), timeout: .seconds(1)))
            #expect(schedule.decision(after: timeout, attempt: 3, elapsed: .milliseconds(9_590), random: 0) == .giveUp)
            #expect(schedule.decision(after: timeout, attempt: 1, elapsed: .seconds(11), random: 0) == .giveUp)
        }

        @Test("the first attempt waits no longer than the deadline")
        func firstAttempt() {
            #expect(schedule.firstAttemptTimeout == .seconds(2))
            #expect(RetrySchedule(deadline: .milliseconds(500), attemptTimeout: .seconds(3)).firstAttemptTimeout == .milliseconds(500))
            #expect(RetrySchedule(deadline: .zero).firstAttemptTimeout == RetrySchedule.shortestAttempt)
        }

        @Test("an empty set of codes retries nothing")
        func noCodes() {
            let never = RetrySchedule(deadline: .seconds(10), retryable: [])
            #expect(never.decision(after: timeout, attempt: 1, elapsed: .zero, random: 0) == .giveUp)
        }
    }

    // MARK: Over a bus

    let bus = InProcessBus()
    let endpoint: Endpoint = "inproc://flaky"
    let request = CreateProfile(username: "mina", idempotencyKey: "set-up-1")
    let answer = ProfileResult(profile: Profile(uid: "u1", username: "mina", imagePath: nil, createdAt: "t", updatedAt: "t"))

    /// What a test server does with one attempt.
    enum Response: Sendable {
        case reply
        case fail(ErrorCode)
        case silence
    }

    /// Serves `endpoint` for the length of `body`, answering attempt `n` (1 is the first) as
    /// `respond(n)` says; returns what `body` returned and every request the server received.
    func withServer<T: Sendable>(
        _ respond: @escaping @Sendable (Int) -> Response, _ body: () async throws -> T
    ) async throws -> (T, [Message]) {
        let received = Mutex<[Message]>([])
        let requests = try await bus.serve(at: endpoint, limits: MessageLimits())
        let answer = self.answer
        let server = Task {
            for await incoming in requests {
                let attempt = received.withLock { $0.append(incoming.message); return $0.count }
                switch respond(attempt) {
                case .reply: incoming.reply(type: CreateProfile.replyType, source: "flaky", payload: answer)
                case .fail(let code): incoming.fail(ServiceError(code, "attempt \(attempt)"), source: "flaky")
                case .silence: break
                }
            }
        }
        defer { server.cancel() }
        let result = try await body()
        return (result, received.withLock { $0 })
    }

    // A long deadline: calls that succeed return at once, and a loaded machine runs timers late.
    func call(timeout: Duration = .seconds(1), deadline: Duration = .seconds(30)) async throws -> ProfileResult {
        try await bus.callRetrying(
            request, to: endpoint, source: "test", uid: "u1", timeout: timeout,
            retry: RetryPolicy(initial: .milliseconds(10), maximum: .milliseconds(50)), deadline: deadline)
    }

    @Test("a service that answers only the third attempt is reached, with the same request each time")
    func answersOnTheThirdAttempt() async throws {
        let (result, received) = try await withServer({ $0 < 3 ? .fail(.overloaded) : .reply }) {
            try await call()
        }
        #expect(result == answer)
        #expect(received.count == 3)
        let sent = try received.map { try $0.payload(as: CreateProfile.self) }
        #expect(sent.map(\.idempotencyKey) == Array(repeating: request.idempotencyKey, count: 3))
        #expect(sent.map(\.username) == Array(repeating: request.username, count: 3))
        #expect(Set(received.map(\.header.id)).count == 3, "each attempt is a new envelope")
        #expect(received.allSatisfy { $0.header.uid == "u1" })
    }

    @Test("attempts that time out are sent again, and a late answer is used")
    func timeoutsAreRetried() async throws {
        let (result, received) = try await withServer({ $0 < 3 ? .silence : .reply }) {
            // Generous for a loaded machine: an answered attempt must not time out too.
            try await call(timeout: .milliseconds(400), deadline: .seconds(30))
        }
        #expect(result == answer)
        #expect(received.count >= 3)
    }

    @Test("a service that never answers: the last error, once the deadline has passed")
    func neverAnswers() async throws {
        let clock = ContinuousClock()
        let start = clock.now
        let (error, received) = try await withServer({ _ in .silence }) {
            await #expect(throws: ServiceError.self) { try await call(timeout: .milliseconds(150), deadline: .milliseconds(600)) }
        }
        let elapsed = start.duration(to: clock.now)
        #expect(error?.code == .timeout)
        #expect(!received.isEmpty)
        // Only a lower bound: a loaded machine may run timers late (when to retry, and when not
        // to, is the schedule's decision, tested without a clock in RetrySchedule's tests).
        #expect(elapsed >= .milliseconds(450), "\(elapsed)")
    }

    @Test("an attempt that timed out leaves the outcome unknown, whatever later attempts were told")
    func timeoutOutlivesLaterRefusals() async throws {
        let (error, received) = try await withServer({ $0 == 1 ? .silence : .fail(.overloaded) }) {
            await #expect(throws: ServiceError.self) { try await call(timeout: .milliseconds(200), deadline: .seconds(1)) }
        }
        #expect(error?.code == .timeout, "the first attempt may have been carried out")
        #expect(received.count >= 1)
    }

    @Test("nothing listening: noResponder once the deadline has passed")
    func nobodyListens() async throws {
        let error = await #expect(throws: ServiceError.self) { try await call(deadline: .milliseconds(200)) }
        #expect(error?.code == .noResponder)
    }

    @Test("a refusal is thrown at once, never sent again", arguments: [ErrorCode.profileExists, .closed, .unauthenticated])
    func refusalIsNotRetried(code: ErrorCode) async throws {
        let (error, received) = try await withServer({ _ in .fail(code) }) {
            await #expect(throws: ServiceError.self) { try await call() }
        }
        #expect(error?.code == code)
        #expect(received.count == 1)
    }

    @Test("only the codes asked for are retried")
    func chosenCodes() async throws {
        let (error, received) = try await withServer({ $0 < 2 ? .fail(.overloaded) : .reply }) {
            await #expect(throws: ServiceError.self) {
                try await bus.callRetrying(request, to: endpoint, source: "test", deadline: .seconds(5), retryingOn: [.noResponder])
            }
        }
        #expect(error?.code == .overloaded)
        #expect(received.count == 1)
    }

    @Test("cancelling the caller during the backoff ends the call without another attempt")
    func cancellation() async throws {
        let firstAttempt = AsyncStream.makeStream(of: Void.self)
        let (thrown, received) = try await withServer({ _ in
            firstAttempt.continuation.yield()
            return .fail(.overloaded)
        }) {
            let call = Task {
                try await bus.callRetrying(
                    request, to: endpoint, source: "test", retry: RetryPolicy(initial: .seconds(30), maximum: .seconds(30)),
                    deadline: .seconds(120))
            }
            for await _ in firstAttempt.stream { break }
            call.cancel()
            return await call.result
        }
        #expect(throws: CancellationError.self) { try thrown.get() }
        #expect(received.count == 1)
    }
    // MARK: Work that goes on until it succeeds

    @Test("untilSuccess runs the work again after each failure, with the policy's backoff, and says each failure once")
    func untilSuccess() async {
        let attempts = Mutex(0)
        var heard: [(ErrorCode?, Int, Duration)] = []
        let policy = RetryPolicy(initial: .milliseconds(1), maximum: .milliseconds(2))
        let result = await policy.untilSuccess {
            let attempt = attempts.withLock { $0 += 1; return $0 }
            if attempt < 4 { throw ServiceError(attempt == 1 ? .noResponder : .invalidRequest, "not yet") }
            return "done"
        } failed: { error, retry, delay in
            heard.append(((error as? ServiceError)?.code, retry, delay))
        }
        #expect(result == "done")
        #expect(attempts.withLock { $0 } == 4)
        #expect(heard.map(\.0) == [.noResponder, .invalidRequest, .invalidRequest], "every error is retried, not only transient ones")
        #expect(heard.map(\.1) == [1, 2, 3])
        #expect(heard.map(\.2) == [.milliseconds(1), .milliseconds(2), .milliseconds(2)])
    }

    @Test("untilSuccess gives nil once its task is cancelled, without another attempt")
    func untilSuccessCancelled() async {
        let failed = AsyncStream.makeStream(of: Void.self)
        let attempts = Mutex(0)
        let work = Task {
            await RetryPolicy(initial: .seconds(30), maximum: .seconds(30)).untilSuccess { () async throws -> Int in
                attempts.withLock { $0 += 1 }
                throw ServiceError(.timeout, "no reply")
            } failed: { _, _, _ in
                failed.continuation.yield()
            }
        }
        for await _ in failed.stream { break }
        work.cancel()
        #expect(await work.value == nil)
        #expect(attempts.withLock { $0 } == 1)
    }
}
