import Dispatch
import Foundation
import ImageFixtures
@testable import ImageUploadService
import Messaging
import OnboardingAPI
import ServiceLifecycle
import ServiceRuntime
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Small real images of each kind, made once by libvips for the image-upload tests.
enum Samples {
    static let png = TestImage.make(.png, width: 12, height: 8)
    static let jpeg = TestImage.make(.jpeg, width: 12, height: 8)
    static let webp = TestImage.make(.webp, width: 12, height: 8)
    /// `nil` when libvips cannot write HEIC on this machine.
    static let heic: Data? = TestImage.canWriteHEIC ? TestImage.make(.heic, width: 64, height: 48) : nil

    static func image(_ kind: ImageKind) -> Data? {
        switch kind {
        case .png: png
        case .jpeg: jpeg
        case .webp: webp
        case .heic: heic
        }
    }

    static func format(_ kind: ImageKind) -> TestImage.Format {
        switch kind {
        case .png: .png
        case .jpeg: .jpeg
        case .webp: .webp
        case .heic: .heic
        }
    }

    /// The kinds whose images the tests can make here (HEIC only where libvips writes it).
    static let kinds: [ImageKind] = ImageKind.allCases.filter { image($0) != nil }
}

/// What a file case is and what upload must say about it.
struct RefusalCase: Sendable, CustomTestStringConvertible {
    var name: String
    var bytes: Data
    var reason: String
    var testDescription: String { "\(name) → \(reason)" }
}

// Serialized: several tests decode large images, and the machine has two cores.
@Suite("image processing", .serialized, .timeLimit(.minutes(3)))
struct ImageProcessingTests {
    let bus = InProcessBus()
    let rpc = Defaults.imageRPC
    let uid = UUID().uuidString.lowercased()

    func withImages<Result: Sendable>(
        limits: ImageLimits = ImageLimits(), processor: ImageProcessor? = nil, _ body: (String) async throws -> Result
    ) async throws -> Result {
        try await withTemporaryDirectory { directory in
            let configuration = ImageUploadService.Configuration(rpc: rpc, directory: directory, imageLimits: limits)
            let service = try ImageUploadService(configuration: configuration, bus: bus, logger: quietLogger)
            guard let processor else {
                return try await withRunningService(service, on: bus, answeringAt: rpc) { try await body(directory) }
            }
            return try await withRunningService(WithProcessor(service: service, processor: processor), on: bus, answeringAt: rpc) {
                try await body(directory)
            }
        }
    }

    func upload(_ bytes: Data, key: String? = nil) async throws -> StoredImage {
        try await bus.call(
            UploadImage(contentType: "image/png", idempotencyKey: key), to: rpc, source: "test", uid: uid, attachment: bytes,
            timeout: ImageUploadServiceTests.callTimeout)
    }

    func stored(_ directory: String, _ path: String?) throws -> Data {
        let path = try #require(path)
        return try Data(contentsOf: URL(fileURLWithPath: "\(directory)/\(path)"))
    }

    func files(_ directory: String) -> [String] {
        (try? FileManager.default.contentsOfDirectory(atPath: "\(directory)/\(uid)").sorted()) ?? []
    }

    // MARK: Accepted images

    @Test("each accepted kind is decoded and stored again, upright and whole, with a square thumbnail", arguments: Samples.kinds)
    func roundTrip(kind: ImageKind) async throws {
        let original = TestImage.halves(Samples.format(kind), width: 300, height: 200)
        try await withImages { directory in
            let image = try await upload(original)
            let expectedKind: ImageKind = kind == .heic ? .jpeg : kind
            #expect(image.kind == expectedKind)
            #expect(image.path.hasPrefix("\(uid)/") && image.path.hasSuffix(".\(expectedKind.fileExtension)"))
            let name = image.path.dropFirst(uid.count + 1).dropLast(expectedKind.fileExtension.count + 1)
            #expect(image.thumbnailPath == "\(uid)/\(name).thumb.\(expectedKind.fileExtension)")
            let bytes = try stored(directory, image.path)
            #expect(image.bytes == bytes.count)
            let decoded = try #require(TestImage.decode(bytes, sampling: [(10, 100), (290, 100)]))
            #expect((decoded.width, decoded.height) == (300, 200))
            #expect(decoded.loader == ImagePipeline.loader(of: expectedKind))
            #expect(isClose(decoded.samples[0], to: TestImage.red), "\(decoded.samples)")
            #expect(isClose(decoded.samples[1], to: TestImage.blue), "\(decoded.samples)")
            let thumbnail = try #require(TestImage.decode(try stored(directory, image.thumbnailPath)))
            #expect((thumbnail.width, thumbnail.height) == (256, 256))
            #expect(thumbnail.loader == ImagePipeline.loader(of: expectedKind))
            #expect(thumbnail.fields.isEmpty, "\(thumbnail.fields)")
            #expect(files(directory) == [String(name) + ".\(expectedKind.fileExtension)", String(name) + ".thumb.\(expectedKind.fileExtension)"].sorted())
        }
    }

    @Test("the thumbnail is always the configured square: large, wide, tall and tiny images", arguments: [
        (2000, 500), (300, 1200), (3, 2), (256, 256),
    ])
    func thumbnailSizes(width: Int, height: Int) async throws {
        try await withImages(limits: ImageLimits(thumbnailSide: 96)) { directory in
            let image = try await upload(TestImage.halves(.png, width: width, height: height))
            let thumbnail = try #require(TestImage.decode(try stored(directory, image.thumbnailPath)))
            #expect((thumbnail.width, thumbnail.height) == (96, 96))
        }
    }

    // MARK: Metadata

    @Test("a JPEG with GPS in its EXIF is stored with no EXIF at all, by its bytes")
    func gpsIsStripped() async throws {
        let exif = EXIF.withGPS(latitude: 37.5665, longitude: 126.9780)
        let original = TestImage.make(.jpeg, width: 64, height: 48, exif: exif)
        // The upload really carries GPS: an APP1 Exif segment whose first IFD points to GPS data.
        #expect(FileStructure.jpegExif(original) == (hasExif: true, hasGPS: true))
        #expect(TestImage.decode(original)?.fields.contains("exif-ifd3-GPSLatitude") == true)
        try await withImages { directory in
            let image = try await upload(original)
            for path in [image.path, image.thumbnailPath] {
                let bytes = try stored(directory, path)
                let structure = try #require(FileStructure.jpegMarkers(bytes))
                let appOrComment = structure.markers.filter { (0xE1...0xEF).contains($0) || $0 == 0xFE }
                #expect(appOrComment.isEmpty, "markers \(structure.markers.map { String($0, radix: 16) })")
                #expect(FileStructure.jpegExif(bytes) == (hasExif: false, hasGPS: false))
                #expect(structure.trailing == 0)
                #expect(bytes.range(of: Data("Exif".utf8)) == nil && bytes.range(of: Data("ProbeCam".utf8)) == nil)
                #expect(TestImage.decode(bytes)?.fields.isEmpty == true)
            }
        }
    }

    @Test("a PNG's text and EXIF chunks and a WebP's EXIF are not stored")
    func pngAndWebPMetadataIsStripped() async throws {
        let exif = EXIF.withGPS(latitude: -33.8688, longitude: 151.2093)
        let png = TestImage.make(.png, width: 40, height: 30, exif: exif, comment: "shot at home, 12 Main St")
        let pngChunks = try #require(FileStructure.pngChunks(png)).types
        #expect(pngChunks.contains("eXIf") || pngChunks.contains("zTXt") || pngChunks.contains("tEXt"), "\(pngChunks)")
        let webp = TestImage.make(.webp, width: 40, height: 30, exif: exif)
        #expect(try #require(FileStructure.webpChunks(webp)).ids.contains("EXIF"))
        try await withImages { directory in
            let storedPNG = try stored(directory, try await upload(png).path)
            #expect(try #require(FileStructure.pngChunks(storedPNG)).types.allSatisfy { ["IHDR", "IDAT", "IEND", "PLTE", "tRNS"].contains($0) })
            #expect(storedPNG.range(of: Data("Main St".utf8)) == nil)
            let storedWebP = try stored(directory, try await upload(webp).path)
            let ids = try #require(FileStructure.webpChunks(storedWebP)).ids
            #expect(!ids.contains("EXIF") && !ids.contains("XMP ") && !ids.contains("ICCP"), "\(ids)")
        }
    }

    @Test("a JPEG taken sideways (EXIF orientation 6) is stored upright, with no orientation left")
    func orientationIsApplied() async throws {
        // Stored 40 × 20 with red on the left half; orientation 6 means "turn 90° clockwise to show".
        let sideways = TestImage.make(.jpeg, width: 40, height: 20, orientation: 6) { x, _ in
            x < 20 ? TestImage.red : TestImage.blue
        }
        #expect(TestImage.decode(sideways)?.orientation == 6)
        try await withImages { directory in
            let image = try await upload(sideways)
            let bytes = try stored(directory, image.path)
            // Upright it is 20 × 40: the left half is now the top half.
            let decoded = try #require(TestImage.decode(bytes, sampling: [(10, 5), (10, 35)]))
            #expect((decoded.width, decoded.height) == (20, 40))
            #expect(isClose(decoded.samples[0], to: TestImage.red), "\(decoded.samples)")
            #expect(isClose(decoded.samples[1], to: TestImage.blue), "\(decoded.samples)")
            #expect(decoded.orientation == 1)
            #expect(!FileStructure.jpegExif(bytes).hasExif)
        }
    }

    // MARK: Refused images

    @Test("a PNG declaring 100000 × 100000 pixels is refused from its header, without decoding its pixels")
    func pixelBombIsRefused() async throws {
        let bomb = HostileFile.pngHeader(width: 100_000, height: 100_000)
        #expect(bomb.count < 100)
        _ = try ImageProcessor(threads: 1)  // starts libvips as the service does
        // On this thread, to measure its CPU time; libvips does the header read here too.
        var stages: [ImagePipeline.Stage] = []
        let cpuBefore = threadCPUTime()
        let error = #expect(throws: ServiceError.self) {
            try ImagePipeline.process(bomb, kind: .png, limits: ImageLimits()) { stages.append($0) }
        }
        let cpu = threadCPUTime() - cpuBefore
        #expect(error?.code == .imageRejected)
        #expect(error?.reason == "tooLarge", "\(String(describing: error))")
        #expect(error?.message.contains("100000 × 100000") == true, "\(String(describing: error))")
        // Refused on its header: no pixel was decoded (30 GB of them) and nothing was encoded.
        #expect(stages == [.containerChecked])
        print("pixel bomb (100000 × 100000 PNG, \(bomb.count) bytes, 30 GB of pixels): refused on its header in \(cpu) of CPU")
        #expect(cpu < .seconds(1))

        try await withImages { directory in
            let refused = await #expect(throws: ServiceError.self) { try await upload(bomb) }
            #expect(refused?.reason == "tooLarge")
            #expect(files(directory).isEmpty)
        }
    }

    @Test("the pixel limits are checked on the header: a side over the limit, or too many pixels in all", arguments: [
        (101, 10), (10, 101), (90, 90),
    ])
    func pixelLimits(width: Int, height: Int) async throws {
        try await withImages(limits: ImageLimits(maxPixels: 5000, maxSide: 100)) { directory in
            let error = await #expect(throws: ServiceError.self) {
                try await upload(TestImage.make(.jpeg, width: width, height: height))
            }
            #expect(error?.reason == "tooLarge", "\(String(describing: error))")
            #expect(error?.message.contains("\(width) × \(height)") == true)
            let fits = try await upload(TestImage.make(.jpeg, width: 100, height: 50))
            #expect(fits.kind == .jpeg)
        }
    }

    static let refusals: [RefusalCase] = {
        let png = TestImage.gradient(.png, width: 64, height: 64)
        let jpeg = TestImage.gradient(.jpeg, width: 64, height: 64)
        let webp = TestImage.gradient(.webp, width: 64, height: 64)
        var cases = [
            RefusalCase(name: "a PNG signature alone", bytes: png.prefix(8), reason: "invalidImage"),
            RefusalCase(name: "a PNG cut after its header", bytes: png.prefix(33), reason: "invalidImage"),
            RefusalCase(name: "a PNG cut in half", bytes: png.prefix(png.count / 2), reason: "invalidImage"),
            RefusalCase(name: "a PNG without its last chunk", bytes: png.prefix(png.count - 12), reason: "invalidImage"),
            RefusalCase(name: "FF D8 FF", bytes: Data([0xFF, 0xD8, 0xFF]), reason: "invalidImage"),
            RefusalCase(name: "a JPEG cut after its headers", bytes: jpeg.prefix(200), reason: "invalidImage"),
            RefusalCase(name: "a JPEG cut in half", bytes: jpeg.prefix(jpeg.count / 2), reason: "invalidImage"),
            RefusalCase(name: "a bare RIFF/WEBP header", bytes: Data("RIFF".utf8) + Data([4, 0, 0, 0]) + Data("WEBP".utf8), reason: "invalidImage"),
            RefusalCase(name: "a WebP cut after its chunk header", bytes: webp.prefix(20), reason: "invalidImage"),
            RefusalCase(name: "a WebP cut in half", bytes: webp.prefix(webp.count / 2), reason: "invalidImage"),
            RefusalCase(
                name: "an ftyp box naming HEIC and nothing else",
                bytes: Data([0x00, 0x00, 0x00, 0x18] + Array("ftypheic".utf8) + [0, 0, 0, 0] + Array("mif1heic".utf8)),
                reason: "invalidImage"),
        ]
        if let heic = Samples.heic {
            cases.append(RefusalCase(name: "a HEIC cut in half", bytes: heic.prefix(heic.count / 2), reason: "invalidImage"))
        }
        return cases
    }()

    @Test("header-only and truncated files are refused as invalid images, and nothing is stored", arguments: refusals)
    func truncatedFiles(_ sample: RefusalCase) async throws {
        try await withImages { directory in
            let error = await #expect(throws: ServiceError.self) { try await upload(sample.bytes) }
            #expect(error?.code == .imageRejected)
            #expect(error?.reason == sample.reason, "\(String(describing: error))")
            #expect(files(directory).isEmpty)
            let health = try await bus.call(HealthCheck(), to: rpc, source: "test")
            #expect(health.status == "ok")
        }
    }

    @Test("a polyglot's appended bytes are gone: only the re-encoded image is stored", arguments: [ImageKind.png, .jpeg, .webp])
    func polyglot(kind: ImageKind) async throws {
        let image = TestImage.halves(Samples.format(kind), width: 32, height: 32)
        let polyglot = image + HostileFile.script
        try await withImages { directory in
            let storedImage = try await upload(polyglot)
            for path in [storedImage.path, storedImage.thumbnailPath] {
                let bytes = try stored(directory, path)
                #expect(bytes.range(of: Data("<script>".utf8)) == nil)
                #expect(bytes.range(of: Data("rm -rf".utf8)) == nil)
                switch kind {
                case .png: #expect(FileStructure.pngChunks(bytes)?.trailing == 0)
                case .jpeg: #expect(FileStructure.jpegMarkers(bytes)?.trailing == 0)
                default: #expect(FileStructure.webpChunks(bytes)?.trailing == 0)
                }
            }
        }
    }

    @Test("a JPEG with stray bytes between its segments is still a whole image, as decoders take it")
    func jpegWithStrayBytes() async throws {
        var jpeg = TestImage.halves(.jpeg, width: 40, height: 30)
        // After the first segment (SOI, then APP0 of the length its header gives).
        let afterFirstSegment = 4 + (Int(jpeg[jpeg.startIndex + 4]) << 8 | Int(jpeg[jpeg.startIndex + 5]))
        jpeg.insert(contentsOf: [0x00, 0x00, 0x00], at: jpeg.startIndex + afterFirstSegment)
        try await withImages { directory in
            let image = try await upload(jpeg)
            #expect(TestImage.decode(try stored(directory, image.path)).map { ($0.width, $0.height) } ?? (0, 0) == (40, 30))
        }
    }

    @Test("libvips opens only PNG, JPEG, WebP and HEIF: other loaders are blocked")
    func otherLoadersAreBlocked() throws {
        _ = try ImageProcessor(threads: 1)  // starts libvips as the service does
        #expect(TestImage.opens(Samples.png))
        #expect(!TestImage.opens(HostileFile.gif))
        #expect(!TestImage.opens(HostileFile.svg))
    }

    @Test("bytes that libvips reads as another kind than they were sniffed as are refused")
    func kindMismatch() async throws {
        let processor = try ImageProcessor(threads: 1)
        defer { processor.shutdown() }
        let error = await #expect(throws: ServiceError.self) { try await processor.process(Samples.jpeg, kind: .heic) }
        #expect(error?.reason == "unsupportedType", "\(String(describing: error))")
    }

    // MARK: Bounded decoding

    @Test("ten large uploads at once: decoded two at a time, while the service keeps answering")
    func tenLargeUploads() async throws {
        // Large enough to take real decoding time, small enough not to starve the tests that run
        // beside this one on a 2-core machine. `IMAGE_LOAD_SIDE=6000` makes it 6000 × 5000.
        let side = Int(ProcessInfo.processInfo.environment["IMAGE_LOAD_SIDE"] ?? "") ?? 2000
        let (width, height) = (side, side * 5 / 6)
        let large = TestImage.gradient(.jpeg, width: width, height: height)
        #expect(large.count <= Defaults.maxImageBytes)
        let processor = try ImageProcessor(threads: 2)
        defer { processor.shutdown() }
        let gate = DispatchSemaphore(value: 0)
        try await withImages(processor: processor) { directory in
            // Both decode threads are held, so the uploads below wait for them...
            let holders = Task {
                await withTaskGroup(of: Void.self) { group in
                    for _ in 0..<2 { group.addTask { _ = try? await processor.pool.run { gate.wait() } } }
                }
            }
            await processor.pool.waitUntil { $0.running == 2 }
            let started = ContinuousClock.now
            let uploads = Task {
                try await withThrowingTaskGroup(of: StoredImage.self) { group in
                    for _ in 0..<10 { group.addTask { try await upload(large) } }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
            }
            await processor.pool.waitUntil { $0.waiting == 10 }
            // ...and meanwhile the service answers.
            let health = try await bus.call(HealthCheck(), to: rpc, source: "test")
            #expect(health.status == "ok")
            let missing = await #expect(throws: ServiceError.self) {
                try await bus.call(DeleteImage(path: "\(uid)/\(UUID().uuidString.lowercased()).png"), to: rpc, source: "test", uid: uid)
            }
            #expect(missing?.code == .imageNotFound)
            gate.signal()
            gate.signal()
            await holders.value
            let images = try await uploads.value
            let elapsed = ContinuousClock.now - started
            #expect(images.count == 10)
            #expect(Set(images.map(\.path)).count == 10)
            #expect(processor.decodeStatistics.mostRunning == 2)
            #expect(files(directory).count == 20)
            print(
                "ten \(width) × \(height) JPEG uploads (\(large.count) bytes each) on 2 decode threads: \(elapsed) in all; "
                    + "libvips pixel memory peak in this process \(ImageProcessor.trackedMemoryPeak / 1_048_576) MiB "
                    + "(one decode holds at most \(width * height * 3 / 1_048_576) MiB of pixels)")
        }
    }

    @Test("decode timings per kind (benchmark: prints wall and process CPU time, asserts nothing about time)", arguments: Samples.kinds)
    func decodeTimings(kind: ImageKind) async throws {
        let photo = TestImage.gradient(Samples.format(kind), width: 4000, height: 3000)
        let processor = try ImageProcessor(threads: 1)
        defer { processor.shutdown() }
        var runs: [String] = []
        for _ in 0..<3 {
            let (cpuBefore, started) = (processCPUTime(), ContinuousClock.now)
            let processed = try await processor.process(photo, kind: kind)
            let (wall, cpu) = (ContinuousClock.now - started, processCPUTime() - cpuBefore)
            runs.append("\(wall.formatted(.units(allowed: [.milliseconds]))) wall / \(cpu.formatted(.units(allowed: [.milliseconds]))) CPU")
            #expect((processed.width, processed.height) == (4000, 3000))
        }
        print("process a 4000 × 3000 \(kind.rawValue) (\(photo.count) bytes): \(runs.joined(separator: ", "))")
    }
}

/// image-upload run with a processor the test holds.
struct WithProcessor: Service {
    let service: ImageUploadService
    let processor: ImageProcessor
    func run() async throws { try await service.run(processor: processor) }
}

/// The CPU time the calling thread has used.
func threadCPUTime() -> Duration {
    var time = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
    return .seconds(time.tv_sec) + .nanoseconds(time.tv_nsec)
}

/// The CPU time the whole process has used (every thread, user and system).
func processCPUTime() -> Duration {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    func duration(_ time: timeval) -> Duration { .seconds(time.tv_sec) + .microseconds(time.tv_usec) }
    return duration(usage.ru_utime) + duration(usage.ru_stime)
}
