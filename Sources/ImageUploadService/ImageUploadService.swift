import Foundation
import Logging
import Messaging
import OnboardingAPI
import ServiceLifecycle
import ServiceRuntime

/// The image-upload service: checks, cleans and stores profile images under the person's uid,
/// and deletes them.
///
/// Requests (at ``Configuration/rpc``, all from other services, naming the person in the
/// envelope's `uid`):
/// - `image.upload`: the image as the binary frame. Its kind is judged by its bytes (PNG, JPEG,
///   WebP or HEIC; the declared content type is not trusted), it must be within
///   ``Configuration/maxImageBytes``, its header within ``Configuration/limits`` (read before any
///   pixel is decoded), and it must decode completely. What is stored is not the upload but its
///   pixels encoded again, upright, with no metadata (see ``ImagePipeline``), and a square
///   thumbnail beside it. Answers both paths, `<uid>/<name>.<extension>` and
///   `<uid>/<name>.thumb.<extension>`; names are made here. With an `idempotencyKey`, the name is
///   the key, and an upload that repeats a key the person's stored images already use is
///   answered with that image (its own kind and size), stores nothing and decodes nothing. Once
///   that image is deleted, the key stores anew.
/// - `image.delete`: one image and its thumbnail, by the path upload returned.
/// - `image.deleteAll`: every image of the person, except `keep` (and its thumbnail) when given
///   (a path `<uid>/<file>` of this person, or the request is `invalidRequest`; it need not
///   exist).
///
/// Thread safety: a value type; ``run()`` is called once, from a `ServiceGroup` or a test task.
/// Handlers never block the cooperative thread pool: images are decoded and encoded on the
/// ``ImageProcessor``'s own threads (``Configuration/decodeThreads`` of them), and all file I/O
/// runs on one serial queue owned by the image storage; handlers suspend until they are done.
public struct ImageUploadService: Service {
    public struct Configuration: Sendable {
        /// Where requests are answered.
        public var rpc: Endpoint
        /// The images root; each person's images are in a folder named after their uid.
        public var directory: String
        /// The largest image accepted, in bytes: from 1 to ``maxImageBytesCeiling``.
        public var maxImageBytes: Int
        /// The pixel limits checked on the header before decoding, and the thumbnail's side.
        public var imageLimits: ImageLimits
        /// How many images are decoded at once, each on a thread of its own: from 1 to 64.
        public var decodeThreads: Int
        /// The secret every request must carry (all of image-upload is service-only); `nil`
        /// trusts every caller (tests only).
        public var serviceToken: String?

        /// The highest ``maxImageBytes`` the service accepts: 1 GiB.
        public static let maxImageBytesCeiling = 1 << 30

        public init(
            rpc: Endpoint = Defaults.imageRPC, directory: String, maxImageBytes: Int = Defaults.maxImageBytes,
            imageLimits: ImageLimits = ImageLimits(), decodeThreads: Int = Defaults.imageDecodeThreads,
            serviceToken: String? = nil
        ) {
            self.rpc = rpc
            self.directory = directory
            self.maxImageBytes = maxImageBytes
            self.imageLimits = imageLimits
            self.decodeThreads = decodeThreads
            self.serviceToken = serviceToken
        }

        /// What the endpoint accepts: a small envelope, and attachments up to twice the image
        /// limit, so that an image somewhat over the limit gets the typed `imageRejected`
        /// (`tooLarge`) rather than the bus's `messageTooLarge`. Saturates at `Int.max` rather
        /// than overflowing.
        public var limits: MessageLimits {
            let (doubled, overflow) = maxImageBytes.multipliedReportingOverflow(by: 2)
            // Few images wait, so what is held in memory stays bounded.
            return MessageLimits(maxEnvelopeBytes: 64 * 1024, maxAttachmentBytes: overflow ? .max : doubled, queueLimit: 16)
        }
    }

    public let configuration: Configuration
    private let bus: any MessageBus
    private let logger: Logger

    /// - Throws: ``ServiceError`` `invalidRequest` when the directory is empty, the image
    ///   limit is not from 1 byte to ``Configuration/maxImageBytesCeiling`` (1 GiB), a pixel
    ///   limit or the thumbnail side is below 1, or the decode threads are not from 1 to 64.
    public init(configuration: Configuration, bus: any MessageBus, logger: Logger) throws {
        guard !configuration.directory.isEmpty else {
            throw ServiceError(.invalidRequest, "image-upload's images directory is empty; give a folder path.")
        }
        let ceiling = Configuration.maxImageBytesCeiling
        guard (1...ceiling).contains(configuration.maxImageBytes) else {
            throw ServiceError(
                .invalidRequest,
                "image-upload's image limit (maxImageBytes) is \(configuration.maxImageBytes) bytes; "
                    + "it must be from 1 to \(ceiling) bytes (1 GiB).")
        }
        let limits = configuration.imageLimits
        guard limits.maxPixels >= 1, limits.maxSide >= 1, (1...4096).contains(limits.thumbnailSide) else {
            throw ServiceError(
                .invalidRequest,
                "image-upload's pixel limits must be at least 1 (maxPixels \(limits.maxPixels), maxSide "
                    + "\(limits.maxSide)) and the thumbnail side from 1 to 4096 (\(limits.thumbnailSide)).")
        }
        guard (1...64).contains(configuration.decodeThreads) else {
            throw ServiceError(
                .invalidRequest, "image-upload's decode threads must be from 1 to 64, not \(configuration.decodeThreads).")
        }
        self.configuration = configuration
        self.bus = bus
        self.logger = logger
    }

    /// Starts libvips and the decode threads, creates the images root if needed (tightening the
    /// modes of what is there), removes what a crash left behind, and answers requests until
    /// graceful shutdown or cancellation, letting requests in flight finish.
    ///
    /// - Throws: ``ServiceError`` `storeUnavailable` when the images root cannot be created,
    ///   `internalError` when libvips cannot start, or the bus's error (such as `addressInUse`)
    ///   when the endpoint cannot be bound.
    public func run() async throws {
        let processor = try ImageProcessor(limits: configuration.imageLimits, threads: configuration.decodeThreads)
        defer { processor.shutdown() }
        try await run(processor: processor)
    }

    /// ``run()`` with a processor made elsewhere (tests hold its decode threads).
    func run(processor: ImageProcessor) async throws {
        let storage = ImageStorage(root: configuration.directory)
        Self.report(try await storage.prepare(), in: configuration.directory, logger: logger)
        let limits = configuration.imageLimits
        logger.info(
            "image-upload keeps images in \(configuration.directory)",
            metadata: [
                "maxImageBytes": "\(configuration.maxImageBytes)", "maxPixels": "\(limits.maxPixels)",
                "maxSide": "\(limits.maxSide)", "decodeThreads": "\(processor.threads)",
            ])
        let server = RequestServer(
            bus: bus, endpoint: configuration.rpc, limits: configuration.limits,
            dispatcher: Self.dispatcher(
                storage: storage, processor: processor, maxImageBytes: configuration.maxImageBytes,
                serviceToken: configuration.serviceToken, logger: logger),
            logger: logger, maxInFlight: 32)
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { [logger, directory = configuration.directory] in
                await Self.sweep(storage, every: Self.sweepInterval, in: directory, logger: logger)
            }
            try await server.run()
            group.cancelAll()
        }
    }

    /// How often the images folder is swept while the service runs (see ``ImageStorage/prepare()``).
    static let sweepInterval = Duration.seconds(3600)

    /// Sweeps the images folder every `interval` until cancelled. A sweep that fails is logged
    /// and tried again at the next one.
    private static func sweep(_ storage: ImageStorage, every interval: Duration, in directory: String, logger: Logger) async {
        while (try? await Task.sleep(for: interval)) != nil {
            do {
                report(try await storage.prepare(), in: directory, logger: logger)
            } catch {
                logger.warning("sweeping the images folder failed: \(error.message); it is tried again in \(interval)")
            }
        }
    }

    private static func report(_ sweep: ImageStorage.Sweep, in directory: String, logger: Logger) {
        if sweep.temporaryFiles > 0 {
            logger.notice(
                "removed temporary upload files a crash left",
                metadata: ["count": "\(sweep.temporaryFiles)", "directory": "\(directory)"])
        }
        if sweep.withdrawals > 0 {
            logger.info(
                "removed the folders of people who withdrew over a day ago (their withdrawal marks)",
                metadata: ["count": "\(sweep.withdrawals)", "directory": "\(directory)"])
        }
    }

    private static func dispatcher(
        storage: ImageStorage, processor: ImageProcessor, maxImageBytes: Int, serviceToken: String?, logger: Logger
    ) -> RequestDispatcher {
        var dispatcher = RequestDispatcher(
            source: ServiceName.imageUpload, sessions: nil, serviceToken: serviceToken, logger: logger)
        dispatcher.on(UploadImage.self, access: .service, attachment: .required) { request, context in
            let uid = try safeUID(context)
            if let problem = IdempotencyKey.problem(request.idempotencyKey) { throw problem }
            let bytes = context.attachment ?? Data()
            let kind = try judge(bytes, maxImageBytes: maxImageBytes)
            if let key = request.idempotencyKey, let earlier = try await storage.image(key: key, uid: uid) {
                logger.info(
                    "repeated upload answered with the image stored under its key",
                    metadata: ["uid": "\(uid)", "path": "\(earlier.path)"])
                return earlier
            }
            let started = ContinuousClock.now
            let processed: ProcessedImage
            do {
                processed = try await processor.process(bytes, kind: kind)
            } catch {
                logger.info(
                    "refused image", metadata: ["uid": "\(uid)", "sniffed": "\(kind.rawValue)", "error": "\(error)"])
                throw error
            }
            let processing = ContinuousClock.now - started
            let stored = try await storage.store(processed, uid: uid, key: request.idempotencyKey)
            let metadata: Logger.Metadata = [
                "uid": "\(uid)", "path": "\(stored.image.path)", "bytes": "\(stored.image.bytes)",
                "uploadedBytes": "\(bytes.count)", "pixels": "\(processed.width)x\(processed.height)",
                "processing": "\(processing)",
            ]
            if stored.isNew {
                logger.info("stored image", metadata: metadata)
            } else {
                logger.info("repeated upload answered with the image stored under its key", metadata: metadata)
            }
            return stored.image
        }
        dispatcher.on(DeleteImage.self, access: .service) { request, context in
            let uid = try safeUID(context)
            guard let file = ImagePaths.fileName(in: request.path, uid: uid) else {
                throw ServiceError(
                    .invalidRequest,
                    "Field 'path' must be exactly an image path as image.upload returned it ('<uid>/<name>.<png|jpeg|webp|heic>', the envelope's uid; not a thumbnail path).")
            }
            guard try await storage.delete(uid: uid, file: file) else {
                throw ServiceError(.imageNotFound, "There is no image \(request.path).")
            }
            logger.info("deleted image", metadata: ["uid": "\(uid)", "path": "\(request.path)"])
            return DeletedImages(deleted: 1)
        }
        dispatcher.on(DeleteAllImages.self, access: .service) { request, context in
            let uid = try safeUID(context)
            var keep: String?
            if let path = request.keep {
                guard let file = ImagePaths.fileName(in: path, uid: uid) else {
                    throw ServiceError(
                        .invalidRequest,
                        "Field 'keep' must be exactly an image path as image.upload returned it ('<uid>/<name>.<png|jpeg|webp|heic>', the envelope's uid; not a thumbnail path).")
                }
                keep = file
            }
            let withdrawn = request.withdrawn ?? false
            guard !(withdrawn && keep != nil) else {
                throw ServiceError(.invalidRequest, "A withdrawal deletes every image: 'keep' and 'withdrawn' cannot go together.")
            }
            let deleted = try await storage.deleteAll(uid: uid, keeping: keep, withdrawn: withdrawn)
            logger.info(
                "deleted all images", metadata: ["uid": "\(uid)", "count": "\(deleted)", "kept": "\(request.keep ?? "-")"])
            return DeletedImages(deleted: deleted)
        }
        return dispatcher
    }

    private static func safeUID(_ context: RequestContext) throws -> String {
        let uid = try context.requireUID()
        guard ImagePaths.isSafeUID(uid) else {
            throw ServiceError(.invalidRequest, "The envelope's uid must be 1 to 64 of A-Z, a-z, 0-9, _ and -.")
        }
        return uid
    }

    /// The checks made before anything is decoded: the bytes are not empty, within the limit,
    /// and of an accepted kind by their magic numbers. ``ImagePipeline`` does the rest.
    static func judge(_ bytes: Data, maxImageBytes: Int) throws(ServiceError) -> ImageKind {
        guard !bytes.isEmpty else {
            throw ServiceError(.imageRejected, "The image is empty.", reason: "empty")
        }
        guard bytes.count <= maxImageBytes else {
            throw ServiceError(
                .imageRejected, "The image is \(bytes.count) bytes; the limit is \(maxImageBytes) bytes.",
                reason: "tooLarge")
        }
        guard let kind = ImageSniffer.kind(of: bytes) else {
            let accepted = ImageKind.allCases.map(\.rawValue).joined(separator: ", ")
            throw ServiceError(
                .imageRejected,
                "The bytes are not an image of an accepted kind (\(accepted)), whatever the content type says.",
                reason: "unsupportedType")
        }
        return kind
    }
}
