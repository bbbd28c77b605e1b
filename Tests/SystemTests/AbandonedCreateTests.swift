import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingTesting
import ProfileService
import ServiceRuntime
import Synchronization
import Testing

@testable import OnboardingOrchestrator

/// A create that its set-up gave up on can still be on its way: queued at a paused profile
/// replica, or waiting for the database. Once the set-up has removed its image, such a create
/// must not land, or the profile would point at an image that is gone (found by the chaos test
/// with two replicas of every service).
@Suite("A set-up's creates that arrive after its clean-up", .timeLimit(.minutes(2)))
struct AbandonedCreateTests {
    @Test("a create held up past its set-up's clean-up is refused when it lands, and the image stays removed")
    func heldUpCreateIsRefused() async throws {
        let configuration = InProcessSystem.Configuration(
            leftOut: [.profile], orchestratorCallTimeout: .seconds(1),
            orchestratorRetry: RetryPolicy(initial: .seconds(30), maximum: .seconds(30)))
        try await InProcessSystem.run(configuration) { system in
            // The profile store behind a replica that takes creates and sits on them.
            let (store, profile) = try await standInProfile(in: system)
            profile.fail(GetProfile.self, with: ServiceError(.timeout, "The stand-in profile store does not answer."))
            profile.ignore(CreateProfile.self)

            let session = try await system.client().signIn(provider: .google, subject: "held-up-\(UUID().uuidString)")
            let uid = session.uid
            // One set-up, sent once (a client would send it again): its answer waits for the clean-up.
            await expectCode(.dependencyUnavailable, reason: "profile") {
                _ = try await system.bus.call(
                    SetUpProfile(username: "held\(Int.random(in: 100...999))", contentType: "image/png"),
                    to: system.endpoints.orchestratorRPC, source: "test", sessionToken: session.sessionToken,
                    attachment: pngBytes, timeout: .seconds(60))
            }
            #expect(system.storedImages(of: uid).isEmpty, "the set-up's image is removed")

            // The create was sent again within the set-up's deadline, every copy with the set-up's attempt.
            let held = profile.requests(of: CreateProfile.self)
            let abandoned = profile.requests(of: AbandonCreates.self)
            #expect(!held.isEmpty)
            #expect(Set(held.map(\.attempt)).count == 1)
            #expect(abandoned.count == 1)
            for create in held {
                let attempt = try #require(create.attempt, "the orchestrator numbers its creates")
                #expect(attempt <= abandoned[0].throughAttempt)
                // The paused replica wakes up and hands the create to the store.
                await expectCode(.invalidRequest, reason: "createAbandoned") {
                    _ = try await store.createRecorded(
                        uid: uid, username: create.username, imagePath: create.imagePath,
                        idempotencyKey: create.idempotencyKey, attempt: create.attempt, correlationId: nil)
                }
            }
            #expect(try await store.fetch(uid: uid) == nil)
            #expect(profile.unexpectedRequests.isEmpty)
            await profile.stop()
        }
    }

    @Test("a set-up whose creates another try abandoned touches nothing and asks to be sent again; sent again, it succeeds")
    func takenOverSetUpIsSentAgain() async throws {
        let configuration = InProcessSystem.Configuration(leftOut: [.profile])
        try await InProcessSystem.run(configuration) { system in
            let (store, profile) = try await standInProfile(in: system)
            profile.answer(GetProfile.self) { _, message in ProfileResult(profile: try await store.fetch(uid: message.header.uid ?? "")) }
            // The first create finds its try settled by another (as by an orchestrator that took the lead).
            let first = Mutex(true)
            profile.answer(CreateProfile.self) { request, message in
                let uid = message.header.uid ?? ""
                if first.withLock({ was in defer { was = false }; return was }) {
                    _ = try await store.abandonCreates(uid: uid, through: request.attempt ?? 0)
                }
                let created = try await store.createRecorded(
                    uid: uid, username: request.username, imagePath: request.imagePath,
                    idempotencyKey: request.idempotencyKey, attempt: request.attempt)
                return ProfileResult(profile: created.profile, asOfSequence: created.sequence)
            }

            let app = system.client()
            let session = try await app.signIn(provider: .google, subject: "taken-over-\(UUID().uuidString)")
            let (username, key) = ("taken\(Int.random(in: 100...999))", IdempotencyKey.make())
            await expectCode(.storeUnavailable, reason: "setUpTakenOver") {
                _ = try await system.bus.call(
                    SetUpProfile(username: username, contentType: "image/png", idempotencyKey: key),
                    to: system.endpoints.orchestratorRPC, source: "test", sessionToken: session.sessionToken,
                    attachment: pngBytes, timeout: .seconds(30))
            }
            // The answered try asked nothing more of the profile store: whoever abandoned it settles it.
            #expect(profile.requests(of: CreateProfile.self).count == 1)

            let made = try await app.setUpProfile(username: username, image: pngBytes, contentType: "image/png", idempotencyKey: key)
            #expect(made.username == username)
            let creates = profile.requests(of: CreateProfile.self)
            #expect(Set(creates.compactMap(\.attempt)).count == creates.count, "each try has an attempt of its own")
            let path = try #require(made.imagePath)
            #expect(system.storedImages(of: session.uid).contains(String(path.split(separator: "/").last ?? "")))
            #expect(try await store.fetch(uid: session.uid) == made)
            #expect(profile.unexpectedRequests.isEmpty)
            await profile.stop()
        }
    }

    @Test("a try that finds a newer try of its person on record before removing images removes nothing, and asks to be sent again")
    func newerTryKeepsTheImages() async throws {
        let configuration = InProcessSystem.Configuration(leftOut: [.profile], orchestratorCallTimeout: .seconds(20))
        try await InProcessSystem.run(configuration) { system in
            let (store, profile) = try await standInProfile(in: system)
            // Refused for good: the try abandons its creates and would then remove its image.
            profile.fail(CreateProfile.self, with: ServiceError(.usernameTaken, "Someone else already has this username.", reason: "taken"))
            // While it abandons, a newer try of the same person begins (as at an orchestrator that
            // took the lead). The settle loop's abandons (through the newer try's attempt) fail, so
            // nothing settles the person behind the test's back.
            let orchestrator = SQLiteOrchestratorDatabase(path: system.directory.appendingPathComponent("orchestrator.sqlite").path)
            let publisher = try await InProcessBus().publisher(at: Endpoint("inproc://newer-try-\(UUID().uuidString)"))
            defer { publisher.close() }
            let context = OrchestratorStorageContext(
                publisher: publisher, retention: Outbox.Retention(), logger: Logger(label: "quiet") { _ in SwiftLogNoOpLogHandler() })
            let tries = Mutex<UInt64?>(nil)  // the attempt of the try under test, from its first abandon
            profile.answer(AbandonCreates.self) { request, message in
                let uid = message.header.uid ?? ""
                let attempt = tries.withLock { first in
                    if first == nil { first = request.throughAttempt }
                    return first
                }
                guard request.throughAttempt == attempt else {
                    throw ServiceError(.timeout, "The stand-in profile store does not answer.")
                }
                try await orchestrator.withStorage(context) { storage in
                    _ = try await storage.beginSetup(SetUpRecord(uid: uid, idempotencyKey: IdempotencyKey.make(), username: "newer"))
                }
                return try await store.abandonCreates(uid: uid, through: request.throughAttempt)
            }

            let session = try await system.client().signIn(provider: .google, subject: "newer-try-\(UUID().uuidString)")
            await expectCode(.storeUnavailable, reason: "setUpTakenOver") {
                _ = try await system.bus.call(
                    SetUpProfile(username: "older\(Int.random(in: 100...999))", contentType: "image/png"),
                    to: system.endpoints.orchestratorRPC, source: "test", sessionToken: session.sessionToken,
                    attachment: pngBytes, timeout: .seconds(30))
            }
            #expect(!system.storedImages(of: session.uid).isEmpty, "the image (and its thumbnail) stay: the newer try settles the person")
            #expect(profile.requests(of: AbandonCreates.self).count >= 1)
            await profile.stop()
        }
    }
}

/// A stand-in at the profile service's endpoint with a profile store behind it that the test
/// drives: `profile.abandonCreates` is answered by the store, the profile events are not.
private func standInProfile(in system: InProcessSystem) async throws -> (ProfileStore, StandInService) {
    let publisher = try await InProcessBus().publisher(at: Endpoint("inproc://stand-in-profile-events-\(UUID().uuidString)"))
    let store = ProfileStore(
        writer: try ProfileStore.openDatabase(path: nil),
        outbox: Outbox(source: ServiceName.profile, publisher: publisher), logger: Logger(label: "quiet") { _ in SwiftLogNoOpLogHandler() })
    let profile = try await StandInService.start(on: system.bus, at: system.endpoints.profileRPC)
    profile.fail(EventsAfter.self, with: ServiceError(.timeout, "The stand-in profile store does not answer."))
    profile.answer(AbandonCreates.self) { request, message in
        try await store.abandonCreates(uid: message.header.uid ?? "", through: request.throughAttempt)
    }
    return (store, profile)
}
