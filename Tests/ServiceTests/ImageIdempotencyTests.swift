import Foundation
import ImageUploadService
import Messaging
import OnboardingAPI
import ServiceRuntime
import Testing

extension ImageUploadServiceTests {
    func upload(_ bytes: Data, key: String?, uid: String? = nil, on bus: InProcessBus? = nil) async throws -> StoredImage {
        try await (bus ?? self.bus).call(
            UploadImage(contentType: "image/png", idempotencyKey: key), to: rpc, source: "test", uid: uid ?? self.uid,
            attachment: bytes, timeout: Self.callTimeout)
    }

    /// The image and thumbnail an upload with `key` stores, with its size.
    func keyed(_ key: String, _ kind: ImageKind, bytes: Int, uid: String? = nil) -> StoredImage {
        let uid = uid ?? self.uid
        return StoredImage(
            path: "\(uid)/\(key).\(kind.fileExtension)", kind: kind, bytes: bytes,
            thumbnailPath: "\(uid)/\(key).thumb.\(kind.fileExtension)")
    }

    func keyedFiles(_ key: String, _ kind: ImageKind) -> [String] {
        ["\(key).\(kind.fileExtension)", "\(key).thumb.\(kind.fileExtension)"].sorted()
    }

    func deleteAll(keep: String?, uid: String? = nil) async throws -> DeletedImages {
        try await bus.call(DeleteAllImages(keep: keep), to: rpc, source: "test", uid: uid ?? self.uid, timeout: Self.callTimeout)
    }

    // MARK: Idempotent uploads

    @Test("a repeated upload with one key answers the image stored the first time, named after the key")
    func repeatedKeyedUpload() async throws {
        try await withImages { directory in
            let key = IdempotencyKey.make()
            let first = try await upload(Samples.png, key: key)
            #expect(first == keyed(key, .png, bytes: first.bytes))
            let again = try await upload(Samples.png, key: key)
            #expect(again == first)
            #expect(contents(of: "\(directory)/\(uid)") == keyedFiles(key, .png))
        }
    }

    @Test("a repeated key answers the first image with its own kind and size, even when the bytes differ")
    func repeatedKeyOtherBytes() async throws {
        try await withImages { directory in
            let first = try await upload(Samples.jpeg, key: "Set-Up_1")
            let storedBytes = FileManager.default.contents(atPath: "\(directory)/\(first.path)")
            let again = try await upload(Samples.png + Data([0, 0, 0]), key: "Set-Up_1")
            #expect(again == first)
            #expect(again.kind == .jpeg && again.bytes == storedBytes?.count)
            #expect(FileManager.default.contents(atPath: "\(directory)/\(first.path)") == storedBytes)
            #expect(contents(of: "\(directory)/\(uid)") == keyedFiles("Set-Up_1", .jpeg))
        }
    }

    @Test("a repeated key is answered without decoding: even bytes that are not an image get the first image")
    func repeatedKeyIsNotDecoded() async throws {
        try await withImages { _ in
            let first = try await upload(Samples.webp, key: "again")
            #expect(try await upload(Data(SampleBytes.png), key: "again") == first)
        }
    }

    @Test("keys belong to the person, and uploads without a key still get new names")
    func keysAreScopedToThePerson() async throws {
        try await withImages { directory in
            let mine = try await upload(Samples.png, key: "shared")
            let theirs = try await upload(Samples.png, key: "shared", uid: "someone-else")
            #expect(mine.path == "\(uid)/shared.png")
            #expect(theirs.path == "someone-else/shared.png")
            let unkeyed = try await upload(Samples.png, key: nil)
            #expect(unkeyed.path != mine.path)
            #expect(contents(of: "\(directory)/\(uid)").count == 4)
        }
    }

    @Test("simultaneous uploads with one key store one file and all get its path")
    func concurrentKeyedUploads() async throws {
        try await withImages { directory in
            let key = IdempotencyKey.make()
            let results = try await withThrowingTaskGroup(of: StoredImage.self) { group in
                for _ in 0..<8 {
                    group.addTask { try await upload(Samples.webp, key: key) }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(results.count == 8)
            #expect(Set(results).count == 1)
            #expect(results.first == keyed(key, .webp, bytes: results.first?.bytes ?? 0))
            #expect(contents(of: "\(directory)/\(uid)") == keyedFiles(key, .webp))
        }
    }

    @Test("a key is remembered across a restart, and the start-up sweep keeps keyed images")
    func keyedUploadSurvivesRestart() async throws {
        try await withTemporaryDirectory { directory in
            let configuration = ImageUploadService.Configuration(rpc: rpc, directory: directory)
            let key = IdempotencyKey.make()
            let first = try await withRunningService(
                try ImageUploadService(configuration: configuration, bus: bus, logger: quietLogger), on: bus, answeringAt: rpc
            ) { try await upload(Samples.jpeg, key: key) }
            // A crash during a later upload left a temporary file beside the image.
            let leftover = "\(directory)/\(uid)/.upload-\(UUID().uuidString.lowercased()).tmp"
            try Samples.png.write(to: URL(fileURLWithPath: leftover))
            try backdate(leftover)

            let restarted = InProcessBus()
            let again = try await withRunningService(
                try ImageUploadService(configuration: configuration, bus: restarted, logger: quietLogger), on: restarted,
                answeringAt: rpc
            ) { try await upload(Samples.jpeg, key: key, on: restarted) }
            #expect(again == first)
            #expect(contents(of: "\(directory)/\(uid)") == keyedFiles(key, .jpeg))
        }
    }

    @Test("once the keyed image is deleted, the key stores anew")
    func deletedKeyStoresAgain() async throws {
        try await withImages { directory in
            let first = try await upload(Samples.png, key: "attempt-1")
            #expect(try await delete(first.path).deleted == 1)
            let again = try await upload(Samples.jpeg, key: "attempt-1")
            #expect(again == keyed("attempt-1", .jpeg, bytes: again.bytes))
            #expect(contents(of: "\(directory)/\(uid)") == keyedFiles("attempt-1", .jpeg))
        }
    }

    @Test("a malformed key is refused as an invalid request, and nothing is stored", arguments: [
        "", "a.b", "../x", "a/b", "키", String(repeating: "k", count: 65),
    ])
    func malformedUploadKey(key: String) async throws {
        try await withImages { directory in
            let error = try await expectRefusal(.invalidRequest) { try await upload(Samples.png, key: key) }
            #expect(error?.message.contains("idempotencyKey") == true)
            #expect(contents(of: directory).isEmpty)
        }
    }

    // MARK: Deleting all but one

    @Test("deleting all images but the one to keep leaves exactly that one")
    func deleteAllKeepingOne() async throws {
        try await withImages { directory in
            let stray = try await upload(Samples.png, key: nil)
            let kept = try await upload(Samples.jpeg, key: "set-up")
            let other = try await upload(Samples.webp, key: "older")
            let theirs = try await upload(Samples.png, key: nil, uid: "someone-else")
            #expect(try await deleteAll(keep: kept.path).deleted == 2)
            #expect(contents(of: "\(directory)/\(uid)") == keyedFiles("set-up", .jpeg))
            #expect(!FileManager.default.fileExists(atPath: "\(directory)/\(stray.path)"))
            #expect(!FileManager.default.fileExists(atPath: "\(directory)/\(other.path)"))
            #expect(FileManager.default.fileExists(atPath: "\(directory)/\(theirs.path)"))
            #expect(try await deleteAll(keep: kept.path).deleted == 0)
            #expect(contents(of: "\(directory)/\(uid)") == keyedFiles("set-up", .jpeg))
        }
    }

    @Test("a keep path that is no longer there keeps nothing, and the folder goes")
    func deleteAllKeepingAMissingImage() async throws {
        try await withImages { directory in
            _ = try await upload(Samples.png, key: nil)
            #expect(try await deleteAll(keep: "\(uid)/gone.png").deleted == 1)
            #expect(contents(of: directory).isEmpty)
            #expect(try await deleteAll(keep: "\(uid)/gone.png").deleted == 0)
        }
    }

    @Test("a keep path that is not one of the person's images is refused, and nothing is deleted", arguments: [
        "someone-else/{file}", "{file}", "{uid}/", "{uid}/../someone-else/{file}", "/{uid}/{file}", "{uid}/x.gif", "",
        "{uid}/kept.thumb.png",
    ])
    func deleteAllWithForeignKeep(template: String) async throws {
        try await withImages { directory in
            let stored = try await upload(Samples.png, key: "kept")
            let keep = template
                .replacingOccurrences(of: "{uid}", with: uid)
                .replacingOccurrences(of: "{file}", with: String(stored.path.dropFirst(uid.count + 1)))
            try await expectRefusal(.invalidRequest) { try await deleteAll(keep: keep) }
            #expect(FileManager.default.fileExists(atPath: "\(directory)/\(stored.path)"))
        }
    }
}
