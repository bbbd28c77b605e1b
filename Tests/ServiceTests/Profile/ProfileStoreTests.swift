import Foundation
import GRDB
import Messaging
import OnboardingAPI
@testable import ProfileService
import TestSupport
import ServiceRuntime
import Synchronization
import Testing

extension ProfileServiceTests {
    @Suite("Profile store")
    struct ProfileStoreTests {
        @Test("a person without a profile gets none, as an answer", arguments: StoreKind.available)
        func missingProfile(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                #expect(try await store.fetch(uid: "u1") == nil)
            }
        }

        @Test("a created profile is stored as entered, in NFC, with its times", arguments: StoreKind.available)
        func create(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                let created = try await store.create(uid: "u1", username: "Mi\u{1100}\u{1161}", imagePath: "u1/a.png")
                #expect(created.username == "Mi가")
                #expect(created.imagePath == "u1/a.png")
                #expect(created.createdAt == created.updatedAt)
                #expect(Timestamp.parse(created.createdAt) != nil)
                #expect(try await store.fetch(uid: "u1") == created)
            }
        }

        @Test("a name that breaks a format rule is refused with that rule", arguments: StoreKind.available)
        func formatRefusal(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                let error = await refusal { _ = try await store.create(uid: "u1", username: "mi-na", imagePath: nil) }
                #expect(error == .username(.invalidCharacters))
                #expect(try await outboxRows(store).isEmpty)
            }
        }

        @Test("Mina and mina are the same name, shown as first entered", arguments: StoreKind.available)
        func caseInsensitiveUniqueness(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                _ = try await store.create(uid: "u1", username: "Mina", imagePath: nil)
                let error = await refusal { _ = try await store.create(uid: "u2", username: "mina", imagePath: nil) }
                #expect(error?.code == .usernameTaken)
                #expect(error?.reason == "duplicated")
                #expect(try await store.fetch(uid: "u1")?.username == "Mina")
                #expect(try await store.availability(of: "MINA").reason == .duplicated)
            }
        }

        @Test("decomposed and composed Hangul are the same name", arguments: StoreKind.available)
        func nfcUniqueness(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                _ = try await store.create(uid: "u1", username: "\u{1100}\u{1161}\u{11A8}\u{1102}\u{1161}", imagePath: nil)
                let error = await refusal { _ = try await store.create(uid: "u2", username: "각나", imagePath: nil) }
                #expect(error?.code == .usernameTaken)
                let availability = try await store.availability(of: "\u{1100}\u{1161}\u{11A8}\u{1102}\u{1161}")
                #expect(availability == UsernameAvailability(username: "각나", available: false, reason: .duplicated))
            }
        }

        @Test("a person has at most one profile", arguments: StoreKind.available)
        func profileExists(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                _ = try await store.create(uid: "u1", username: "mina", imagePath: nil)
                let error = await refusal { _ = try await store.create(uid: "u1", username: "other", imagePath: nil) }
                #expect(error?.code == .profileExists)
            }
        }

        @Test("an update changes only the fields given, and may change the case of one's own name", arguments: StoreKind.available)
        func update(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                let created = try await store.create(uid: "u1", username: "mina", imagePath: "u1/a.png")
                let renamed = try await store.update(uid: "u1", username: "Mina", imagePath: nil)
                #expect(renamed.username == "Mina")
                #expect(renamed.imagePath == "u1/a.png")
                #expect(renamed.createdAt == created.createdAt)
                let reimaged = try await store.update(uid: "u1", username: nil, imagePath: "u1/b.png")
                #expect(reimaged.username == "Mina")
                #expect(reimaged.imagePath == "u1/b.png")
            }
        }

        @Test("an update that changes nothing records no event", arguments: StoreKind.available)
        func noOpUpdate(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                let created = try await store.create(uid: "u1", username: "mina", imagePath: nil)
                #expect(try await store.update(uid: "u1", username: nil, imagePath: nil) == created)
                #expect(try await store.update(uid: "u1", username: "mina", imagePath: nil) == created)
                #expect(try await outboxRows(store).map(\.type) == [ProfileCreated.type])
            }
        }

        @Test("an update cannot take someone else's name or change a missing profile", arguments: StoreKind.available)
        func updateRefusals(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                _ = try await store.create(uid: "u1", username: "mina", imagePath: nil)
                _ = try await store.create(uid: "u2", username: "jun", imagePath: nil)
                let taken = await refusal { _ = try await store.update(uid: "u2", username: "MINA", imagePath: nil) }
                #expect(taken?.code == .usernameTaken)
                let missing = await refusal { _ = try await store.update(uid: "u3", username: "sora", imagePath: nil) }
                #expect(missing?.code == .profileNotFound)
                let empty = await refusal { _ = try await store.update(uid: "u1", username: nil, imagePath: "") }
                #expect(empty?.code == .invalidRequest)
                #expect(try await store.fetch(uid: "u2")?.username == "jun")
            }
        }

        @Test("an image path must be one of the person's own images, of the shape image-upload makes", arguments: [
            "", "u1/", "u2/a.png", "u1/../u2/a.png", "u1/..", "/u1/a.png", "a.png", "u10/a.png",
            "u1/evil<script>.html", "u1/a.html", "u1/a.gif", "u1/a.PNG", "u1/a.jpg", "u1/a", "u1/a.png.html",
            "u1/a.thumb.png", "u1/.upload-x.tmp", "u1/a b.png", "u1/a.png/", "u1//a.png", "u1/키.png",
            "u1/\(String(repeating: "k", count: 65)).png", "u1/" + String(repeating: "x", count: 70_000),
        ])
        func imagePathRefusals(path: String) async throws {
            let store = try await makeStore()
            let create = await refusal { _ = try await store.create(uid: "u1", username: "mina", imagePath: path) }
            #expect(create?.code == .invalidRequest)
            _ = try await store.create(uid: "u1", username: "mina", imagePath: "u1/a.png")
            let update = await refusal { _ = try await store.update(uid: "u1", username: nil, imagePath: path) }
            #expect(update?.code == .invalidRequest)
            #expect(try await store.fetch(uid: "u1")?.imagePath == "u1/a.png")
        }

        @Test("image paths of the shapes image-upload makes are accepted", arguments: [
            "u1/9b1e4f2a-7c3d-4e8f-a6b5-0d2c1e9f8a7b.jpeg", "u1/Set-Up_1.webp", "u1/a.png", "u1/k.heic",
            "u1/\(String(repeating: "k", count: 64)).png",
        ])
        func imagePathShapes(path: String) async throws {
            let store = try await makeStore()
            #expect(try await store.create(uid: "u1", username: "mina", imagePath: path).imagePath == path)
            #expect(try await store.update(uid: "u1", username: nil, imagePath: path).imagePath == path)
        }

        @Test("deleting a profile frees its username", arguments: StoreKind.available)
        func deleteFreesName(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                _ = try await store.create(uid: "u1", username: "mina", imagePath: nil)
                #expect(try await store.delete(uid: "u1", reason: .withdrawal))
                #expect(try await store.fetch(uid: "u1") == nil)
                #expect(try await store.availability(of: "Mina").available)
                _ = try await store.create(uid: "u2", username: "Mina", imagePath: nil)
                #expect(try await store.delete(uid: "u1", reason: .request) == false)
            }
        }

        @Test("every change has its event row, in order, and a refused change has none", arguments: StoreKind.available)
        func eventsCommitWithChanges(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                _ = try await store.create(uid: "u1", username: "mina", imagePath: nil)
                _ = await refusal { _ = try await store.create(uid: "u2", username: "MINA", imagePath: nil) }
                _ = await refusal { _ = try await store.create(uid: "u1", username: "other", imagePath: nil) }
                _ = try await store.update(uid: "u1", username: "sora", imagePath: nil)
                _ = await refusal { _ = try await store.update(uid: "u2", username: "jun", imagePath: nil) }
                _ = try await store.delete(uid: "u1", reason: .request)
                _ = try await store.delete(uid: "u1", reason: .request)
                #expect(try await outboxRows(store) == [
                    OutboxRow(sequence: 1, type: ProfileCreated.type, uid: "u1"),
                    OutboxRow(sequence: 2, type: ProfileUpdated.type, uid: "u1"),
                    OutboxRow(sequence: 3, type: ProfileDeleted.type, uid: "u1"),
                ])
                #expect(try await store.fetch(uid: "u1") == nil)
                #expect(try await store.availability(of: "sora").available)
            }
        }

        @Test("the commit observer hears each change in commit order")
        func commitObserver() async throws {
            let heard = Mutex<[String]>([])
            let store = try await makeStore { uid, profile, sequence in
                heard.withLock { $0.append("\(uid):\(profile?.username ?? "deleted")@\(sequence)") }
            }
            _ = try await store.create(uid: "u1", username: "mina", imagePath: nil)
            _ = await refusal { _ = try await store.create(uid: "u2", username: "mina", imagePath: nil) }
            _ = try await store.update(uid: "u1", username: "sora", imagePath: nil)
            _ = try await store.delete(uid: "u1", reason: .request)
            #expect(heard.withLock { $0 } == ["u1:mina@1", "u1:sora@2", "u1:deleted@3"], "a refused claim uses no sequence")
        }

        @Test("every answer says how new it is, on the store's event sequence", arguments: StoreKind.available)
        func answersCarryTheirSequence(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                #expect(try await store.read(uid: "u1") == ProfileResult(profile: nil, asOfSequence: 0))
                let created = try await store.createRecorded(uid: "u1", username: "mina", imagePath: nil, idempotencyKey: "k1")
                #expect(created.sequence == 1)
                #expect(try await store.read(uid: "u1") == ProfileResult(profile: created.profile, asOfSequence: 1))
                _ = try await store.create(uid: "u2", username: "sora", imagePath: nil)
                #expect(try await store.read(uid: "u1").asOfSequence == 1, "a profile is as new as its own last change")
                let repeated = try await store.createRecorded(uid: "u1", username: "mina", imagePath: nil, idempotencyKey: "k1")
                #expect(repeated.sequence == 1, "a repeated create answers with the profile's own sequence")
                let unchanged = try await store.updateRecorded(uid: "u2", username: "sora", imagePath: nil)
                #expect(unchanged.sequence == 2)
                let renamed = try await store.updateRecorded(uid: "u2", username: "hana", imagePath: nil)
                #expect(renamed.sequence == 3)
                _ = try await store.delete(uid: "u1", reason: .request)
                #expect(try await store.read(uid: "u1") == ProfileResult(profile: nil, asOfSequence: 4),
                    "no profile is as new as everything recorded so far")
            }
        }

        @Test("once creates are abandoned through an attempt, none at or below it makes a profile", arguments: StoreKind.available)
        func abandonedCreates(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                #expect(try await store.abandonCreates(uid: "u1", through: 5) == ProfileResult(profile: nil, asOfSequence: 0))
                for attempt: UInt64 in [3, 5] {
                    let late = await refusal {
                        _ = try await store.createRecorded(
                            uid: "u1", username: "mina", imagePath: nil, idempotencyKey: "k\(attempt)",
                            attempt: attempt, correlationId: nil)
                    }
                    #expect(late?.code == .invalidRequest)
                    #expect(late?.reason == "createAbandoned")
                }
                #expect(try await outboxRows(store).isEmpty, "a refused create records nothing")
                #expect(try await store.fetch(uid: "u1") == nil)
                // Another person's creates, creates without an attempt and later attempts go through.
                _ = try await store.createRecorded(
                    uid: "u2", username: "sora", imagePath: nil, idempotencyKey: "k1", attempt: 1, correlationId: nil)
                // A lower number than one given before changes nothing.
                _ = try await store.abandonCreates(uid: "u1", through: 2)
                let created = try await store.createRecorded(
                    uid: "u1", username: "mina", imagePath: nil, idempotencyKey: "k6", attempt: 6, correlationId: nil)
                // Abandoning answers with the profile as it is, and a repeat of the key that made it still gets it.
                #expect(try await store.abandonCreates(uid: "u1", through: 6) == ProfileResult(profile: created.profile, asOfSequence: 2))
                let repeated = try await store.createRecorded(
                    uid: "u1", username: "mina", imagePath: nil, idempotencyKey: "k6", attempt: 6, correlationId: nil)
                #expect(repeated.profile == created.profile)
                #expect(try await outboxRows(store).count == 2, "abandoning records no event")
            }
        }

        @Test("a store that fails says so, and never answers \"no profile\"")
        func failureIsNotAbsence() async throws {
            let store = try await makeStore()
            try await store.writer.write { db in try db.drop(table: "profile") }
            let fetch = await refusal { _ = try await store.fetch(uid: "u1") }
            #expect(fetch?.code == .storeUnavailable)
            #expect(fetch?.message.contains("profile") == true)
            #expect(fetch?.message.contains("SELECT") == false)
            let check = await refusal { _ = try await store.availability(of: "mina") }
            #expect(check?.code == .storeUnavailable)
        }

        @Test("two people claiming one free name at once: exactly one wins", arguments: StoreKind.available, [2, 16])
        func concurrentClaims(kind: StoreKind, claimants: Int) async throws {
            try await withProfileDatabase(kind, inMemory: false) { database async throws in
                try await withProfileStore(of: database) { store async throws in
                    let results = await withTaskGroup(of: ServiceError?.self) { group in
                        for index in 0..<claimants {
                            group.addTask {
                                await refusalOrNil { _ = try await store.create(uid: "u\(index)", username: index.isMultiple(of: 2) ? "Mina" : "mINA", imagePath: nil) }
                            }
                        }
                        return await group.reduce(into: []) { $0.append($1) }
                    }
                    #expect(results.filter { $0 == nil }.count == 1)
                    #expect(results.compactMap { $0?.code } == Array(repeating: .usernameTaken, count: claimants - 1))
                    #expect(try await outboxRows(store).count == 1)
                }
            }
        }

        @Test("two stores on one database (as two processes or replicas would be): exactly one wins", arguments: StoreKind.available)
        func concurrentClaimsAcrossConnections(kind: StoreKind) async throws {
            try await withProfileDatabase(kind, inMemory: false) { database async throws in
                try await withProfileStore(of: database) { first async throws in
                    try await withProfileStore(of: database) { second async throws in
                        let results = await withTaskGroup(of: ServiceError?.self) { group in
                            for index in 0..<8 {
                                let store = index.isMultiple(of: 2) ? first : second
                                group.addTask {
                                    await refusalOrNil { _ = try await store.create(uid: "u\(index)", username: "sora", imagePath: nil) }
                                }
                            }
                            return await group.reduce(into: []) { $0.append($1) }
                        }
                        #expect(results.filter { $0 == nil }.count == 1)
                        #expect(results.allSatisfy { $0 == nil || $0?.code == .usernameTaken })
                        #expect(try await outboxRows(first).map(\.sequence) == [1])
                    }
                }
            }
        }
    }
}

/// `nil` when `body` succeeds, otherwise the `ServiceError` it threw.
private func refusalOrNil(_ body: () async throws -> Void) async -> ServiceError? {
    do {
        try await body()
        return nil
    } catch let error as ServiceError {
        return error
    } catch {
        return ServiceError(.internalError, "\(error)")
    }
}
