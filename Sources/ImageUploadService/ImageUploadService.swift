import Foundation
import Logging
import Messaging
import OnboardingAPI
import ServiceLifecycle
import ServiceRuntime

/// The image-upload service: stores profile images under the person's uid and deletes them.
///
/// Requests (at ``Configuration/rpc``, all from other services, naming the person in the
/// envelope's `uid`):
/// - `image.upload`: the image as the binary frame; accepted only when its bytes are a PNG,
///   JPEG, WebP or HEIC image within ``Configuration/maxImageBytes`` (the declared content type
///   is not trusted). Answers the stored path `<uid>/<file>`; file names are made here. With an
///   `idempotencyKey`, the file is named after the key (`<uid>/<key>.<extension>`), and an upload
///   that repeats a key the person's stored images already use is answered with that image
///   (its own kind and size) and stores nothing. Once that image is deleted, the key stores anew.
/// - `image.delete`: one image, by the path upload returned.
/// - `image.deleteAll`: every image of the person, except `keep` when given (a path
///   `<uid>/<file>` of this person, or the request is `invalidRequest`; it need not exist).
///
/// Thread safety: a value type; ``run()`` is called once, from a `ServiceGroup` or a test task.
/// Handlers never block the cooperative thread pool: all file I/O runs on one serial queue
/// owned by the image storage, and handlers suspend until it is done.
public struct ImageUploadService: Service {
    public struct Configuration: Sendable {
        /// Where requests are answered.
        public var rpc: Endpoint
        /// The images root; each person's images are in a folder named after their uid.
        public var directory: String
        /// The largest image accepted, in bytes: from 1 to ``maxImageBytesCeiling``.
        public var maxImageBytes: Int
        /// The secret every request must carry (all of image-upload is service-only); `nil`
        /// trusts every caller (tests only).
        public var serviceToken: String?

        /// The highest ``maxImageBytes`` the service accepts: 1 GiB.
        public static let maxImageBytesCeiling = 1 << 30

        public init(
            rpc: Endpoint = Defaults.imageRPC, directory: String, maxImageBytes: Int = Defaults.maxImageBytes,
            serviceToken: String? = nil
        ) {
            self.rpc = rpc
            self.directory = directory
            self.maxImageBytes = maxImageBytes
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

    /// - Throws: ``ServiceError`` `invalidRequest` when the directory is empty or the image
    ///   limit is not from 1 byte to ``Configuration/maxImageBytesCeiling`` (1 GiB).
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
        self.configuration = configuration
        self.bus = bus
        self.logger = logger
    }

    /// Creates the images root if needed, removes temporary upload files a crash left behind,
    /// and answers requests until graceful shutdown or cancellation, letting requests in flight
    /// finish.
    ///
    /// - Throws: ``ServiceError`` `storeUnavailable` when the images root cannot be created, or
    ///   the bus's error (such as `addressInUse`) when the endpoint cannot be bound.
    public func run() async throws {
        let storage = ImageStorage(root: configuration.directory)
        let leftovers = try await storage.prepare()
        if leftovers > 0 {
            logger.notice(
                "removed temporary upload files left by an earlier run",
                metadata: ["count": "\(leftovers)", "directory": "\(configuration.directory)"])
        }
        logger.info("image-upload keeps images in \(configuration.directory)")
        let server = RequestServer(
            bus: bus, endpoint: configuration.rpc, limits: configuration.limits,
            dispatcher: Self.dispatcher(
                storage: storage, maxImageBytes: configuration.maxImageBytes, serviceToken: configuration.serviceToken,
                logger: logger),
            logger: logger, maxInFlight: 32)
        try await server.run()
    }

    private static func dispatcher(
        storage: ImageStorage, maxImageBytes: Int, serviceToken: String?, logger: Logger
    ) -> RequestDispatcher {
        var dispatcher = RequestDispatcher(
            source: ServiceName.imageUpload, sessions: nil, serviceToken: serviceToken, logger: logger)
        dispatcher.on(UploadImage.self, access: .service, attachment: .required) { request, context in
            let uid = try safeUID(context)
            if let problem = IdempotencyKey.problem(request.idempotencyKey) { throw problem }
            let bytes = context.attachment ?? Data()
            let kind = try judge(bytes, maxImageBytes: maxImageBytes)
            let stored = try await storage.store(bytes, kind: kind, uid: uid, key: request.idempotencyKey)
            let metadata: Logger.Metadata = ["uid": "\(uid)", "path": "\(stored.image.path)", "bytes": "\(stored.image.bytes)"]
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
                    "Field 'path' must be exactly '<uid>/<file>' as image.upload returned it, for the envelope's uid.")
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
                        "Field 'keep' must be exactly '<uid>/<file>' as image.upload returned it, for the envelope's uid.")
                }
                keep = file
            }
            let deleted = try await storage.deleteAll(uid: uid, keeping: keep)
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

    /// Decides whether `bytes` are an acceptable image: not empty, within the limit, and of an
    /// accepted kind by their magic numbers.
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
