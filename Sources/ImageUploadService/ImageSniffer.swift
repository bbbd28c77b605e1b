import OnboardingAPI

/// Tells an image's kind from its first bytes (magic numbers), whatever anyone says it is.
///
/// Pure and thread-safe. Reads at most the first ``inspectedBytes`` bytes.
public enum ImageSniffer {
    /// How far into the bytes the sniffer looks (enough for an `ftyp` box's brand list).
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

    private static func isHEIC(_ head: [UInt8]) -> Bool {
        guard head.count >= 12, ascii(head, 4..<8) == "ftyp" else { return false }
        let declaredSize = head[0..<4].reduce(0) { $0 << 8 | Int($1) }
        let boxEnd = declaredSize >= 16 ? min(declaredSize, head.count) : head.count
        var brands: Set<String> = [ascii(head, 8..<12)]
        var offset = 16
        while offset + 4 <= boxEnd {
            brands.insert(ascii(head, offset..<(offset + 4)))
            offset += 4
        }
        if !brands.isDisjoint(with: heicBrands) { return true }
        return !brands.isDisjoint(with: heifBrands) && brands.isDisjoint(with: avifBrands)
    }

    private static func ascii(_ bytes: [UInt8], _ range: Range<Int>) -> String {
        String(decoding: bytes[range], as: UTF8.self)
    }
}
