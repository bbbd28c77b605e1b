import Foundation
import ImageFixtures
import ImageUploadService
import Logging
import Messaging
import OnboardingAPI
import OnboardingSettings
import ServiceRuntime
import Synchronization
import TestSupport
import Testing

/// The first bytes of each kind, and of things that are not accepted images, for the sniffer
/// (whole images for uploads are in ``Samples``).
enum SampleBytes {
    static func ascii(_ text: String) -> [UInt8] { Array(text.utf8) }

    static let png: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]
        + [0x00, 0x00, 0x00, 0x0D] + ascii("IHDR") + [0, 0, 0, 1, 0, 0, 0, 1, 8, 6, 0, 0, 0]
    static let jpeg: [UInt8] = [0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10] + ascii("JFIF") + [0x00, 0x01, 0x01]
    static let webp: [UInt8] = ascii("RIFF") + [0x1A, 0x00, 0x00, 0x00] + ascii("WEBPVP8L") + [0x0D, 0, 0, 0, 0x2F]
    static let heic: [UInt8] = [0x00, 0x00, 0x00, 0x18] + ascii("ftypheic") + [0, 0, 0, 0] + ascii("mif1heic")
    static let heifWithHEICCompatibleBrand: [UInt8] = [0x00, 0x00, 0x00, 0x18] + ascii("ftypmif1") + [0, 0, 0, 0]
        + ascii("mif1heic")
    static let avif: [UInt8] = [0x00, 0x00, 0x00, 0x1C] + ascii("ftypavif") + [0, 0, 0, 0] + ascii("avifmif1miaf")
    static let mp4: [UInt8] = [0x00, 0x00, 0x00, 0x18] + ascii("ftypisom") + [0, 0, 0, 0] + ascii("isomiso2")
    static let gif: [UInt8] = ascii("GIF89a") + [0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00]
    static let pdf: [UInt8] = ascii("%PDF-1.7\n%\u{e2}\u{e3}")
    static let wave: [UInt8] = ascii("RIFF") + [0x24, 0, 0, 0] + ascii("WAVEfmt ")
    static let text: [UInt8] = ascii("hello, this is not an image")
    /// An `ftyp` box declared 12 bytes long (too short to hold a minor version), with `heic`
    /// in the bytes after it.
    static let ftypTooShortWithHEICAfter: [UInt8] = [0x00, 0x00, 0x00, 0x0C] + ascii("ftypisom") + [0, 0, 0, 0]
        + ascii("heicheic")
    /// A valid `isom` box of 20 bytes, followed by bytes that spell `heic`.
    static let isomWithHEICAfterTheBox: [UInt8] = [0x00, 0x00, 0x00, 0x14] + ascii("ftypisom") + [0, 0, 0, 0]
        + ascii("isom") + ascii("heic")
    static let heicBoxLargerThanTheBytes: [UInt8] = [0x00, 0x00, 0x00, 0x40] + ascii("ftypheic") + [0, 0, 0, 0]
        + ascii("mif1heic")
    static let heicBoxWithPartialBrand: [UInt8] = [0x00, 0x00, 0x00, 0x1A] + ascii("ftypheic") + [0, 0, 0, 0]
        + ascii("mif1heic") + [0, 0]
    static let heicBoxToEndOfFile: [UInt8] = [0x00, 0x00, 0x00, 0x00] + ascii("ftypheic") + [0, 0, 0, 0]
        + ascii("mif1heic")
    static let heicWithLargeSize: [UInt8] = [0x00, 0x00, 0x00, 0x01] + ascii("ftyp") + [0, 0, 0, 0, 0, 0, 0, 0x20]
        + ascii("heic") + [0, 0, 0, 0] + ascii("mif1heic")
    static let heicWithHugeLargeSize: [UInt8] = [0x00, 0x00, 0x00, 0x01] + ascii("ftyp")
        + [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF] + ascii("heic") + [0, 0, 0, 0] + ascii("mif1heic")
    static let mif1WithAVIF: [UInt8] = [0x00, 0x00, 0x00, 0x18] + ascii("ftypmif1") + [0, 0, 0, 0] + ascii("mif1avif")

}

struct SniffCase: Sendable, CustomTestStringConvertible {
    var name: String
    var bytes: [UInt8]
    var expected: ImageKind?
    var testDescription: String { "\(name) → \(expected?.rawValue ?? "not an image")" }
}

@Suite("image sniffing")
struct ImageUploadSnifferTests {
    static let cases: [SniffCase] = [
        SniffCase(name: "PNG", bytes: SampleBytes.png, expected: .png),
        SniffCase(name: "JPEG", bytes: SampleBytes.jpeg, expected: .jpeg),
        SniffCase(name: "WebP", bytes: SampleBytes.webp, expected: .webp),
        SniffCase(name: "HEIC", bytes: SampleBytes.heic, expected: .heic),
        SniffCase(name: "HEIF with a compatible heic brand", bytes: SampleBytes.heifWithHEICCompatibleBrand, expected: .heic),
        SniffCase(name: "AVIF", bytes: SampleBytes.avif, expected: nil),
        SniffCase(name: "MP4", bytes: SampleBytes.mp4, expected: nil),
        SniffCase(name: "GIF", bytes: SampleBytes.gif, expected: nil),
        SniffCase(name: "PDF", bytes: SampleBytes.pdf, expected: nil),
        SniffCase(name: "WAVE in a RIFF", bytes: SampleBytes.wave, expected: nil),
        SniffCase(name: "text", bytes: SampleBytes.text, expected: nil),
        SniffCase(name: "truncated PNG signature", bytes: Array(SampleBytes.png.prefix(4)), expected: nil),
        SniffCase(name: "truncated WebP header", bytes: Array(SampleBytes.webp.prefix(10)), expected: nil),
        SniffCase(name: "nothing", bytes: [], expected: nil),
        SniffCase(name: "ftyp of size 12 with heic after the box", bytes: SampleBytes.ftypTooShortWithHEICAfter, expected: nil),
        SniffCase(name: "isom box with heic after the box", bytes: SampleBytes.isomWithHEICAfterTheBox, expected: nil),
        SniffCase(name: "heic box larger than the bytes", bytes: SampleBytes.heicBoxLargerThanTheBytes, expected: nil),
        SniffCase(name: "heic box ending in a partial brand", bytes: SampleBytes.heicBoxWithPartialBrand, expected: nil),
        SniffCase(name: "heic box running to the end of the file", bytes: SampleBytes.heicBoxToEndOfFile, expected: nil),
        SniffCase(name: "heic box with a 64-bit size", bytes: SampleBytes.heicWithLargeSize, expected: .heic),
        SniffCase(name: "heic box with a 64-bit size past the bytes", bytes: SampleBytes.heicWithHugeLargeSize, expected: nil),
        SniffCase(name: "mif1 with an avif brand", bytes: SampleBytes.mif1WithAVIF, expected: nil),
    ]

    @Test("an image's kind comes from its bytes", arguments: cases)
    func sniff(_ sample: SniffCase) {
        #expect(ImageSniffer.kind(of: sample.bytes) == sample.expected)
        #expect(ImageSniffer.kind(of: Data(sample.bytes)) == sample.expected)
    }
}

@Suite("image-upload", .timeLimit(.minutes(1)))
struct ImageUploadServiceTests {
    let bus = InProcessBus()
    let rpc = Defaults.imageRPC
    /// How long a test's request may take. The suites run in parallel, the decode benchmarks
    /// among them, and on two loaded cores an upload's decode has taken over the default 3 s
    /// (a failed CI run): these tests check what is stored and answered, not how fast.
    static let callTimeout = Duration.seconds(30)
    let uid = UUID().uuidString.lowercased()

    /// Runs image-upload over a fresh temporary images root for the length of `body`; `before`
    /// may put files in the root before the service starts.
    @discardableResult
    func withImages<Result: Sendable>(
        maxImageBytes: Int = Defaults.maxImageBytes, logger: Logger = quietLogger,
        before: (String) throws -> Void = { _ in }, _ body: (String) async throws -> Result
    ) async throws -> Result {
        try await withTemporaryDirectory { directory in
            try before(directory)
            let configuration = ImageUploadService.Configuration(rpc: rpc, directory: directory, maxImageBytes: maxImageBytes)
            let service = try ImageUploadService(configuration: configuration, bus: bus, logger: logger)
            return try await withRunningService(service, on: bus, answeringAt: rpc) { try await body(directory) }
        }
    }

    func upload(_ bytes: Data?, contentType: String? = "image/png", uid: String? = nil) async throws -> StoredImage {
        try await bus.call(
            UploadImage(contentType: contentType), to: rpc, source: "test", uid: uid ?? self.uid, attachment: bytes,
            timeout: Self.callTimeout)
    }

    /// The stored image's file and its thumbnail's, as listed in the person's folder.
    func files(of image: StoredImage) -> [String] {
        [image.path, image.thumbnailPath ?? "-"].map { String($0.dropFirst(uid.count + 1)) }.sorted()
    }

    func delete(_ path: String, uid: String? = nil) async throws -> DeletedImages {
        try await bus.call(DeleteImage(path: path), to: rpc, source: "test", uid: uid ?? self.uid, timeout: Self.callTimeout)
    }

    func deleteAll(uid: String? = nil) async throws -> DeletedImages {
        try await bus.call(DeleteAllImages(), to: rpc, source: "test", uid: uid ?? self.uid, timeout: Self.callTimeout)
    }

    /// Expects `body` to fail with `code` (and `reason`), then that the service still answers.
    @discardableResult
    func expectRefusal(
        _ code: ErrorCode, reason: String? = nil, _ body: () async throws -> some Any
    ) async throws -> ServiceError? {
        let error = await #expect(throws: ServiceError.self) { _ = try await body() }
        #expect(error?.code == code, "\(String(describing: error))")
        if let reason { #expect(error?.reason == reason, "\(String(describing: error))") }
        #expect(try await bus.call(HealthCheck(), to: rpc, source: "test").status == "ok")
        return error
    }

    func contents(of directory: String) -> [String] {
        (try? FileManager.default.contentsOfDirectory(atPath: directory).sorted()) ?? []
    }

    // MARK: Uploading

    @Test("an image of each accepted kind is stored under the person's uid, with its thumbnail", arguments: Samples.kinds)
    func uploadEachKind(kind: ImageKind) async throws {
        try await withImages { directory in
            let bytes = try #require(Samples.image(kind))
            let stored = try await upload(bytes, contentType: "application/octet-stream")
            let storedKind: ImageKind = kind == .heic ? .jpeg : kind
            #expect(stored.kind == storedKind)
            #expect(stored.path.hasPrefix("\(uid)/") && stored.path.hasSuffix(".\(storedKind.fileExtension)"))
            let file = FileManager.default.contents(atPath: "\(directory)/\(stored.path)")
            #expect(file?.count == stored.bytes)
            #expect(file.flatMap { TestImage.decode($0) } != nil)
            #expect(contents(of: "\(directory)/\(uid)") == files(of: stored))
        }
    }

    @Test("the service names the files, so two uploads never collide")
    func uploadsGetNewNames() async throws {
        try await withImages { directory in
            let first = try await upload(Samples.png)
            let second = try await upload(Samples.png)
            #expect(first.path != second.path)
            #expect(contents(of: "\(directory)/\(uid)") == (files(of: first) + files(of: second)).sorted())
        }
    }

    @Test("bytes that are not an image are refused whatever the content type says")
    func fakeImage() async throws {
        try await withImages { directory in
            let error = try await expectRefusal(.imageRejected, reason: "unsupportedType") {
                try await upload(Data(SampleBytes.gif), contentType: "image/png")
            }
            for kind in ImageKind.allCases { #expect(error?.message.contains(kind.rawValue) == true) }
            #expect(contents(of: directory).isEmpty)
        }
    }

    @Test("an empty image is refused")
    func emptyImage() async throws {
        try await withImages { _ in
            try await expectRefusal(.imageRejected, reason: "empty") { try await upload(Data()) }
        }
    }

    @Test("an image over the limit is refused and the message states the limit")
    func tooLarge() async throws {
        try await withImages(maxImageBytes: 1024) { directory in
            #expect(Samples.png.count < 1024)
            // A whole PNG followed by zeros: bytes after the image do not make it invalid.
            let padding = { (count: Int) in Samples.png + Data(repeating: 0, count: count - Samples.png.count) }
            let error = try await expectRefusal(.imageRejected, reason: "tooLarge") { try await upload(padding(1025)) }
            #expect(error?.message.contains("1024") == true)
            try await expectRefusal(.imageRejected, reason: "tooLarge") { try await upload(padding(2048)) }
            try await expectRefusal(.messageTooLarge) { try await upload(padding(2049)) }
            #expect(contents(of: directory).isEmpty)
            let stored = try await upload(padding(1024))
            #expect(stored.kind == .png && stored.bytes < 1024)
        }
    }

    @Test("an upload without the image frame is refused as unexpected frames")
    func missingAttachment() async throws {
        try await withImages { _ in
            try await expectRefusal(.unexpectedFrames) { try await upload(nil) }
        }
    }

    @Test("a uid that is not a safe folder name is refused", arguments: ["../evil", "a/b", ".", "..", "x y", String(repeating: "a", count: 65)])
    func unsafeUID(uid: String) async throws {
        try await withImages { directory in
            try await expectRefusal(.invalidRequest) { try await upload(Samples.png, uid: uid) }
            try await expectRefusal(.invalidRequest) { try await deleteAll(uid: uid) }
            #expect(contents(of: directory).isEmpty)
            #expect(!FileManager.default.fileExists(atPath: "\(directory)/../evil"))
        }
    }

    @Test("a request that names no person is refused")
    func missingUID() async throws {
        try await withImages { _ in
            try await expectRefusal(.invalidRequest) {
                try await bus.call(UploadImage(), to: rpc, source: "test", attachment: Samples.png, timeout: Self.callTimeout)
            }
        }
    }

    // MARK: Deleting

    @Test(
        "a delete path that is not exactly the person's own image is refused",
        arguments: [
            "../x", "{other}/{file}", "/etc/passwd", "{root}/{uid}/{file}", "{uid}/../{uid}/{file}", "{uid}/{file}/",
            "{uid}//{file}", "{uid}/", "{uid}", "", "{uid}/.", "{uid}/..", "{uid}/not a name.png", "{uid}/{file}.gif",
            "{uid}/.upload-x.tmp", "{uid}/{thumbnail}",
        ])
    func deleteTraversal(template: String) async throws {
        try await withImages { directory in
            let stored = try await upload(Samples.png)
            let thumbnail = String(try #require(stored.thumbnailPath).dropFirst(uid.count + 1))
            let file = String(stored.path.dropFirst(uid.count + 1))
            let path = template
                .replacingOccurrences(of: "{root}", with: directory)
                .replacingOccurrences(of: "{other}", with: UUID().uuidString.lowercased())
                .replacingOccurrences(of: "{uid}", with: uid)
                .replacingOccurrences(of: "{file}", with: file)
                .replacingOccurrences(of: "{thumbnail}", with: thumbnail)
            try await expectRefusal(.invalidRequest) { try await delete(path) }
            #expect(FileManager.default.fileExists(atPath: "\(directory)/\(stored.path)"))
            #expect(FileManager.default.fileExists(atPath: "\(directory)/\(uid)/\(thumbnail)"))
        }
    }

    @Test("deleting one image removes only that image and its thumbnail")
    func deleteOne() async throws {
        try await withImages { directory in
            let kept = try await upload(Samples.jpeg)
            let removed = try await upload(Samples.png)
            #expect(try await delete(removed.path).deleted == 1)
            #expect(contents(of: "\(directory)/\(uid)") == files(of: kept))
            try await expectRefusal(.imageNotFound) { try await delete(removed.path) }
        }
    }

    @Test("another service cannot delete someone else's image by naming its path")
    func deleteOthersImage() async throws {
        try await withImages { directory in
            let theirs = try await upload(Samples.png, uid: "someone-else")
            try await expectRefusal(.invalidRequest) { try await delete(theirs.path) }
            #expect(FileManager.default.fileExists(atPath: "\(directory)/\(theirs.path)"))
        }
    }

    @Test("deleting all of a person's images removes their folder and counts the images")
    func deleteAllImages() async throws {
        try await withImages { directory in
            for image in [Samples.png, Samples.jpeg, Samples.webp] { _ = try await upload(image) }
            let other = try await upload(Samples.jpeg, uid: "someone-else")
            #expect(try await deleteAll().deleted == 3)
            #expect(!FileManager.default.fileExists(atPath: "\(directory)/\(uid)"))
            #expect(FileManager.default.fileExists(atPath: "\(directory)/\(other.path)"))
            #expect(try await deleteAll().deleted == 0)
        }
    }

    @Test("a withdrawal's deletion refuses the person's later uploads: one held up on another replica stores nothing")
    func withdrawalRefusesLateUploads() async throws {
        try await withImages { directory in
            for image in [Samples.png, Samples.jpeg] { _ = try await upload(image) }
            let withdrawal = DeleteAllImages(withdrawn: true)
            #expect(try await bus.call(withdrawal, to: rpc, source: "test", uid: uid, timeout: Self.callTimeout).deleted == 2)
            #expect(contents(of: "\(directory)/\(uid)") == [".withdrawn"])
            // An upload of a set-up that was under way (on a replica that was stopped, say).
            try await expectRefusal(.forbidden) { try await upload(Samples.png) }
            #expect(contents(of: "\(directory)/\(uid)") == [".withdrawn"])
            // Repeated, the withdrawal deletes nothing more and still refuses.
            #expect(try await bus.call(withdrawal, to: rpc, source: "test", uid: uid, timeout: Self.callTimeout).deleted == 0)
            try await expectRefusal(.invalidRequest) {
                try await bus.call(
                    DeleteAllImages(keep: "\(uid)/a.png", withdrawn: true), to: rpc, source: "test", uid: uid, timeout: Self.callTimeout)
            }
            // Others are not affected.
            _ = try await upload(Samples.png, uid: "someone-else")
        }
    }

    @Test("deleting a person's last image removes their folder")
    func deleteLastImageRemovesFolder() async throws {
        try await withImages { directory in
            let first = try await upload(Samples.png)
            let second = try await upload(Samples.jpeg)
            #expect(try await delete(first.path).deleted == 1)
            #expect(contents(of: "\(directory)/\(uid)") == files(of: second))
            #expect(try await delete(second.path).deleted == 1)
            #expect(contents(of: directory).isEmpty)
            let again = try await upload(Samples.webp)
            #expect(FileManager.default.fileExists(atPath: "\(directory)/\(again.path)"))
        }
    }

    // MARK: Starting up

    @Test("temporary upload files and orphaned thumbnails a crash left (a minute old) are removed at start-up, and the count is logged; a fresh one, a replica's upload under way, is kept")
    func leftoverTemporaryFiles() async throws {
        let name = UUID().uuidString.lowercased()
        let (image, thumbnail) = ("\(name).png", "\(name).thumb.png")
        let orphan = "\(UUID().uuidString.lowercased()).thumb.png"
        let underWay = ".upload-\(UUID().uuidString.lowercased()).tmp"
        let messages = LogCapture()
        let leftovers = { (directory: String) throws in
            func write(_ path: String) throws {
                try FileManager.default.createDirectory(
                    atPath: "\(directory)/\((path as NSString).deletingLastPathComponent)", withIntermediateDirectories: true)
                try Samples.png.write(to: URL(fileURLWithPath: "\(directory)/\(path)"))
                try backdate("\(directory)/\(path)")
                try backdate("\(directory)/\((path as NSString).deletingLastPathComponent)")
            }
            try write("crashed-first-upload/.upload-\(UUID().uuidString.lowercased()).tmp")
            try write("\(uid)/.upload-\(UUID().uuidString.lowercased()).tmp")
            try write("\(uid)/.upload-\(UUID().uuidString.lowercased()).tmp")
            try write("\(uid)/\(image)")
            try write("\(uid)/\(thumbnail)")
            try write("\(uid)/\(orphan)")
            try write("\(uid)/notes.tmp")
            // Another replica's upload under way, in a folder they share: a fresh file is kept.
            try Samples.png.write(to: URL(fileURLWithPath: "\(directory)/\(uid)/\(underWay)"))
        }
        try await withImages(logger: messages.logger, before: leftovers) { directory in
            #expect(contents(of: directory) == [uid])
            #expect(contents(of: "\(directory)/\(uid)") == [image, thumbnail, "notes.tmp", underWay].sorted())
            let removed = try await deleteAll()
            #expect(removed.deleted == 1)
        }
        let notices = messages.entries.filter { $0.message.contains("temporary upload files") }
        #expect(notices.count == 1)
        #expect(notices.first?.metadata["count"] == "3")
    }

    @Test("a withdrawal's mark is removed, folder and all, by the first sweep a day after; a younger one still refuses uploads")
    func oldWithdrawalMarksGo() async throws {
        let (old, recent) = ("withdrew-long-ago", "withdrew-recently")
        let messages = LogCapture()
        let marks = { (directory: String) throws in
            for person in [old, recent] {
                try FileManager.default.createDirectory(atPath: "\(directory)/\(person)", withIntermediateDirectories: true)
                try Data().write(to: URL(fileURLWithPath: "\(directory)/\(person)/.withdrawn"))
            }
            let dayAndMinute = Date(timeIntervalSinceNow: -(86_400 + 60))
            try FileManager.default.setAttributes([.modificationDate: dayAndMinute], ofItemAtPath: "\(directory)/\(old)/.withdrawn")
        }
        try await withImages(logger: messages.logger, before: marks) { directory in
            #expect(contents(of: directory) == [recent])
            try await expectRefusal(.forbidden) { try await upload(Samples.png, uid: recent) }
        }
        let notices = messages.entries.filter { $0.message.contains("withdrew over a day ago") }
        #expect(notices.first?.metadata["count"] == "1")
    }

    @Test("image folders are 0700 and images 0600; what an earlier version left open is tightened at start")
    func fileModes() async throws {
        let older = "\(UUID().uuidString.lowercased()).png"
        let loosen = { (directory: String) throws in
            try FileManager.default.createDirectory(atPath: "\(directory)/\(uid)", withIntermediateDirectories: true)
            try Samples.png.write(to: URL(fileURLWithPath: "\(directory)/\(uid)/\(older)"))
            chmod(directory, 0o755)
            chmod("\(directory)/\(uid)", 0o755)
            chmod("\(directory)/\(uid)/\(older)", 0o644)
        }
        try await withImages(before: loosen) { directory in
            #expect(mode(of: directory) == 0o700)
            #expect(mode(of: "\(directory)/\(uid)") == 0o700)
            #expect(mode(of: "\(directory)/\(uid)/\(older)") == 0o600)
            let stored = try await upload(Samples.jpeg, uid: "someone-new")
            #expect(mode(of: "\(directory)/someone-new") == 0o700)
            #expect(mode(of: "\(directory)/\(stored.path)") == 0o600)
            #expect(mode(of: "\(directory)/\(try #require(stored.thumbnailPath))") == 0o600)
        }
        // A root that does not exist yet is made 0700.
        try await withTemporaryDirectory { parent in
            let configuration = ImageUploadService.Configuration(rpc: rpc, directory: "\(parent)/images")
            let service = try ImageUploadService(configuration: configuration, bus: bus, logger: quietLogger)
            try await withRunningService(service, on: bus, answeringAt: rpc) {
                #expect(mode(of: "\(parent)/images") == 0o700)
            }
        }
    }

    @Test("a clean start logs no removal")
    func cleanStart() async throws {
        let messages = LogCapture()
        try await withImages(logger: messages.logger) { directory in
            _ = try await upload(Samples.png)
        }
        #expect(!messages.entries.contains { $0.message.contains("temporary upload files") })
    }

    // MARK: Configuration

    @Test(
        "an image limit that is not from 1 byte to 1 GiB is refused, naming the limit",
        arguments: [0, -1, Int.min, ImageUploadService.Configuration.maxImageBytesCeiling + 1, Int.max])
    func invalidImageLimit(maxImageBytes: Int) throws {
        let configuration = ImageUploadService.Configuration(directory: "/tmp/unused", maxImageBytes: maxImageBytes)
        let error = #expect(throws: ServiceError.self) {
            try ImageUploadService(configuration: configuration, bus: bus, logger: quietLogger)
        }
        #expect(error?.code == .invalidRequest)
        #expect(error?.message.contains("maxImageBytes") == true, "\(String(describing: error))")
        #expect(error?.message.contains("\(maxImageBytes)") == true, "\(String(describing: error))")
        #expect(error?.message.contains("1073741824") == true, "\(String(describing: error))")
    }

    @Test("image limits of 1 byte and of 1 GiB are accepted", arguments: [1, 1 << 30])
    func validImageLimit(maxImageBytes: Int) throws {
        let configuration = ImageUploadService.Configuration(directory: "/tmp/unused", maxImageBytes: maxImageBytes)
        #expect(throws: Never.self) { try ImageUploadService(configuration: configuration, bus: bus, logger: quietLogger) }
        #expect(configuration.limits.maxAttachmentBytes == maxImageBytes * 2)
    }

    @Test("pixel limits, thumbnail side and decode threads out of range are refused", arguments: [
        (ImageLimits(maxPixels: 0), 2), (ImageLimits(maxSide: 0), 2), (ImageLimits(thumbnailSide: 0), 2),
        (ImageLimits(thumbnailSide: 5000), 2), (ImageLimits(), 0), (ImageLimits(), 65),
    ])
    func invalidImageSettings(limits: ImageLimits, threads: Int) {
        let configuration = ImageUploadService.Configuration(directory: "/tmp/unused", imageLimits: limits, decodeThreads: threads)
        let error = #expect(throws: ServiceError.self) {
            try ImageUploadService(configuration: configuration, bus: bus, logger: quietLogger)
        }
        #expect(error?.code == .invalidRequest)
    }

    @Test("the image settings take a flag, then the environment, then the default, within their ranges")
    func imageSettings() throws {
        let defaults = try ImageUploadService.Configuration(Settings(environment: ["ONBOARDING_SERVICE_TOKEN": "t"]))
        #expect(defaults.imageLimits.maxPixels == Defaults.maxImagePixels && defaults.imageLimits.maxSide == Defaults.maxImageSide)
        #expect(defaults.decodeThreads == Defaults.imageDecodeThreads && defaults.maxImageBytes == Defaults.maxImageBytes)
        let given = try ImageUploadService.Configuration(
            Settings(
                flags: [.maxImagePixels: "12000000", .imageDecodeThreads: "4"],
                environment: ["ONBOARDING_MAX_IMAGE_SIDE": "4096", "ONBOARDING_IMAGE_DECODE_THREADS": "3", "ONBOARDING_SERVICE_TOKEN": "t"]))
        #expect(given.imageLimits.maxPixels == 12_000_000 && given.imageLimits.maxSide == 4096 && given.decodeThreads == 4)
        for (setting, value) in [(Setting.maxImagePixels, "0"), (.maxImageSide, "100001"), (.imageDecodeThreads, "65")] {
            let error = #expect(throws: SettingError.self) {
                _ = try ImageUploadService.Configuration(Settings(flags: [setting: value], environment: ["ONBOARDING_SERVICE_TOKEN": "t"]))
            }
            #expect(error?.description.contains(setting.environmentVariable) == true, "\(String(describing: error))")
        }
    }

    @Test("the attachment limit saturates instead of overflowing")
    func attachmentLimitSaturates() {
        let configuration = ImageUploadService.Configuration(directory: "/tmp/unused", maxImageBytes: .max)
        #expect(configuration.limits.maxAttachmentBytes == .max)
    }
}

/// Makes `path` look two minutes old: what the start-up sweep takes for a crash's leftover.
func backdate(_ path: String) throws {
    try FileManager.default.setAttributes([.modificationDate: Date(timeIntervalSinceNow: -120)], ofItemAtPath: path)
}
