import Foundation
import ImageUploadService
import Messaging
import OnboardingAPI
import ServiceRuntime
import Testing

extension ImageUploadServiceTests {
    func upload(_ bytes: [UInt8], key: String?, uid: String? = nil, on bus: InProcessBus? = nil) async throws -> StoredImage {
        try await (bus ?? self.bus).call(
            UploadImage(contentType: "image/png", idempotencyKey: key), to: rpc, source: "test", uid: uid ?? self.uid,
            attachment: Data(bytes))
    }

    func deleteAll(keep: String?, uid: String? = nil) async throws -> DeletedImages {
        try await bus.call(DeleteAllImages(keep: keep), to: rpc, source: "test", uid: uid ?? self.uid)
    }

    // MARK: Idempotent uploads

    @Test("a repeated upload with one key answers the image stored the first time, named after the key")
    func repeatedKeyedUpload() async throws {
        try await withImages { directory in
            let key = IdempotencyKey.make()
            let first = try await upload(SampleBytes.png, key: key)
            #expect(first == StoredImage(path: "\(uid)/\(key).png", kind: .png, bytes: SampleBytes.png.count))
            let again = try await upload(SampleBytes.png, key: key)
            #expect(again == first)
            #expect(contents(of: "\(directory)/\(uid)") == ["\(key).png"])
        }
    }

    @Test("a repeated key answers the first image with its own kind and size, even when the bytes differ")
    func repeatedKeyOtherBytes() async throws {
        try await withImages { directory in
            let first = try await upload(SampleBytes.jpeg, key: "Set-Up_1")
            let again = try await upload(SampleBytes.png + [0, 0, 0], key: "Set-Up_1")
            #expect(again == first)
            #expect(again.kind == .jpeg && again.bytes == SampleBytes.jpeg.count)
            #expect(FileManager.default.contents(atPath: "\(directory)/\(first.path)") == Data(SampleBytes.jpeg))
            #expect(contents(of: "\(directory)/\(uid)") == ["Set-Up_1.jpeg"])
        }
    }

    @Test("keys belong to the person, and uploads without a key still get new names")
    func keysAreScopedToThePerson() async throws {
        try await withImages { directory in
            let mine = try await upload(SampleBytes.png, key: "shared")
            let theirs = try await upload(SampleBytes.png, key: "shared", uid: "someone-else")
            #expect(mine.path == "\(uid)/shared.png")
            #expect(theirs.path == "someone-else/shared.png")
            let unkeyed = try await upload(SampleBytes.png, key: nil)
            #expect(unkeyed.path != mine.path)
            #expect(contents(of: "\(directory)/\(uid)").count == 2)
        }
    }

    @Test("simultaneous uploads with one key store one file and all get its path")
    func concurrentKeyedUploads() async throws {
        try await withImages { directory in
            let key = IdempotencyKey.make()
            let results = try await withThrowingTaskGroup(of: StoredImage.self) { group in
                for _ in 0..<8 {
                    group.addTask { try await upload(SampleBytes.webp, key: key) }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(results.count == 8)
            #expect(Set(results) == [StoredImage(path: "\(uid)/\(key).webp", kind: .webp, bytes: SampleBytes.webp.count)])
            #expect(contents(of: "\(directory)/\(uid)") == ["\(key).webp"])
        }
    }

    @Test("a key is remembered across a restart, and the start-up sweep keeps keyed images")
    func keyedUploadSurvivesRestart() async throws {
        try await withTemporaryDirectory { directory in
            let configuration = ImageUploadService.Configuration(rpc: rpc, directory: directory)
            let key = IdempotencyKey.make()
            let first = try await withRunningService(
                try ImageUploadService(configuration: configuration, bus: bus, logger: quietLogger), on: bus, answeringAt: rpc
            ) { try await upload(SampleBytes.heic, key: key) }
            // A crash during a later upload left a temporary file beside the image.
            let leftover = "\(directory)/\(uid)/.upload-\(UUID().uuidString.lowercased()).tmp"
            try Data(SampleBytes.png).write(to: URL(fileURLWithPath: leftover))

            let restarted = InProcessBus()
            let again = try await withRunningService(
                try ImageUploadService(configuration: configuration, bus: restarted, logger: quietLogger), on: restarted,
                answeringAt: rpc
            ) { try await upload(SampleBytes.heic, key: key, on: restarted) }
            #expect(again == first)
            #expect(contents(of: "\(directory)/\(uid)") == ["\(key).heic"])
        }
    }

    @Test("once the keyed image is deleted, the key stores anew")
    func deletedKeyStoresAgain() async throws {
        try await withImages { directory in
            let first = try await upload(SampleBytes.png, key: "attempt-1")
            #expect(try await delete(first.path).deleted == 1)
            let again = try await upload(SampleBytes.jpeg, key: "attempt-1")
            #expect(again == StoredImage(path: "\(uid)/attempt-1.jpeg", kind: .jpeg, bytes: SampleBytes.jpeg.count))
            #expect(contents(of: "\(directory)/\(uid)") == ["attempt-1.jpeg"])
        }
    }

    @Test("a malformed key is refused as an invalid request, and nothing is stored", arguments: [
        "", "a.b", "../x", "a/b", "키", String(repeating: "k", count: 65),
    ])
    func malformedUploadKey(key: String) async throws {
        try await withImages { directory in
            let error = try await expectRefusal(.invalidRequest) { try await upload(SampleBytes.png, key: key) }
            #expect(error?.message.contains("idempotencyKey") == true)
            #expect(contents(of: directory).isEmpty)
        }
    }

    // MARK: Deleting all but one

    @Test("deleting all images but the one to keep leaves exactly that one")
    func deleteAllKeepingOne() async throws {
        try await withImages { directory in
            let stray = try await upload(SampleBytes.png, key: nil)
            let kept = try await upload(SampleBytes.jpeg, key: "set-up")
            let other = try await upload(SampleBytes.webp, key: "older")
            let theirs = try await upload(SampleBytes.png, key: nil, uid: "someone-else")
            #expect(try await deleteAll(keep: kept.path).deleted == 2)
            #expect(contents(of: "\(directory)/\(uid)") == ["set-up.jpeg"])
            #expect(!FileManager.default.fileExists(atPath: "\(directory)/\(stray.path)"))
            #expect(!FileManager.default.fileExists(atPath: "\(directory)/\(other.path)"))
            #expect(FileManager.default.fileExists(atPath: "\(directory)/\(theirs.path)"))
            #expect(try await deleteAll(keep: kept.path).deleted == 0)
            #expect(contents(of: "\(directory)/\(uid)") == ["set-up.jpeg"])
        }
    }

    @Test("a keep path that is no longer there keeps nothing, and the folder goes")
    func deleteAllKeepingAMissingImage() async throws {
        try await withImages { directory in
            _ = try await upload(SampleBytes.png, key: nil)
            #expect(try await deleteAll(keep: "\(uid)/gone.png").deleted == 1)
            #expect(contents(of: directory).isEmpty)
            #expect(try await deleteAll(keep: "\(uid)/gone.png").deleted == 0)
        }
    }

    @Test("a keep path that is not one of the person's images is refused, and nothing is deleted", arguments: [
        "someone-else/{file}", "{file}", "{uid}/", "{uid}/../someone-else/{file}", "/{uid}/{file}", "{uid}/x.gif", "",
    ])
    func deleteAllWithForeignKeep(template: String) async throws {
        try await withImages { directory in
            let stored = try await upload(SampleBytes.png, key: "kept")
            let keep = template
                .replacingOccurrences(of: "{uid}", with: uid)
                .replacingOccurrences(of: "{file}", with: String(stored.path.dropFirst(uid.count + 1)))
            try await expectRefusal(.invalidRequest) { try await deleteAll(keep: keep) }
            #expect(FileManager.default.fileExists(atPath: "\(directory)/\(stored.path)"))
        }
    }
}
