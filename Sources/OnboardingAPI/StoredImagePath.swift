/// The names image-upload gives the files it stores, in one place: image-upload makes and deletes
/// them, and the profile store accepts no other image path.
///
/// An image is `<uid>/<name>.<extension>` and its thumbnail `<uid>/<name>.thumb.<extension>`,
/// where `<name>` is a new lowercase UUID or the upload's idempotency key (1 to 64 of
/// `A-Z a-z 0-9 - _`, so never a `.` or `/`) and `<extension>` an ``ImageKind``'s
/// (`png`, `jpeg`, `webp`, `heic`). Nothing else (`<uid>/evil<script>.html`, `../x`, a thumbnail
/// in place of an image) has that shape.
///
/// Pure and thread-safe; every check reads at most a few hundred bytes of its input.
public enum StoredImagePath {
    /// What sits between a thumbnail's name and its extension.
    public static let thumbnailSuffix = ".thumb"

    /// The longest path the store makes: a 64-character uid, a 64-character key, the thumbnail
    /// suffix and the longest extension.
    static let maximumLength = 64 + 1 + 64 + thumbnailSuffix.utf8.count + 1 + 4

    /// Whether `name` is an image's file name, `<name>.<extension>` (not a thumbnail's).
    public static func isImageFileName(_ name: Substring) -> Bool {
        guard name.utf8.count <= maximumLength, let dot = name.lastIndex(of: ".") else { return false }
        return IdempotencyKey.isValid(String(name[..<dot])) && isExtension(name[name.index(after: dot)...])
    }

    public static func isImageFileName(_ name: String) -> Bool { isImageFileName(name[...]) }

    /// Whether `name` is a thumbnail's file name, `<name>.thumb.<extension>`.
    public static func isThumbnailFileName(_ name: String) -> Bool {
        guard name.utf8.count <= maximumLength, let dot = name.lastIndex(of: ".") else { return false }
        let stem = name[..<dot]
        guard stem.hasSuffix(thumbnailSuffix) else { return false }
        return IdempotencyKey.isValid(String(stem.dropLast(thumbnailSuffix.count)))
            && isExtension(name[name.index(after: dot)...])
    }

    /// The thumbnail file name of the image file `name`, or `nil` when `name` is not an image's.
    public static func thumbnailFileName(ofImage name: String) -> String? {
        guard isImageFileName(name), let dot = name.lastIndex(of: ".") else { return nil }
        return "\(name[..<dot])\(thumbnailSuffix)\(name[dot...])"
    }

    /// The image's file name when `path` is exactly `<uid>/<image file name>`, otherwise `nil`.
    public static func imageFileName(in path: String, uid: String) -> String? {
        guard path.utf8.count <= maximumLength, !uid.isEmpty else { return nil }
        let parts = path.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2, parts[0] == uid, isImageFileName(parts[1]) else { return nil }
        return String(parts[1])
    }

    /// The thumbnail path of the image at `path` (`<uid>/<name>.<extension>`), or `nil`.
    public static func thumbnailPath(ofImage path: String, uid: String) -> String? {
        imageFileName(in: path, uid: uid).flatMap(thumbnailFileName(ofImage:)).map { "\(uid)/\($0)" }
    }

    private static func isExtension(_ text: Substring) -> Bool {
        ImageKind.allCases.contains { $0.fileExtension == text }
    }
}
