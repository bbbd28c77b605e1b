import Foundation
import Logging
import OnboardingAPI
import OnboardingGateway
import ServiceLifecycle
import Testing

@Suite("The live intent stream (Server-Sent Events)", .serialized)
struct IntentStreamTests {
    @Test("it starts with the intent in force, then follows live; ids are route sequences; heartbeats move the id on")
    func inForceThenLive() async throws {
        try await GatewaySystem().run { _, gateway in
            let http = GatewayHTTP(gateway)
            let me = try await http.signIn("stream-\(UUID().uuidString)")
            // A new account's presentProfileSetup went out before the app knew its uid: the
            // stream opened now still starts with it.
            let stream = try await EventStreamReader.open(base: gateway.base, token: me.sessionToken)
            defer { stream.close() }
            #expect(stream.status == 200)
            #expect(stream.contentType?.hasPrefix("text/event-stream") == true)
            await stream.waitForIntents(1)
            let first = try #require(stream.intents.first)
            #expect(first.uid == me.uid && first.intent?.intent == .presentProfileSetup && first.intent?.reason == .signedIn)
            #expect(stream.events.first { $0.isIntent }?.sequence == first.sequence)

            #expect(try await http.setUp(token: me.sessionToken, username: "st\(Int.random(in: 1000...9999))").status == 201)
            await stream.waitForIntents(2)
            let dismiss = try #require(stream.intents.last)
            #expect(dismiss.intent?.intent == .dismiss && dismiss.intent?.reason == .profileCreated)
            #expect(try #require(dismiss.sequence) > first.sequence!)

            // A heartbeat carries an id at or after the last intent's, and no data.
            let dismissSequence = dismiss.sequence!
            await stream.wait(for: "a heartbeat after the dismiss") { events in
                events.contains { !$0.isIntent && ($0.sequence ?? 0) >= dismissSequence }
            }
            #expect(stream.intents.count == 2)
        }
    }

    @Test("a stream opened after others' intents stands at once past them, not at its own old intent")
    func standsPastOthers() async throws {
        try await GatewaySystem().run { _, gateway in
            let http = GatewayHTTP(gateway)
            let me = try await http.signIn("early-\(UUID().uuidString)")
            var newest: UInt64 = 0
            for index in 0..<3 {
                let other = try await http.signIn("later-\(index)-\(UUID().uuidString)")
                // The sign-in's reply comes before its intent commits: ask until it has.
                var sequence: UInt64?
                let deadline = ContinuousClock.now + .seconds(10)
                while sequence == nil, ContinuousClock.now < deadline {
                    sequence = try await http.send(.GET, "/v1/me/intent", token: other.sessionToken).decode(RouteState.self).sequence
                    if sequence == nil { try await Task.sleep(for: .milliseconds(5)) }
                }
                newest = max(newest, try #require(sequence, "the intent of \(other.uid) never came"))
            }
            let stream = try await EventStreamReader.open(base: gateway.base, token: me.sessionToken)
            defer { stream.close() }
            let through = newest
            await stream.wait(for: "the position after the intent in force") { events in
                events.count >= 2 && events[0].isIntent && !events[1].isIntent && (events[1].sequence ?? 0) >= through
            }
            #expect(try #require(stream.intents.first?.sequence) < newest)
        }
    }

    @Test("a reconnect with Last-Event-ID gets exactly what it missed, in order, never a duplicate")
    func reconnect() async throws {
        try await GatewaySystem().run { _, gateway in
            let http = GatewayHTTP(gateway)
            let me = try await http.signIn("reconnect-\(UUID().uuidString)")
            let first = try await EventStreamReader.open(base: gateway.base, token: me.sessionToken)
            await first.waitForIntents(1)
            let seen = try #require(first.lastEventID)
            first.close()

            // While away: a check republishes the intent in force (same intentId, new sequence),
            // someone else signs in, and the set-up sends dismiss.
            #expect(try await http.send(.POST, "/v1/me/check", token: me.sessionToken).status == 200)
            let other = try await http.signIn("someone-else-\(UUID().uuidString)")
            #expect(try await http.setUp(token: me.sessionToken, username: "rc\(Int.random(in: 1000...9999))").status == 201)

            let again = try await EventStreamReader.open(base: gateway.base, token: me.sessionToken, lastEventID: seen)
            defer { again.close() }
            await again.waitForIntents(2)
            let missed = again.intents
            #expect(missed.map { $0.intent?.intent } == [.presentProfileSetup, .dismiss])
            // The check's repeat: the same decision (intentId and reason), a new route sequence.
            #expect(missed.map { $0.intent?.reason } == [.signedIn, .profileCreated])
            #expect(missed[0].intent == first.intents[0].intent)
            #expect(missed.allSatisfy { $0.uid == me.uid && $0.uid != other.uid })
            let sequences = missed.compactMap(\.sequence)
            #expect(sequences == sequences.sorted() && Set(sequences).count == 2 && sequences[0] > UInt64(seen)!)

            // Live from there on: a check with the profile in place publishes nothing new, so
            // the next thing is a heartbeat, and still only the two intents.
            let lastSequence = sequences.last!
            await again.wait(for: "a heartbeat") { $0.contains { !$0.isIntent && ($0.sequence ?? 0) >= lastSequence } }
            #expect(again.intents.count == 2)
        }
    }

    @Test("each person receives only their own intents")
    func isolation() async throws {
        try await GatewaySystem().run { _, gateway in
            let http = GatewayHTTP(gateway)
            let people = try await withThrowingTaskGroup(of: SignInResult.self) { group in
                for index in 0..<4 { group.addTask { try await http.signIn("isolated-\(index)-\(UUID().uuidString)") } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            var streams: [(SignInResult, EventStreamReader)] = []
            for person in people {
                streams.append((person, try await EventStreamReader.open(base: gateway.base, token: person.sessionToken)))
            }
            for (index, person) in people.enumerated() {
                #expect(try await http.setUp(token: person.sessionToken, username: "iso\(index)\(Int.random(in: 100...999))").status == 201)
            }
            var newest: UInt64 = 0
            for (_, stream) in streams {
                await stream.waitForIntents(2)
                newest = max(newest, stream.intents.compactMap(\.sequence).max() ?? 0)
            }
            // Once every stream's heartbeat has passed every intent, nobody got anyone else's.
            let through = newest
            for (person, stream) in streams {
                await stream.wait(for: "a heartbeat past \(through)") { $0.contains { !$0.isIntent && ($0.sequence ?? 0) >= through } }
                #expect(stream.intents.count == 2)
                #expect(stream.intents.allSatisfy { $0.uid == person.uid && $0.intent?.uid == person.uid })
                stream.close()
            }
        }
    }

    @Test("a gateway stopped at once and started again: the client that reconnects misses nothing, and gets nothing twice")
    func gatewayRestart() async throws {
        let system = try GatewaySystem()
        try await system.runServices(orchestrator: true) { system in
            let configuration = system.gatewayConfiguration()
            let gateway = try await RunningGateway.start(configuration, bus: system.bus)
            let http = GatewayHTTP(gateway)
            let me = try await http.signIn("restart-\(UUID().uuidString)")
            let stream = try await EventStreamReader.open(base: gateway.base, token: me.sessionToken)
            await stream.waitForIntents(1)
            await gateway.kill()
            await stream.waitForEnd()
            let seen = try #require(stream.lastEventID)

            // While no gateway runs, the person acts through the bus (another device).
            let device = system.client()
            _ = try await device.signIn(provider: .kakao, subject: "restart-other-\(UUID().uuidString)")
            let phone = system.client(token: me.sessionToken)
            _ = try await phone.checkNow()
            _ = try await phone.setUpProfile(username: "rs\(Int.random(in: 1000...9999))")

            let restarted = try await RunningGateway.start(configuration, bus: system.bus)
            let again = try await EventStreamReader.open(base: restarted.base, token: me.sessionToken, lastEventID: seen)
            await again.waitForIntents(2)
            #expect(again.intents.map { $0.intent?.intent } == [.presentProfileSetup, .dismiss])
            #expect(again.intents.first?.intent == stream.intents.first?.intent)
            #expect(again.intents.allSatisfy { $0.uid == me.uid })
            let sequences = again.intents.compactMap(\.sequence)
            #expect(Set(sequences).count == sequences.count && sequences.allSatisfy { $0 > UInt64(seen)! })
            again.close()
            await restarted.stop()
        }
    }

    @Test("two gateways side by side: a stream on one sees what is done through the other; a reconnect moves between them")
    func sideBySide() async throws {
        let system = try GatewaySystem()
        try await system.runServices(orchestrator: true) { system in
            let first = try await RunningGateway.start(system.gatewayConfiguration(), bus: system.bus)
            let second = try await RunningGateway.start(system.gatewayConfiguration(), bus: system.bus)
            let me = try await GatewayHTTP(first).signIn("side-by-side-\(UUID().uuidString)")
            let stream = try await EventStreamReader.open(base: first.base, token: me.sessionToken)
            await stream.waitForIntents(1)
            #expect(try await GatewayHTTP(second).send(.POST, "/v1/me/check", token: me.sessionToken).status == 200)
            await stream.waitForIntents(2)
            let seen = try #require(stream.lastEventID)
            stream.close()

            #expect(try await GatewayHTTP(second).setUp(token: me.sessionToken, username: "sb\(Int.random(in: 1000...9999))").status == 201)
            let moved = try await EventStreamReader.open(base: second.base, token: me.sessionToken, lastEventID: seen)
            await moved.waitForIntents(1)
            let lastSequence = try #require(moved.intents.first?.sequence)
            await moved.wait(for: "a heartbeat") { $0.contains { !$0.isIntent && ($0.sequence ?? 0) >= lastSequence } }
            #expect(moved.intents.map { $0.intent?.intent } == [.dismiss])
            moved.close()
            await first.stop()
            await second.stop()
        }
    }

    @Test("an orchestrator restart: an open stream goes on and gets what comes after")
    func orchestratorRestart() async throws {
        let system = try GatewaySystem()
        try await system.runServices(orchestrator: false) { system in
            let first = ServiceGroup(services: [try system.orchestrator()], logger: GatewaySystem.logger)
            let firstRun = Task { try await first.run() }
            try await system.bus.waitUntilAnsweringOrchestrator()
            let gateway = try await RunningGateway.start(system.gatewayConfiguration(), bus: system.bus)
            let http = GatewayHTTP(gateway)
            let me = try await http.signIn("orchestrator-restart-\(UUID().uuidString)")
            let stream = try await EventStreamReader.open(base: gateway.base, token: me.sessionToken)
            await stream.waitForIntents(1)

            await first.triggerGracefulShutdown()
            try await firstRun.value
            let second = ServiceGroup(services: [try system.orchestrator()], logger: GatewaySystem.logger)
            let secondRun = Task { try await second.run() }
            try await system.bus.waitUntilAnsweringOrchestrator()

            #expect(try await http.setUp(token: me.sessionToken, username: "or\(Int.random(in: 1000...9999))").status == 201)
            await stream.waitForIntents(2)
            #expect(stream.intents.map { $0.intent?.intent } == [.presentProfileSetup, .dismiss])
            stream.close()
            await gateway.stop()
            await second.triggerGracefulShutdown()
            try await secondRun.value
        }
    }

    @Test("a stream ends when its session ends, and cannot be opened again with that session")
    func endings() async throws {
        try await GatewaySystem().run { _, gateway in
            let http = GatewayHTTP(gateway)
            let me = try await http.signIn("ending-\(UUID().uuidString)")
            let stream = try await EventStreamReader.open(base: gateway.base, token: me.sessionToken)
            await stream.waitForIntents(1)
            #expect(try await http.send(.DELETE, "/v1/session", token: me.sessionToken).status == 204)
            await stream.waitForEnd()
            #expect(stream.events.last?.type == "sessionEnded")

            let refused = try await EventStreamReader.open(base: gateway.base, token: me.sessionToken)
            #expect(refused.status == 401)
        }
    }
}
