import OnboardingAPI

/// Tells an image's kind from its first bytes (magic numbers), whatever anyone says it is.
///
/// Pure and thread-safe. Reads at most the first ``inspectedBytes`` bytes.
public enum ImageSniffer {
    /// How far into the bytes the sniffer looks (enough for an `ftyp` box's brand list; a longer
    /// `ftyp` box is not accepted).
    public static let inspectedBytes = 4096

    private static let png: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]
    private static let jpeg: [UInt8] = [0xFF, 0xD8, 0xFF]
    /// Brands that name HEVC-coded HEIF content.
    private static let heicBrands: Set<String> = ["heic", "heix", "hevc", "hevx", "heim", "heis"]
    /// Generic HEIF brands: an image only when no AVIF brand says it is AV1-coded.
    private static let heifBrands: Set<String> = ["mif1", "msf1"]
    private static let avifBrands: Set<String> = ["avif", "avis"]

    /// The kind of image `bytes` hold, or `nil` when they are not PNG, JPEG, WebP or HEIC.
    ///
    /// HEIC means an ISO BMFF file whose `ftyp` box names a HEIC brand (`heic`, `heix`, `hevc`,
    /// `hevx`, `heim`, `heis`) as its major or a compatible brand, or the generic `mif1`/`msf1`
    /// without an AVIF brand. AVIF files are not accepted.
    public static func kind(of bytes: some Collection<UInt8>) -> ImageKind? {
        let head = Array(bytes.prefix(inspectedBytes))
        if head.starts(with: png) { return .png }
        if head.starts(with: jpeg) { return .jpeg }
        if head.count >= 12, ascii(head, 0..<4) == "RIFF", ascii(head, 8..<12) == "WEBP" { return .webp }
        if isHEIC(head) { return .heic }
        return nil
    }

    /// Whether `head` starts with a well-formed `ftyp` box that names HEIC content.
    ///
    /// Brands are read only from inside the box as its size declares it; a box that is too
    /// small, whose brand list is not whole 4-byte brands, or that runs past the bytes seen is
    /// not HEIC. A size of 0 ("to the end of the file") is refused too: an `ftyp` box that is the
    /// whole file leaves no room for the image.
    private static func isHEIC(_ head: [UInt8]) -> Bool {
        guard head.count >= 8, ascii(head, 4..<8) == "ftyp" else { return false }
        let headerSize: Int
        let boxSize: UInt64
        switch bigEndian(head, 0..<4) {
        case 0:
            return false
        case 1:
            // A 64-bit `largesize` follows the box type.
            guard head.count >= 16 else { return false }
            headerSize = 16
            boxSize = bigEndian(head, 8..<16)
        case let size:
            headerSize = 8
            boxSize = size
        }
        // Major brand and minor version (4 bytes each), then whole compatible brands.
        let minimumSize = headerSize + 8
        guard boxSize >= UInt64(minimumSize), boxSize <= UInt64(head.count),
            (boxSize - UInt64(minimumSize)) % 4 == 0
        else { return false }
        let boxEnd = Int(boxSize)
        var brands: Set<String> = [ascii(head, headerSize..<(headerSize + 4))]
        for offset in stride(from: minimumSize, to: boxEnd, by: 4) {
            brands.insert(ascii(head, offset..<(offset + 4)))
        }
        if !brands.isDisjoint(with: heicBrands) { return true }
        return !brands.isDisjoint(with: heifBrands) && brands.isDisjoint(with: avifBrands)
    }

    private static func bigEndian(_ bytes: [UInt8], _ range: Range<Int>) -> UInt64 {
        bytes[range].reduce(0) { $0 << 8 | UInt64($1) }
    }

    private static func ascii(_ bytes: [UInt8], _ range: Range<Int>) -> String {
        String(decoding: bytes[range], as: UTF8.self)
    }
}
