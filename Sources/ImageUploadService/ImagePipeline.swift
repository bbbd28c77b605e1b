import CVips
import Foundation
import Messaging
import OnboardingAPI

/// What one upload becomes: the image decoded, turned upright, stripped of every piece of
/// metadata and encoded again, and its square thumbnail.
public struct ProcessedImage: Sendable, Hashable {
    /// The kind as stored: the upload's, except HEIC, which is stored as JPEG.
    public var kind: ImageKind
    /// The re-encoded image: pixels only, nothing of the uploaded file's bytes.
    public var image: Data
    /// The square thumbnail, of the same kind.
    public var thumbnail: Data
    /// The stored image's size in pixels (upright).
    public var width: Int
    public var height: Int
}

/// The limits an image is held to before any pixel is decoded.
public struct ImageLimits: Sendable, Hashable {
    /// The most pixels (width × height, from the header).
    public var maxPixels: Int
    /// The longest side, in pixels.
    public var maxSide: Int
    /// The thumbnail's side, in pixels.
    public var thumbnailSide: Int

    public init(
        maxPixels: Int = Defaults.maxImagePixels, maxSide: Int = Defaults.maxImageSide,
        thumbnailSide: Int = Defaults.thumbnailSide
    ) {
        self.maxPixels = maxPixels
        self.maxSide = maxSide
        self.thumbnailSide = thumbnailSide
    }

    /// The most memory one decode holds: a decoded image is at most 4 bands of 16 bits (8 bytes)
    /// per pixel.
    public var decodedBytesBound: Int { maxPixels.multipliedReportingOverflow(by: 8).partialValue }
}

/// libvips, started once per process with the settings every decode relies on (see
/// `cvips_start`: one worker per pipeline, no cache, only the PNG, JPEG, WebP and HEIF buffer
/// loaders).
enum Vips {
    private static let started: Bool = cvips_start("image-upload") == 0

    /// - Throws: ``ServiceError`` `internalError` when libvips cannot start.
    static func start() throws(ServiceError) {
        guard started else {
            throw ServiceError(.internalError, "libvips could not start: \(takeError())")
        }
    }

    /// libvips's error text for the last failure (cleared), on one line.
    static func takeError() -> String {
        var buffer = [CChar](repeating: 0, count: 1024)
        cvips_take_error(&buffer, buffer.count)
        let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return text.split(whereSeparator: \.isNewline).joined(separator: "; ")
    }

    /// The peak of memory libvips has held for pixels since the process started.
    static var trackedMemoryPeak: Int { cvips_tracked_memory_peak() }
}

/// One reference to a libvips image, released when this object goes. Not `Sendable`: an image
/// stays on the thread that made it.
final class VipsImage {
    let pointer: OpaquePointer

    init?(_ pointer: OpaquePointer?) {
        guard let pointer else { return nil }
        self.pointer = pointer
    }

    deinit { cvips_release(pointer) }

    var width: Int { Int(cvips_width(pointer)) }
    var height: Int { Int(cvips_height(pointer)) }
    var loader: String? { cvips_loader(pointer).map { String(cString: $0) } }

    /// Encodes the image with no metadata at all.
    func encoded(as kind: ImageKind) -> Data? {
        var bytes: UnsafeMutableRawPointer?
        var length = 0
        let format: cvips_format =
            switch kind {
            case .png: CVIPS_PNG
            case .jpeg, .heic: CVIPS_JPEG
            case .webp: CVIPS_WEBP
            }
        guard cvips_save(pointer, format, 85, 0, &bytes, &length) == 0, let bytes else { return nil }
        defer { cvips_free(bytes) }
        return Data(bytes: bytes, count: length)
    }
}

/// The steps every upload goes through, run synchronously on one thread (a ``DecodePool``
/// thread in the service).
///
/// 1. The container: a PNG, JPEG or WebP must hold its whole structure (``ImageContainer``);
///    one cut short is `invalidImage` before anything is decoded.
/// 2. The header only: the loader must be the one of the kind the bytes were sniffed as, and the
///    size within ``ImageLimits`` (`tooLarge` otherwise): no pixel has been decoded yet.
/// 3. Every pixel decoded into memory (`invalidImage` for a truncated, header-only or damaged
///    file).
/// 4. Turned upright by its EXIF orientation; converted to sRGB through its ICC profile (or
///    from CMYK); flattened onto white when it has alpha and is stored as JPEG.
/// 5. Every metadata field removed, then encoded again with no metadata (PNG as PNG, JPEG as
///    JPEG, WebP as WebP, HEIC as JPEG), and the result's container stripped once more of
///    anything but pixels (``ImageContainer/strippingMetadata(_:kind:)``): nothing of the
///    uploaded file but its pixels is kept, not its EXIF, GPS, XMP, IPTC, ICC profile or
///    comments, nor bytes appended after it.
/// 6. A square thumbnail cut from the centre of the re-encoded image, encoded the same way.
enum ImagePipeline {
    /// The libvips loader for each kind.
    static func loader(of kind: ImageKind) -> String {
        switch kind {
        case .png: "pngload_buffer"
        case .jpeg: "jpegload_buffer"
        case .webp: "webpload_buffer"
        case .heic: "heifload_buffer"
        }
    }

    /// The kind an upload is stored as. HEIC becomes JPEG: libvips can write HEIC here, but
    /// only through x265, which takes seconds per photo on threads of its own (outside the
    /// decode-thread bound), and every client can show a JPEG.
    static func storedKind(of kind: ImageKind) -> ImageKind { kind == .heic ? .jpeg : kind }

    /// How far an upload got (tests ask, to show what was never done).
    enum Stage: Sendable, Hashable {
        /// The container structure is whole.
        case containerChecked
        /// The header was read and is within the limits.
        case headerAccepted
        /// Every pixel was decoded into memory.
        case decoded
        /// The image and its thumbnail were encoded again.
        case encoded
    }

    /// Runs every step on `bytes`, which were sniffed as `kind`. Blocks the calling thread.
    ///
    /// - Parameter reached: told of each stage as it is passed.
    /// - Throws: ``ServiceError`` `imageRejected` with reason `tooLarge`, `invalidImage` or
    ///   `unsupportedType`.
    static func process(
        _ bytes: Data, kind: ImageKind, limits: ImageLimits, reached: (Stage) -> Void = { _ in }
    ) throws(ServiceError) -> ProcessedImage {
        guard ImageContainer.isComplete(bytes, kind: kind) else {
            throw invalid("It ends before its last \(kind.rawValue) structure: it is truncated or only a header.")
        }
        reached(.containerChecked)
        do {
            return try bytes.withUnsafeBytes { raw in
                try process(raw, kind: kind, limits: limits, reached: reached)
            }
        } catch let error as ServiceError {
            throw error
        } catch {
            throw ServiceError(.internalError, "image-upload could not process the image: \(error)")
        }
    }

    private static func process(
        _ raw: UnsafeRawBufferPointer, kind: ImageKind, limits: ImageLimits, reached: (Stage) -> Void
    ) throws(ServiceError) -> ProcessedImage {
        guard let header = VipsImage(cvips_open(raw.baseAddress, raw.count)) else {
            throw invalid("Its header could not be read (\(Vips.takeError())).")
        }
        guard header.loader == loader(of: kind) else {
            throw ServiceError(
                .imageRejected, "The bytes start like \(kind.rawValue) but are not a \(kind.rawValue) image.",
                reason: "unsupportedType")
        }
        let (width, height) = (header.width, header.height)
        let (pixels, overflow) = width.multipliedReportingOverflow(by: height)
        guard width <= limits.maxSide, height <= limits.maxSide, !overflow, pixels <= limits.maxPixels else {
            throw ServiceError(
                .imageRejected,
                "The image is \(width) × \(height) pixels; the limits are \(limits.maxSide) pixels a side and "
                    + "\(limits.maxPixels) pixels in all.",
                reason: "tooLarge")
        }
        reached(.headerAccepted)
        guard let decoded = VipsImage(cvips_decode(header.pointer)) else {
            throw invalid("Its pixels could not be decoded; it may be truncated or damaged (\(Vips.takeError())).")
        }
        reached(.decoded)
        let storedKind = storedKind(of: kind)
        guard let upright = VipsImage(cvips_autorotate(decoded.pointer)),
            let srgb = VipsImage(cvips_to_srgb(upright.pointer)),
            let flattened = storedKind == .jpeg ? VipsImage(cvips_flatten(srgb.pointer)) : srgb,
            let clean = VipsImage(cvips_strip(flattened.pointer)),
            let encoded = clean.encoded(as: storedKind),
            let image = ImageContainer.strippingMetadata(encoded, kind: storedKind)
        else {
            // The bytes were a whole image: failing to write it again is ours, not the sender's.
            throw ServiceError(.internalError, "The image decoded but could not be stored again; try again. \(Vips.takeError())")
        }
        // libvips reads the bytes lazily, without a copy: everything that touches them runs
        // while they are pinned.
        let thumbnailBytes: Data? = image.withUnsafeBytes { bytes in
            guard
                let thumbnail = VipsImage(
                    cvips_square_thumbnail_of_bytes(bytes.baseAddress, bytes.count, Int32(limits.thumbnailSide))),
                let cleanThumbnail = VipsImage(cvips_strip(thumbnail.pointer)),
                let encodedThumbnail = cleanThumbnail.encoded(as: storedKind)
            else { return nil }
            return ImageContainer.strippingMetadata(encodedThumbnail, kind: storedKind)
        }
        guard let thumbnailBytes else {
            throw invalid("Its thumbnail could not be made (\(Vips.takeError())).")
        }
        reached(.encoded)
        return ProcessedImage(kind: storedKind, image: image, thumbnail: thumbnailBytes, width: clean.width, height: clean.height)
    }

    private static func invalid(_ message: String) -> ServiceError {
        ServiceError(.imageRejected, "The image is not a whole image of its kind. \(message)", reason: "invalidImage")
    }
}

/// Decodes, checks and re-encodes uploads on a ``DecodePool`` of its own.
///
/// Memory: at most ``threads`` images are decoded at once, each holding at most
/// ``ImageLimits/decodedBytesBound`` bytes of pixels (40 megapixels × 8 bytes = 320 MB by
/// default, 120 MB for a 40-megapixel RGB photo), plus the encoded copies. Uploads beyond the
/// threads wait (at most `queueLimit`) holding only their bytes.
///
/// Threading: every method may be called from any task; ``process(_:kind:)`` suspends its caller
/// until a decode thread has done the work.
public final class ImageProcessor: Sendable {
    public let limits: ImageLimits
    public let threads: Int
    let pool: DecodePool

    /// Starts libvips (once per process) and `threads` decode threads.
    ///
    /// - Throws: ``ServiceError`` `internalError` when libvips cannot start.
    public init(limits: ImageLimits = ImageLimits(), threads: Int = Defaults.imageDecodeThreads, queueLimit: Int = 64)
        throws(ServiceError)
    {
        try Vips.start()
        self.limits = limits
        self.threads = threads
        self.pool = DecodePool(threads: threads, queueLimit: queueLimit, name: "image-decode")
    }

    /// The upload sniffed as `kind`, processed (see ``ImagePipeline``).
    ///
    /// - Throws: ``ServiceError`` `imageRejected` (`tooLarge`, `invalidImage`,
    ///   `unsupportedType`), or `overloaded` when too many uploads are waiting.
    public func process(_ bytes: Data, kind: ImageKind) async throws(ServiceError) -> ProcessedImage {
        let limits = self.limits
        return try await pool.run { Result { () throws(ServiceError) in try ImagePipeline.process(bytes, kind: kind, limits: limits) } }
            .get()
    }

    /// The most decodes that ever ran at once, and how many have finished.
    public var decodeStatistics: (mostRunning: Int, completed: Int) {
        let statistics = pool.statistics
        return (statistics.mostRunning, statistics.completed)
    }

    /// The peak of memory libvips has held for pixels in this process (all processors together).
    public static var trackedMemoryPeak: Int { Vips.trackedMemoryPeak }

    /// Lets the decode threads end once queued work has run.
    public func shutdown() { pool.shutdown() }
}
