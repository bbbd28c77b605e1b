import Foundation
import GRDB
import Messaging
import OnboardingAPI
@testable import ProfileService
import TestSupport
import ServiceRuntime
import Testing

extension ProfileServiceTests {
    @Suite("Idempotent create")
    struct IdempotentCreateTests {
        @Test("a create that repeats the key of the one that made the profile gets that profile, and no second event", arguments: StoreKind.available)
        func sameKeyAnswersTheProfile(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                let created = try await store.create(uid: "u1", username: "mina", imagePath: "u1/a.png", idempotencyKey: "key-1")
                let again = try await store.create(uid: "u1", username: "mina", imagePath: "u1/a.png", idempotencyKey: "key-1")
                #expect(again == created)
                #expect(try await outboxRows(store).map(\.type) == [ProfileCreated.type])
            }
        }

        @Test("the retry is answered with the profile as it is now, whatever the retry's fields say", arguments: StoreKind.available)
        func retryAnswersTheCurrentProfile(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                _ = try await store.create(uid: "u1", username: "mina", imagePath: nil, idempotencyKey: "key-1")
                let renamed = try await store.update(uid: "u1", username: "sora", imagePath: nil)
                let again = try await store.create(uid: "u1", username: "other", imagePath: nil, idempotencyKey: "key-1")
                #expect(again == renamed)
                #expect(try await outboxRows(store).map(\.type) == [ProfileCreated.type, ProfileUpdated.type])
            }
        }

        @Test("another key, no key, or a key after a create without one is profileExists", arguments: [
            ("key-1", "key-2"), ("key-1", nil), (nil, "key-1"), ("Key-1", "key-1"),
        ] as [(String?, String?)])
        func otherKeysAreRefused(first: String?, second: String?) async throws {
            let store = try await makeStore()
            _ = try await store.create(uid: "u1", username: "mina", imagePath: nil, idempotencyKey: first)
            let error = await refusal {
                _ = try await store.create(uid: "u1", username: "mina", imagePath: nil, idempotencyKey: second)
            }
            #expect(error?.code == .profileExists)
            #expect(try await outboxRows(store).count == 1)
        }

        @Test("keys belong to the person: the same key for someone else creates their profile", arguments: StoreKind.available)
        func keysAreScopedToThePerson(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                _ = try await store.create(uid: "u1", username: "mina", imagePath: nil, idempotencyKey: "shared")
                let other = try await store.create(uid: "u2", username: "sora", imagePath: nil, idempotencyKey: "shared")
                #expect(other.uid == "u2")
                let taken = await refusal { _ = try await store.create(uid: "u3", username: "MINA", imagePath: nil, idempotencyKey: "shared") }
                #expect(taken?.code == .usernameTaken)
            }
        }

        @Test("a malformed key is refused as an invalid request, and nothing is stored", arguments: [
            "", String(repeating: "k", count: 65), "a b", "a.b", "키", "a/b",
        ])
        func malformedKey(key: String) async throws {
            let store = try await makeStore()
            let error = await refusal { _ = try await store.create(uid: "u1", username: "mina", imagePath: nil, idempotencyKey: key) }
            #expect(error?.code == .invalidRequest)
            #expect(error?.message.contains("idempotencyKey") == true)
            #expect(try await store.fetch(uid: "u1") == nil)
        }

        @Test("the longest key and a UUID are accepted", arguments: StoreKind.available)
        func wellFormedKeys(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                _ = try await store.create(uid: "u1", username: "mina", imagePath: nil, idempotencyKey: String(repeating: "K", count: 64))
                _ = try await store.create(uid: "u2", username: "sora", imagePath: nil, idempotencyKey: IdempotencyKey.make())
            }
        }

        @Test("after a delete, the same key creates a new profile", arguments: StoreKind.available)
        func deleteForgetsTheKey(kind: StoreKind) async throws {
            try await withProfileStore(kind) { store async throws in
                _ = try await store.create(uid: "u1", username: "mina", imagePath: nil, idempotencyKey: "key-1")
                #expect(try await store.delete(uid: "u1", reason: .request))
                let again = try await store.create(uid: "u1", username: "sora", imagePath: nil, idempotencyKey: "key-1")
                #expect(again.username == "sora")
                #expect(try await outboxRows(store).map(\.type) == [ProfileCreated.type, ProfileDeleted.type, ProfileCreated.type])
            }
        }

        @Test("simultaneous creates with one key all get the one profile, recorded once", arguments: StoreKind.available)
        func concurrentRetries(kind: StoreKind) async throws {
            try await withProfileDatabase(kind, inMemory: false) { database async throws in
                try await withProfileStore(of: database) { store async throws in
                    let profiles = try await withThrowingTaskGroup(of: Profile.self) { group in
                        for _ in 0..<8 {
                            group.addTask { try await store.create(uid: "u1", username: "mina", imagePath: nil, idempotencyKey: "key-1") }
                        }
                        return try await group.reduce(into: []) { $0.append($1) }
                    }
                    #expect(Set(profiles).count == 1)
                    #expect(try await outboxRows(store).count == 1)
                }
            }
        }

        @Test("the key survives a restart, and profiles made before the key column existed have none")
        func keyIsStoredAndMigrated() async throws {
            try await withTemporaryFolder { directory async throws in
                let path = directory.appendingPathComponent("profile.sqlite").path
                // A database as the first version of the service left it, with one profile.
                let old = try ServiceDatabase.open(path: path)
                try ProfileStore.migrator().migrate(old, upTo: "profile-v1")
                try await old.write { db in
                    try db.execute(
                        sql: """
                            INSERT INTO profile (uid, username, usernameKey, imagePath, createdAt, updatedAt)
                            VALUES ('u0', 'old', 'old', NULL, '2024-01-01T00:00:00.000Z', '2024-01-01T00:00:00.000Z')
                            """)
                }
                try old.close()

                let store = try await makeStore(writer: ProfileStore.openDatabase(path: path))
                let created = try await store.create(uid: "u1", username: "mina", imagePath: nil, idempotencyKey: "key-1")
                let keys = try await store.writer.read { db in
                    try Row.fetchAll(db, sql: "SELECT uid, createKey FROM profile ORDER BY uid").map {
                        "\($0["uid"] as String)=\(($0["createKey"] as String?) ?? "nil")"
                    }
                }
                #expect(keys == ["u0=nil", "u1=key-1"])
                let unkeyed = await refusal { _ = try await store.create(uid: "u0", username: "old", imagePath: nil, idempotencyKey: "key-0") }
                #expect(unkeyed?.code == .profileExists)
                try store.writer.close()

                let reopened = try await makeStore(writer: ProfileStore.openDatabase(path: path))
                #expect(try await reopened.create(uid: "u1", username: "mina", imagePath: nil, idempotencyKey: "key-1") == created)
            }
        }

        @Test("through the bus: a retried profile.create is answered with the profile and publishes nothing more")
        func throughTheBus() async throws {
            try await RunningProfileService.with { service async throws in
                let events = try await service.events()
                let request = CreateProfile(username: "mina", imagePath: "u1/a.png", idempotencyKey: "set-up-1")
                let first = try #require(try await service.call(request, uid: "u1").profile)
                let again = try #require(try await service.call(request, uid: "u1").profile)
                #expect(again == first)
                #expect(try await service.call(GetProfile(), uid: "u1").profile == first)

                let other = await refusal {
                    _ = try await service.call(CreateProfile(username: "mina", idempotencyKey: "set-up-2"), uid: "u1")
                }
                #expect(other?.code == .profileExists)
                let malformed = await refusal {
                    _ = try await service.call(CreateProfile(username: "sora", idempotencyKey: "not valid"), uid: "u2")
                }
                #expect(malformed?.code == .invalidRequest)

                // A marker change: the event after the first create is the marker's, not a second create.
                _ = try await service.call(CreateProfile(username: "jun"), uid: "u3")
                let created = try await events.next()
                #expect(try created.payload(as: ProfileCreated.self).profile == first)
                let marker = try await events.next()
                #expect(marker.header.uid == "u3")
                #expect(marker.header.sequence == 2)
            }
        }
    }
}
