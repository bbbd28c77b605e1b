import CZeroMQ
import Foundation
import ZeroMQMessaging

/// What is timed.
enum Scenario: String, CaseIterable, Sendable, Codable {
    /// A new account signs in (`auth.signIn`) → `presentProfileSetup` (signedIn).
    case signIn = "sign-in"
    /// A signed-in person without a profile asks "check me now" (`onboarding.check`) →
    /// `presentProfileSetup`, after a profile look-up: the intent in force (from sign-in) is
    /// confirmed and published again, same `intentId`, with the reason it was decided for.
    case check
    /// A signed-in person without a profile sets one up without an image
    /// (`onboarding.setUpProfile`) → `dismiss` (profileCreated).
    case setUp = "set-up"

    var expected: ObservedIntent {
        switch self {
        case .signIn: .presentProfileSetupSignedIn
        case .check: .presentProfileSetupCheckRequested
        case .setUp: .dismissProfileCreated
        }
    }

    /// Whether `intent` answers this scenario's request. A check confirms the
    /// `presentProfileSetup` decided at sign-in, so its reason is that one's (or `checkRequested`
    /// when the check decided it itself).
    func accepts(_ intent: ObservedIntent) -> Bool {
        switch self {
        case .check: intent == .presentProfileSetupSignedIn || intent == .presentProfileSetupCheckRequested
        default: intent == expected
        }
    }

    var request: String {
        switch self {
        case .signIn: "auth.signIn (new account)"
        case .check: "onboarding.check"
        case .setUp: "onboarding.setUpProfile (no image)"
        }
    }

    /// Whether each request needs a signed-in person made beforehand.
    var needsPeople: Bool { self != .signIn }
}

struct BenchSettings: Sendable {
    var scenario: Scenario
    var authRPC: String
    var orchestratorRPC: String
    var routes: String
    /// CURVE keys (`nil`: plain sockets).
    var keys: BusKeys?
    var runDirectory: String?
    /// Sign-ins in flight at once while preparing people (closed loop, not timed).
    var prepWindow = 64
    /// Give up on missing intents after this long without any arriving (seconds).
    var quietSeconds = 5.0
    /// Give up on missing intents this long after the last send at the latest (seconds).
    var drainTimeout = 60.0
    /// The share of requests traced, when they carry trace context (see ``RequestFactory/tracedPercent``).
    var tracedPercent: UInt64? = nil
}

/// Drives the system through the steps of one run: the route subscriber for the whole run, a
/// timed sender per step, and the preparation of the people that `check` and `set-up` need.
/// Runs on the caller's thread (the coordinator), which never sends timed requests itself.
final class BenchRun {
    let settings: BenchSettings
    let factory: RequestFactory
    let probe: CPUProbe
    private let receiver: IntentReceiver
    private let progress: (String) -> Void
    /// The number of the next request (ids, subjects and usernames are made from it).
    private var nextNumber: UInt64 = 1

    init(settings: BenchSettings, progress: @escaping (String) -> Void) {
        self.settings = settings
        self.progress = progress
        factory = RequestFactory(tracedPercent: settings.tracedPercent)
        probe = CPUProbe(runDirectory: settings.runDirectory)
        receiver = IntentReceiver(endpoint: settings.routes, keys: settings.keys)
    }

    func start() throws {
        try receiver.start()
        let attempts = try waitForLiveRoutes()
        progress("route subscription is live (warm-up sign-ins: \(attempts))")
    }

    func stop() {
        receiver.stop()
    }

    // MARK: Live subscription

    /// A SUB socket sees only what is published after its subscription has reached the
    /// publisher, and nothing tells it when that has happened. So: sign in a warm-up person and
    /// wait for their intent; when none comes within 250 ms, sign in another. The first intent
    /// that arrives proves the subscription live. Returns how many warm-up sign-ins it took.
    func waitForLiveRoutes() throws -> Int {
        for attempt in 1...40 {
            let person = try signInPeople(1)[0]
            let deadline = MonotonicClock.now() + 250_000_000
            while MonotonicClock.now() < deadline {
                if receiver.take().contains(where: { $0.uid == person.uid }) { return attempt }
                MonotonicClock.sleep(milliseconds: 2)
            }
        }
        throw BenchError("no route intent arrived at \(settings.routes) within 10 s of warm-up sign-ins: is the orchestrator up, and auth in dev mode?")
    }

    // MARK: People

    struct Person: Sendable {
        var uid: UUIDKey
        /// The session token's JSON text, as the sign-in reply had it.
        var token: [UInt8]
    }

    /// Signs in `count` new accounts, `prepWindow` at a time (closed loop, untimed), on a DEALER
    /// of this thread. Requests refused (such as `overloaded`) are sent again.
    func signInPeople(_ count: Int) throws -> [Person] {
        let context = ZMQContext()
        defer { context.terminate() }
        let socket = try ZMQSocket(context, type: ZMQ_DEALER)
        defer { socket.close() }
        socket.set(ZMQ_SNDHWM, 0)
        // Only to replicas that are connected (a standby orchestrator never is), as the bus does.
        socket.set(ZMQ_IMMEDIATE, 1)
        socket.set(ZMQ_RCVHWM, 0)
        try socket.connect(settings.authRPC, keys: settings.keys)
        var template = factory.signIn()
        let receiver = MultipartReceiver()
        var people = [Person?](repeating: nil, count: count)
        var pending: [Int] = Array((0..<count).reversed())
        var outstanding = 0
        var done = 0
        var refused = 0
        var lastProgress = MonotonicClock.now()
        while done < count {
            while outstanding < settings.prepWindow, let index = pending.popLast() {
                template.fill(nextNumber)
                nextNumber += 1
                _ = template.bytes.withUnsafeBytes { socket.sendRequest(tag: UInt64(index), body: $0) }
                outstanding += 1
            }
            var item = zmq_pollitem_t(socket: socket.handle, fd: 0, events: Int16(ZMQ_POLLIN), revents: 0)
            _ = zmq_poll(&item, 1, 100)
            while case .message = receiver.receive(from: socket, wait: false) {
                let tagFrame = receiver.frame(0)
                guard receiver.frameCount == 3, tagFrame.count == 8 else { continue }
                let index = Int(tagFrame.loadUnaligned(as: UInt64.self).littleEndian)
                guard index < count, people[index] == nil else { continue }
                outstanding -= 1
                lastProgress = MonotonicClock.now()
                switch ReplyReading.read(receiver.frame(2), wantUID: true, wantToken: true) {
                case .success(let uid?, let token?):
                    people[index] = Person(uid: uid, token: token)
                    done += 1
                case .error(let code):
                    refused += 1
                    if refused > 1000 + count { throw BenchError("signing people in keeps failing (last: \(code))") }
                    pending.append(index)
                default:
                    throw BenchError("an auth.signIn reply could not be read")
                }
            }
            if MonotonicClock.now() - lastProgress > 15_000_000_000 {
                throw BenchError("auth at \(settings.authRPC) stopped answering sign-ins (\(done) of \(count) done)")
            }
        }
        return people.map { $0! }
    }

    /// Waits until each of `people` has had `intent`, or `quietSeconds` pass without one.
    /// Returns how many never had it.
    func waitForIntents(of people: [Person], _ intent: ObservedIntent) -> Int {
        var missing = Set(people.map(\.uid))
        var lastProgress = MonotonicClock.now()
        while !missing.isEmpty, Double(MonotonicClock.now() - lastProgress) / 1e9 < settings.quietSeconds {
            for arrival in receiver.take() where arrival.intent == intent {
                if missing.remove(arrival.uid) != nil { lastProgress = MonotonicClock.now() }
            }
            if !missing.isEmpty { MonotonicClock.sleep(milliseconds: 5) }
        }
        return missing.count
    }

    // MARK: A step

    func runStep(rate: Double, count: Int) throws -> StepResult {
        let scenario = settings.scenario
        var people: [Person] = []
        if scenario.needsPeople {
            progress("preparing \(count) signed-in people without a profile (untimed)")
            people = try signInPeople(count)
            let missing = waitForIntents(of: people, .presentProfileSetupSignedIn)
            if missing > 0 { progress("warning: \(missing) prepared people got no presentProfileSetup (signedIn)") }
        }
        let templates: [MessageTemplate]
        switch scenario {
        case .signIn: templates = [factory.signIn()]
        case .check: templates = people.map { factory.check(sessionToken: $0.token, uid: $0.uid.description) }
        case .setUp: templates = people.map { factory.setUp(sessionToken: $0.token) }
        }
        let configuration = TimedSender.Configuration(
            endpoint: scenario == .signIn ? settings.authRPC : settings.orchestratorRPC,
            firstNumber: nextNumber, count: count, interval: 1e9 / rate,
            recordUIDs: scenario == .signIn, health: factory.health(), keys: settings.keys)
        nextNumber += UInt64(count)
        let sender = TimedSender(configuration, templates: templates)
        sender.prepare()
        if let failure = sender.failure {
            sender.waitUntilFinished()
            throw BenchError(failure)
        }

        _ = receiver.take()  // stragglers of earlier phases
        let loadAverage = LoadAverage.read()
        let before = probe.sample()
        sender.begin()

        // Wait until every request has its intent or its error, or nothing moves for a while.
        var arrivals: [Arrival] = []
        arrivals.reserveCapacity(count)
        var expectedSeen = 0
        var lastProgress = MonotonicClock.now()
        var lastReplied = 0
        var doneAt: UInt64?
        while true {
            MonotonicClock.sleep(milliseconds: 5)
            let now = MonotonicClock.now()
            let new = receiver.take()
            for arrival in new where scenario.accepts(arrival.intent) { expectedSeen += 1 }
            arrivals += new
            let replied = sender.replied.load(ordering: .relaxed)
            if !new.isEmpty || replied != lastReplied { lastProgress = now }
            lastReplied = replied
            guard sender.doneSending.load(ordering: .acquiring) else { continue }
            let finishedSending = doneAt ?? now
            doneAt = finishedSending
            let sent = sender.sent.load(ordering: .relaxed)
            if replied >= sent, expectedSeen >= sent - sender.errorReplies.load(ordering: .relaxed) { break }
            if Double(now - lastProgress) / 1e9 >= settings.quietSeconds { break }
            if Double(now - finishedSending) / 1e9 >= settings.drainTimeout { break }
        }
        let after = probe.sample()
        sender.stopWaitingForReplies()
        sender.waitUntilFinished()
        if let failure = sender.failure { throw BenchError(failure) }
        arrivals += receiver.take()

        var step = Self.evaluate(
            scenario: scenario, sender: sender, people: people, arrivals: arrivals)
        step.offeredRate = rate
        step.cpu = CPUProbe.usage(from: before, to: after, operations: step.sent)
        step.otherBusy = CPUProbe.otherBusy(from: before, to: after, usage: step.cpu)
        step.windowSeconds = Double(after.taken - before.taken) / 1e9
        step.loadAverage = loadAverage
        return step
    }

    /// Matches the intents that arrived to the step's requests (sign-in: by the uid each reply
    /// named; check and set-up: by the person's uid) and measures each from its scheduled send.
    static func evaluate(scenario: Scenario, sender: TimedSender, people: [Person], arrivals: [Arrival]) -> StepResult {
        let count = sender.configuration.count
        let sent = sender.sent.load(ordering: .relaxed)
        var index: [UUIDKey: Int] = [:]
        index.reserveCapacity(count)
        if scenario == .signIn {
            for (request, uid) in sender.uids.enumerated() where uid != .none { index[uid] = request }
        } else {
            for (request, person) in people.enumerated() { index[person.uid] = request }
        }
        var matched = [Bool](repeating: false, count: count)
        var histogram = LatencySummary.histogram()
        var duplicates = 0
        var unexpected = 0
        var lastArrival = sender.start
        for arrival in arrivals {
            guard let request = index[arrival.uid], request < sent else { continue }
            guard scenario.accepts(arrival.intent) else {
                unexpected += 1
                continue
            }
            if matched[request] {
                duplicates += 1
                continue
            }
            matched[request] = true
            let scheduled = sender.scheduled(request)
            histogram.record(arrival.time > scheduled ? arrival.time - scheduled : 0)
            lastArrival = max(lastArrival, arrival.time)
        }
        var received = 0
        var lost = 0
        var withoutReply = 0
        for request in 0..<sent {
            if matched[request] { received += 1 }
            if sender.replies[request] == .none { withoutReply += 1 }
            if !matched[request], sender.replies[request] != .error { lost += 1 }
        }
        let span = Double(lastArrival - sender.start) / 1e9
        return StepResult(
            offeredRate: 0, count: count, sent: sent, received: received, lost: lost, errors: sender.errors,
            withoutReply: withoutReply, duplicates: duplicates, unexpected: unexpected,
            latency: LatencySummary(histogram), sendLag: LatencySummary(sender.lag),
            achievedRate: span > 0 ? Double(received) / span : 0,
            sendSeconds: Double(sender.lastSend - sender.start) / 1e9,
            windowSeconds: 0, cpu: [], otherBusy: nil, loadAverage: [], passed: nil)
    }
}
