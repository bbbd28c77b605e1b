import Dispatch
import Foundation
import Messaging
import OnboardingAPI

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The images on disk: `<root>/<uid>/<name>.<extension>`, each with its thumbnail beside it,
/// `<root>/<uid>/<name>.thumb.<extension>` (see ``StoredImagePath``), where the name is a new
/// lowercase UUID, or the upload's idempotency key when it had one. The file name is the whole
/// index of keys: a repeated key finds its image after a restart with no other state to keep.
///
/// Only their owner can read them: the root and every person's folder are 0700, every file 0600,
/// and ``prepare()`` tightens what an earlier version left more open.
///
/// Threading: callable from any task. Every file operation (create, write, fsync, rename, unlink,
/// directory listing and removal) runs on this storage's own serial `DispatchQueue`, never on
/// Swift's cooperative thread pool; callers suspend until it is done. `io(_:_:)` is the only way
/// onto that queue, and nothing else in this type touches the file system. Operations run one at a
/// time in the order they were asked for, so one person's upload and delete never interleave.
/// An operation that has started runs to the end even when its caller is cancelled.
final class ImageStorage: Sendable {
    let root: String
    /// The one thread of file I/O. A serial queue of its own (not the cooperative pool), so a
    /// slow write or fsync blocks only other image I/O, never the process's tasks. Not NIO's
    /// thread pool: its shared pool runs jobs side by side, a pool of one thread must be shut
    /// down by whoever made it, and it drops a job whose caller was cancelled before it
    /// started, where a half-known upload must still run to the end.
    private let queue: DispatchQueue

    init(root: String) {
        self.root = root
        self.queue = DispatchQueue(label: "image-upload.storage", qos: .utility)
    }

    /// Folders are created, and tightened to, this mode: only their owner may list or enter them.
    static let folderMode: mode_t = 0o700
    /// Files are created, and tightened to, this mode: only their owner may read them.
    static let fileMode: mode_t = 0o600

    /// What ``prepare()`` removed.
    struct Sweep: Sendable, Hashable {
        /// Temporary upload files a crash left.
        var temporaryFiles = 0
        /// Folders of people who withdrew more than ``withdrawnMarkAge`` ago (their mark and all).
        var withdrawals = 0
    }

    /// Creates the images root if it does not exist, tightens the modes of what is there (the
    /// root and each person's folder 0700, each file 0600), and clears what a crash left behind:
    /// temporary upload files (`.upload-*.tmp`, never valid images), thumbnails whose image is
    /// gone, and person folders that are then empty. It also removes the folders that hold only
    /// the mark of a withdrawal (``withdrawnMarker``) made ``withdrawnMarkAge`` or more ago:
    /// nothing is kept for a person who withdrew longer than that.
    ///
    /// Replicas may share the folder, so a file counts as left behind only once it is
    /// ``leftoverAge`` old: younger ones may be another replica's upload under way (which takes
    /// milliseconds), and are left for a later sweep.
    ///
    /// The service sweeps at start and every ``ImageUploadService/sweepInterval`` after.
    func prepare() async throws(ServiceError) -> Sweep {
        let root = self.root
        let uids = try await io("preparing the images folder") {
            try FileManager.default.createDirectory(
                atPath: root, withIntermediateDirectories: true, attributes: [.posixPermissions: Self.folderMode])
            try Self.posix("chmod") { chmod(root, Self.folderMode) }
            return try FileManager.default.contentsOfDirectory(atPath: root).filter(ImagePaths.isSafeUID)
        }
        // A folder at a time: uploads and deletions wait for one folder's sweep, not the whole.
        var swept = Sweep()
        for uid in uids {
            let folder = "\(root)/\(uid)"
            let found = try await io("sweeping the images folder") { try Self.sweep(folder) }
            swept.temporaryFiles += found.temporaryFiles
            swept.withdrawals += found.withdrawals
        }
        return swept
    }

    /// ``prepare()``'s work in one person's folder. Runs on the storage's queue. What another
    /// replica removes meanwhile (ENOENT) is simply gone.
    private static func sweep(_ folder: String) throws -> Sweep {
        var swept = Sweep()
        guard isDirectory(folder) else { return swept }
        try posixUnlessGone("chmod") { chmod(folder, folderMode) }
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: folder) else { return swept }
        let mark = "\(folder)/\(withdrawnMarker)"
        if names == [withdrawnMarker], isOlder(mark, than: withdrawnMarkAge) {
            try posixUnlessGone("unlink") { unlink(mark) }
            try removeFolderIfEmpty(folder)
            swept.withdrawals += 1
            return swept
        }
        // Before removing anything (which makes it young): a young folder may be another
        // replica's, about to get its first image.
        let settled = isLeftover(folder)
        let present = Set(names)
        for name in names where isRegularFile("\(folder)/\(name)") {
            let path = "\(folder)/\(name)"
            if ImagePaths.isTemporaryFileName(name) {
                // Made 0600; a young one is another replica's upload under way.
                guard isLeftover(path) else { continue }
                try posixUnlessGone("unlink") { unlink(path) }
                swept.temporaryFiles += 1
            } else if StoredImagePath.isThumbnailFileName(name), !present.contains(imageFileName(ofThumbnail: name)),
                isLeftover(path)
            {
                // Written before its image, which a crash then never stored.
                try posixUnlessGone("unlink") { unlink(path) }
            } else {
                try posixUnlessGone("chmod") { chmod(path, fileMode) }
            }
        }
        if settled { try removeFolderIfEmpty(folder) }
        return swept
    }

    /// `<name>.<extension>` for the thumbnail name `<name>.thumb.<extension>`.
    private static func imageFileName(ofThumbnail name: String) -> String {
        name.replacingOccurrences(of: StoredImagePath.thumbnailSuffix + ".", with: ".", options: .backwards)
    }

    /// What ``store(_:uid:key:)`` did.
    struct Stored: Sendable, Hashable {
        /// The image as stored: this upload's, or the one stored earlier under the same key.
        var image: StoredImage
        /// `false` when the key had been used before and nothing new was stored.
        var isNew: Bool
    }

    /// The image `uid` stored under `key` (in whichever kind), if there is one.
    func image(key: String, uid: String) async throws(ServiceError) -> StoredImage? {
        let folder = "\(root)/\(uid)"
        return try await io("looking up the image") { Self.keyedImage(key: key, in: folder, uid: uid) }
    }

    /// Stores the processed image and its thumbnail in `uid`'s folder, under a new name, or under
    /// `key` when given.
    ///
    /// With a `key` whose image is already stored (in any of the kinds), nothing is written and
    /// that image is answered, with its own kind and size. The look-up and the writes run in one
    /// operation on the storage's serial queue, so of two uploads with one key exactly one
    /// stores its files; and the image's final name is made with `link`, which never replaces a
    /// file.
    ///
    /// Each file goes to a temporary file in the same folder, is flushed to disk, and only then
    /// gets its final name, so a crash never leaves a partial file under that name. The thumbnail
    /// gets its name first: an image is never there without its thumbnail, and a thumbnail
    /// whose image never got its name is removed by the next ``prepare()``.
    ///
    /// - Parameter key: a valid ``IdempotencyKey`` (the caller checks it). On a file system
    ///   that ignores letter case (macOS by default), keys that differ only in case name one file.
    func store(_ processed: ProcessedImage, uid: String, key: String? = nil) async throws(ServiceError) -> Stored {
        let folder = "\(root)/\(uid)"
        let kind = processed.kind
        return try await io("storing the image") {
            if let key, let earlier = Self.keyedImage(key: key, in: folder, uid: uid) {
                return Stored(image: earlier, isNew: false)
            }
            let file = key.map { ImagePaths.keyedFileName(key: $0, kind: kind) } ?? ImagePaths.newFileName(kind: kind)
            guard let thumbnail = StoredImagePath.thumbnailFileName(ofImage: file) else {
                throw POSIXFailure(call: "naming \(file)", code: EINVAL)
            }
            try FileManager.default.createDirectory(
                atPath: folder, withIntermediateDirectories: true, attributes: [.posixPermissions: Self.folderMode])
            try Self.refuseIfWithdrawn(folder, uid: uid)
            try Self.place(processed.thumbnail, at: "\(folder)/\(thumbnail)", replacing: true)
            do {
                try Self.place(processed.image, at: "\(folder)/\(file)", replacing: false)
            } catch let failure as POSIXFailure where failure.code == EEXIST {
                // Another process sharing the folder stored this key first (and its thumbnail,
                // which ours has replaced: both are of an upload with this key).
                if let key, let earlier = Self.keyedImage(key: key, in: folder, uid: uid) {
                    return Stored(image: earlier, isNew: false)
                }
                throw failure
            }
            // A withdrawal's deletion may have run on another replica while this upload was
            // under way (it marks the folder first, then deletes): what landed after it goes.
            if Self.isRegularFile("\(folder)/\(Self.withdrawnMarker)") {
                unlink("\(folder)/\(file)")
                unlink("\(folder)/\(thumbnail)")
                try Self.refuseIfWithdrawn(folder, uid: uid)
            }
            let image = StoredImage(
                path: "\(uid)/\(file)", kind: kind, bytes: processed.image.count, thumbnailPath: "\(uid)/\(thumbnail)")
            return Stored(image: image, isNew: true)
        }
    }

    /// Writes `bytes` to a temporary file in the destination's folder, flushes it, and gives it
    /// its final name: with `rename` (replacing a file of that name) or with `link` (failing with
    /// `EEXIST` when there is one). Runs on the storage's queue.
    private static func place(_ bytes: Data, at path: String, replacing: Bool) throws {
        let folder = (path as NSString).deletingLastPathComponent
        let temporary = "\(folder)/\(ImagePaths.newTemporaryFileName())"
        defer { unlink(temporary) }
        try writeAndSync(bytes, to: temporary)
        if replacing {
            try posix("rename") { rename(temporary, path) }
        } else {
            try posix("link") { link(temporary, path) }
        }
    }

    /// The image stored under `key` in `folder`, in whichever kind it was stored, if any.
    /// Runs on the storage's queue.
    private static func keyedImage(key: String, in folder: String, uid: String) -> StoredImage? {
        for kind in ImageKind.allCases {
            let file = ImagePaths.keyedFileName(key: key, kind: kind)
            var status = stat()
            guard lstat("\(folder)/\(file)", &status) == 0, status.st_mode & S_IFMT == S_IFREG else { continue }
            let thumbnail = StoredImagePath.thumbnailFileName(ofImage: file).flatMap { isRegularFile("\(folder)/\($0)") ? $0 : nil }
            return StoredImage(
                path: "\(uid)/\(file)", kind: kind, bytes: Int(status.st_size), thumbnailPath: thumbnail.map { "\(uid)/\($0)" })
        }
        return nil
    }

    /// Deletes one image of `uid` and its thumbnail, and `uid`'s folder when that was the last
    /// thing in it.
    ///
    /// - Parameter file: an image's file name (``StoredImagePath/isImageFileName(_:)-swift.type.method``).
    /// - Returns: `false` when there was no such image.
    func delete(uid: String, file: String) async throws(ServiceError) -> Bool {
        let folder = "\(root)/\(uid)"
        return try await io("deleting the image") {
            guard unlink("\(folder)/\(file)") == 0 else {
                if errno == ENOENT { return false }
                throw POSIXFailure(call: "unlink", code: errno)
            }
            if let thumbnail = StoredImagePath.thumbnailFileName(ofImage: file), unlink("\(folder)/\(thumbnail)") != 0,
                errno != ENOENT
            {
                throw POSIXFailure(call: "unlink", code: errno)
            }
            // The image is gone whatever happens next; a folder that cannot be removed is
            // left for the next start-up's sweep rather than reported as a failed delete.
            try? Self.removeFolderIfEmpty(folder)
            return true
        }
    }

    /// Deletes `uid`'s folder and everything in it, or, with `keep`, everything in it but
    /// that image and its thumbnail (the folder stays while it holds anything).
    ///
    /// With `withdrawn` (the person withdrew; a uid is never used again), the folder stays with
    /// one file in it, ``withdrawnMarker``, written before anything is deleted: from then on
    /// ``store(_:uid:key:)`` refuses `uid`'s uploads, and one already under way (on another
    /// replica sharing the folder, or held up here) removes what it wrote when it lands.
    ///
    /// - Parameter keep: an image's file name in the folder to leave in place; it need not exist.
    /// - Returns: how many images were deleted (0 when there was no folder).
    func deleteAll(uid: String, keeping keep: String? = nil, withdrawn: Bool = false) async throws(ServiceError) -> Int {
        let folder = "\(root)/\(uid)"
        return try await io("deleting the images") {
            if withdrawn {
                try FileManager.default.createDirectory(
                    atPath: folder, withIntermediateDirectories: true, attributes: [.posixPermissions: Self.folderMode])
                if !Self.isRegularFile("\(folder)/\(Self.withdrawnMarker)") {
                    try Self.writeAndSync(Data(), to: "\(folder)/\(Self.withdrawnMarker)")
                }
                var deleted = 0
                for name in try FileManager.default.contentsOfDirectory(atPath: folder) where name != Self.withdrawnMarker {
                    guard unlink("\(folder)/\(name)") == 0 || errno == ENOENT else { throw POSIXFailure(call: "unlink", code: errno) }
                    if ImagePaths.isImageFileName(name) { deleted += 1 }
                }
                return deleted
            }
            let names: [String]
            do {
                names = try FileManager.default.contentsOfDirectory(atPath: folder)
            } catch let error as CocoaError where error.code == .fileReadNoSuchFile {
                return 0
            }
            guard let keep else {
                try FileManager.default.removeItem(atPath: folder)
                return names.filter(ImagePaths.isImageFileName).count
            }
            var deleted = 0
            let kept: Set = [keep, StoredImagePath.thumbnailFileName(ofImage: keep) ?? keep]
            for name in names where !kept.contains(name) {
                try FileManager.default.removeItem(atPath: "\(folder)/\(name)")
                if ImagePaths.isImageFileName(name) { deleted += 1 }
            }
            try Self.removeFolderIfEmpty(folder)
            return deleted
        }
    }

    /// The one place file I/O happens: runs `body` on the storage's queue, suspending the caller
    /// until it is done, and turns any failure into `storeUnavailable`.
    private func io<T: Sendable>(
        _ what: String, _ body: @escaping @Sendable () throws -> T
    ) async throws(ServiceError) -> T {
        do {
            return try await withCheckedThrowingContinuation { continuation in
                queue.async { continuation.resume(with: Result(catching: body)) }
            }
        } catch let error as ServiceError {
            throw error
        } catch {
            throw ServiceError(.storeUnavailable, "The image store failed while \(what) (\(error)). Try again.")
        }
    }

    /// Removes `folder` when it is empty; does nothing when it holds anything or is gone.
    private static func removeFolderIfEmpty(_ folder: String) throws {
        guard rmdir(folder) == 0 else {
            if [ENOTEMPTY, EEXIST, ENOENT].contains(errno) { return }
            throw POSIXFailure(call: "rmdir", code: errno)
        }
    }

    private static func isDirectory(_ path: String) -> Bool { fileType(path) == S_IFDIR }

    /// The file a withdrawal leaves in the person's folder (see ``deleteAll(uid:keeping:withdrawn:)``).
    static let withdrawnMarker = ".withdrawn"

    /// Throws `forbidden` when `uid` has withdrawn.
    private static func refuseIfWithdrawn(_ folder: String, uid: String) throws {
        guard isRegularFile("\(folder)/\(withdrawnMarker)") else { return }
        throw ServiceError(.forbidden, "\(uid) has withdrawn: their images are deleted, and no more are stored.")
    }

    /// How old a temporary file or a thumbnail without its image must be before ``prepare()``
    /// takes it for a crash's leftover, in seconds.
    static let leftoverAge = 60

    /// How long a withdrawal's mark is kept, in seconds: a day. An upload held up by a stopped
    /// replica gave up (its request's deadline is seconds) long before; the uid is never used
    /// again, so nothing needs the mark after that.
    static let withdrawnMarkAge = 86_400

    /// Whether `path` was last changed ``leftoverAge`` or more seconds ago.
    private static func isLeftover(_ path: String) -> Bool {
        isOlder(path, than: leftoverAge)
    }

    /// Whether `path` was last changed `age` or more seconds ago.
    private static func isOlder(_ path: String, than age: Int) -> Bool {
        var status = stat()
        guard lstat(path, &status) == 0 else { return false }
        return Int(time(nil)) - Int(status.st_mtim.tv_sec) >= age
    }

    private static func isRegularFile(_ path: String) -> Bool { fileType(path) == S_IFREG }

    /// The type bits of `path` itself (a symbolic link is not followed), or `nil` when it is gone.
    private static func fileType(_ path: String) -> mode_t? {
        var status = stat()
        guard lstat(path, &status) == 0 else { return nil }
        return status.st_mode & S_IFMT
    }

    private static func writeAndSync(_ bytes: Data, to path: String) throws {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, fileMode)
        guard descriptor >= 0 else { throw POSIXFailure(call: "open", code: errno) }
        defer { close(descriptor) }
        try bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let written = write(descriptor, buffer.baseAddress! + offset, buffer.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    throw POSIXFailure(call: "write", code: errno)
                }
                offset += written
            }
        }
        try posix("fsync") { fsync(descriptor) }
    }

    private static func posix(_ call: String, _ body: () -> Int32) throws {
        guard body() == 0 else { throw POSIXFailure(call: call, code: errno) }
    }

    /// ``posix(_:_:)``, where a path that is gone (`ENOENT`) is no failure.
    private static func posixUnlessGone(_ call: String, _ body: () -> Int32) throws {
        guard body() == 0 || errno == ENOENT else { throw POSIXFailure(call: call, code: errno) }
    }
}

private struct POSIXFailure: Error, CustomStringConvertible {
    let call: String
    let code: Int32
    var description: String { "\(call): \(String(cString: strerror(code)))" }
}

/// Which names the image store accepts from callers and makes itself.
enum ImagePaths {
    /// A uid that is safe as one path component: 1 to 64 of `A-Z a-z 0-9 _ -` (lowercase UUIDs
    /// are a subset).
    static func isSafeUID(_ uid: String) -> Bool {
        (1...64).contains(uid.utf8.count)
            && uid.utf8.allSatisfy { byte in
                switch byte {
                case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                    UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "_"), UInt8(ascii: "-"):
                    true
                default:
                    false
                }
            }
    }

    /// A new temporary file name for an upload in progress: `.upload-<lowercase UUID>.tmp`.
    static func newTemporaryFileName() -> String {
        ".upload-\(UUID().uuidString.lowercased()).tmp"
    }

    /// Whether `name` is a temporary upload file (`.upload-*.tmp`); such a file is never a
    /// finished image.
    static func isTemporaryFileName(_ name: String) -> Bool {
        name.hasPrefix(".upload-") && name.hasSuffix(".tmp") && name.count >= ".upload-.tmp".count
    }

    /// A new file name: a lowercase UUID and the kind's extension.
    static func newFileName(kind: ImageKind) -> String {
        "\(UUID().uuidString.lowercased()).\(kind.fileExtension)"
    }

    /// The file name of an upload with an idempotency key: the key and the kind's extension.
    /// `key` must be a valid ``IdempotencyKey`` (no `.` or `/`, so it is one path component and
    /// never a temporary file's name).
    static func keyedFileName(key: String, kind: ImageKind) -> String {
        "\(key).\(kind.fileExtension)"
    }

    /// Whether `name` is an image's file name as ``newFileName(kind:)`` or
    /// ``keyedFileName(key:kind:)`` make them (not a thumbnail's).
    static func isImageFileName(_ name: String) -> Bool { StoredImagePath.isImageFileName(name) }

    /// The file name in `path` when it is exactly `<uid>/<file>` with an image name the store makes.
    static func fileName(in path: String, uid: String) -> String? { StoredImagePath.imageFileName(in: path, uid: uid) }
}
