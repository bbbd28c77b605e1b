/// The image kinds accepted, judged by their first bytes and then decoded.
public enum ImageKind: String, Codable, Sendable, CaseIterable {
    case png, jpeg, webp, heic

    public var fileExtension: String { rawValue }
}

/// `image.upload`: the image bytes travel as the binary frame after the envelope.
public struct UploadImage: APIRequest {
    public typealias Response = StoredImage
    public static let type = "image.upload"

    /// What the sender says the bytes are. Informational only: the bytes decide.
    public var contentType: String?
    /// Makes a retried upload safe: an upload that repeats a key this person has used is
    /// answered with the image stored the first time, and stores nothing new. See ``IdempotencyKey``.
    public var idempotencyKey: String?

    public init(contentType: String? = nil, idempotencyKey: String? = nil) {
        self.contentType = contentType
        self.idempotencyKey = idempotencyKey
    }
}

public struct StoredImage: Codable, Sendable, Hashable {
    /// Where the image is stored, relative to image-upload's data directory: `<uid>/<file>`
    /// (see ``StoredImagePath``). The profile keeps this path.
    public var path: String
    /// The kind as stored: the uploaded kind, except HEIC, which is stored as JPEG.
    public var kind: ImageKind
    /// The stored file's size: the re-encoded image, not the upload.
    public var bytes: Int
    /// The square thumbnail stored beside the image, of the same kind:
    /// `<uid>/<name>.thumb.<extension>`. Absent only for an image stored by an earlier version,
    /// before thumbnails were made.
    public var thumbnailPath: String?

    public init(path: String, kind: ImageKind, bytes: Int, thumbnailPath: String? = nil) {
        self.path = path
        self.kind = kind
        self.bytes = bytes
        self.thumbnailPath = thumbnailPath
    }
}

/// `image.delete`: one image of the envelope's `uid`.
public struct DeleteImage: APIRequest {
    public typealias Response = DeletedImages
    public static let type = "image.delete"

    public var path: String
    public init(path: String) { self.path = path }
}

/// `image.deleteAll`: every image of the envelope's `uid`, except `keep`.
public struct DeleteAllImages: APIRequest {
    public typealias Response = DeletedImages
    public static let type = "image.deleteAll"

    /// A path (`<uid>/<file>`) to leave in place: the image the person's profile points at,
    /// when stray images of an unfinished set-up are removed.
    public var keep: String?
    /// The person withdrew: besides deleting, refuse their uploads from now on (`forbidden`),
    /// and undo one still under way when it lands. Not with `keep`.
    public var withdrawn: Bool?
    public init(keep: String? = nil, withdrawn: Bool? = nil) {
        self.keep = keep
        self.withdrawn = withdrawn
    }
}

public struct DeletedImages: Codable, Sendable, Hashable {
    public var deleted: Int
    public init(deleted: Int) { self.deleted = deleted }
}
