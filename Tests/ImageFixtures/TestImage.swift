import CVips
import Foundation

/// Real images for tests, made with libvips itself: any size, any of the four kinds, with EXIF
/// (GPS included) and an orientation when asked.
///
/// Threading: every function may be called from any thread; images never leave the call.
public enum TestImage {
    public enum Format: Sendable, CaseIterable, CustomStringConvertible {
        case png, jpeg, webp, heic

        var cvips: cvips_format {
            switch self {
            case .png: CVIPS_PNG
            case .jpeg: CVIPS_JPEG
            case .webp: CVIPS_WEBP
            case .heic: CVIPS_HEIC
            }
        }

        public var description: String {
            switch self {
            case .png: "png"
            case .jpeg: "jpeg"
            case .webp: "webp"
            case .heic: "heic"
            }
        }
    }

    /// An RGB colour.
    public typealias Colour = (red: UInt8, green: UInt8, blue: UInt8)
    public static let red: Colour = (230, 20, 20)
    public static let blue: Colour = (20, 20, 230)

    private static let started: Bool = cvips_start("tests") == 0

    /// Encodes a `width` × `height` RGB image whose pixels `colour` gives.
    ///
    /// - Parameters:
    ///   - exif: a whole EXIF block (starting `Exif\0\0`), written into the file.
    ///   - orientation: the EXIF orientation (1 to 8) written into the file.
    ///   - comment: a PNG text chunk (`png-comment-0-Comment`).
    public static func make(
        _ format: Format, width: Int, height: Int, quality: Int = 92, exif: [UInt8]? = nil, orientation: Int? = nil,
        comment: String? = nil, colour: (_ x: Int, _ y: Int) -> Colour = { _, _ in (90, 140, 200) }
    ) -> Data {
        precondition(started, "libvips did not start")
        var pixels = [UInt8]()
        pixels.reserveCapacity(width * height * 3)
        for y in 0..<height {
            for x in 0..<width {
                let (r, g, b) = colour(x, y)
                pixels += [r, g, b]
            }
        }
        let image = pixels.withUnsafeBytes { cvips_from_pixels($0.baseAddress, $0.count, Int32(width), Int32(height), 3) }!
        defer { cvips_release(image) }
        if let exif { exif.withUnsafeBytes { cvips_set_blob(image, "exif-data", $0.baseAddress, $0.count) } }
        if let orientation { cvips_set_int(image, "orientation", Int32(orientation)) }
        if let comment {
            cvips_set_string(image, "png-comment-0-Comment", comment)
        }
        let keep: Int32 = exif != nil || orientation != nil || comment != nil ? 1 : 0
        var bytes: UnsafeMutableRawPointer?
        var length = 0
        guard cvips_save(image, format.cvips, Int32(quality), keep, &bytes, &length) == 0, let bytes else {
            fatalError("libvips could not write a test \(format): \(error())")
        }
        defer { cvips_free(bytes) }
        return Data(bytes: bytes, count: length)
    }

    /// A picture with a left half of `left` and a right half of `right`, with a smooth gradient
    /// elsewhere: JPEG-friendly, and tells which way up it is.
    public static func halves(_ format: Format, width: Int, height: Int, left: Colour = red, right: Colour = blue) -> Data {
        make(format, width: width, height: height) { x, _ in x < width / 2 ? left : right }
    }

    /// A large image that still compresses well (a gradient), for memory and concurrency tests.
    public static func gradient(_ format: Format, width: Int, height: Int) -> Data {
        make(format, width: width, height: height, quality: 80) { x, y in
            (UInt8(truncatingIfNeeded: x / 16), UInt8(truncatingIfNeeded: y / 16), UInt8(truncatingIfNeeded: (x + y) / 32))
        }
    }

    /// Whether libvips can write HEIC on this machine (libheif with an HEVC encoder).
    public static let canWriteHEIC: Bool = {
        precondition(started, "libvips did not start")
        let pixels = [UInt8](repeating: 128, count: 16 * 16 * 3)
        guard let image = pixels.withUnsafeBytes({ cvips_from_pixels($0.baseAddress, $0.count, 16, 16, 3) }) else { return false }
        defer { cvips_release(image) }
        var bytes: UnsafeMutableRawPointer?
        var length = 0
        guard cvips_save(image, CVIPS_HEIC, 50, 0, &bytes, &length) == 0, let bytes else {
            _ = error()
            return false
        }
        cvips_free(bytes)
        return true
    }()

    /// libvips's last error, cleared.
    public static func error() -> String {
        var buffer = [CChar](repeating: 0, count: 1024)
        cvips_take_error(&buffer, buffer.count)
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Whether libvips will open `bytes` at all (the loader is allowed and the header reads).
    public static func opens(_ bytes: Data) -> Bool {
        precondition(started, "libvips did not start")
        let image = bytes.withUnsafeBytes { cvips_open($0.baseAddress, $0.count) }
        defer { cvips_release(image) }
        if image == nil { _ = error() }
        return image != nil
    }

    /// `bytes` decoded: size, loader, metadata fields and the colour of some pixels.
    public static func decode(_ bytes: Data, sampling points: [(x: Int, y: Int)] = []) -> Decoded? {
        precondition(started, "libvips did not start")
        return bytes.withUnsafeBytes { raw -> Decoded? in
            guard let header = cvips_open(raw.baseAddress, raw.count) else {
                _ = error()
                return nil
            }
            defer { cvips_release(header) }
            guard let image = cvips_decode(header) else {
                _ = error()
                return nil
            }
            defer { cvips_release(image) }
            let fields = Decoded.metadataFields.filter { cvips_has_field(image, $0) != 0 }
            let samples = points.map { point -> [Double] in
                var values = [Double](repeating: 0, count: 8)
                let count = cvips_pixel(image, Int32(point.x), Int32(point.y), &values, 8)
                return Array(values.prefix(max(0, Int(count))))
            }
            return Decoded(
                width: Int(cvips_width(image)), height: Int(cvips_height(image)), bands: Int(cvips_bands(image)),
                loader: cvips_loader(image).map { String(cString: $0) } ?? "", fields: Set(fields),
                orientation: Int(cvips_int_field(image, "orientation", 1)), samples: samples)
        }
    }

    public struct Decoded: Sendable {
        /// The metadata fields ``decode(_:sampling:)`` looks for.
        public static let metadataFields = [
            "exif-data", "xmp-data", "iptc-data", "icc-profile-data", "png-comment-0-Comment", "exif-ifd3-GPSLatitude",
            "exif-ifd0-Orientation", "orientation",
        ]
        public var width: Int
        public var height: Int
        public var bands: Int
        public var loader: String
        /// Which of ``metadataFields`` the file carries.
        public var fields: Set<String>
        public var orientation: Int
        /// The bands of each sampled pixel, in the order asked.
        public var samples: [[Double]]
    }
}

/// Whether a sampled pixel is close to `colour` (lossy formats move colours a little).
public func isClose(_ sample: [Double], to colour: TestImage.Colour, tolerance: Double = 40) -> Bool {
    guard sample.count >= 3 else { return false }
    return abs(sample[0] - Double(colour.red)) <= tolerance && abs(sample[1] - Double(colour.green)) <= tolerance
        && abs(sample[2] - Double(colour.blue)) <= tolerance
}
