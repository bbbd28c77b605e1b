import Dispatch
import Foundation
import Messaging
import OnboardingAPI

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The images on disk: `<root>/<uid>/<lowercase UUID>.<extension>`.
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
    /// slow write or fsync blocks only other image I/O, never the process's tasks.
    private let queue: DispatchQueue

    init(root: String) {
        self.root = root
        self.queue = DispatchQueue(label: "image-upload.storage", qos: .utility)
    }

    /// Creates the images root if it does not exist, and clears what a crash left behind:
    /// temporary upload files (`.upload-*.tmp`, never valid images) in each person's folder, and
    /// person folders that are then empty.
    ///
    /// - Returns: how many temporary upload files were removed.
    func prepare() async throws(ServiceError) -> Int {
        let root = self.root
        return try await io("preparing the images folder") {
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
            var removed = 0
            for uid in try FileManager.default.contentsOfDirectory(atPath: root) where ImagePaths.isSafeUID(uid) {
                let folder = "\(root)/\(uid)"
                guard Self.isDirectory(folder) else { continue }
                for name in try FileManager.default.contentsOfDirectory(atPath: folder)
                where ImagePaths.isTemporaryFileName(name) && Self.isRegularFile("\(folder)/\(name)") {
                    try Self.posix("unlink") { unlink("\(folder)/\(name)") }
                    removed += 1
                }
                try Self.removeFolderIfEmpty(folder)
            }
            return removed
        }
    }

    /// Stores `bytes` under a new name in `uid`'s folder.
    ///
    /// The bytes go to a temporary file in the same folder, are flushed to disk, and only then
    /// renamed to their final name, so a crash never leaves a partial image under that name.
    ///
    /// - Returns: the image's path relative to the root, `<uid>/<file>`.
    func store(_ bytes: Data, kind: ImageKind, uid: String) async throws(ServiceError) -> String {
        let folder = "\(root)/\(uid)"
        let file = ImagePaths.newFileName(kind: kind)
        let temporary = "\(folder)/\(ImagePaths.newTemporaryFileName())"
        try await io("storing the image") {
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            do {
                try Self.writeAndSync(bytes, to: temporary)
                try Self.posix("rename") { rename(temporary, "\(folder)/\(file)") }
            } catch {
                unlink(temporary)
                throw error
            }
        }
        return "\(uid)/\(file)"
    }

    /// Deletes one image of `uid`, and `uid`'s folder when that was the last thing in it.
    ///
    /// - Returns: `false` when there was no such image.
    func delete(uid: String, file: String) async throws(ServiceError) -> Bool {
        let folder = "\(root)/\(uid)"
        return try await io("deleting the image") {
            guard unlink("\(folder)/\(file)") == 0 else {
                if errno == ENOENT { return false }
                throw POSIXFailure(call: "unlink", code: errno)
            }
            // The image is gone whatever happens next; a folder that cannot be removed is
            // left for the next start-up's sweep rather than reported as a failed delete.
            try? Self.removeFolderIfEmpty(folder)
            return true
        }
    }

    /// Deletes `uid`'s folder and everything in it.
    ///
    /// - Returns: how many images it held (0 when there was no folder).
    func deleteAll(uid: String) async throws(ServiceError) -> Int {
        let folder = "\(root)/\(uid)"
        return try await io("deleting the images") {
            let names: [String]
            do {
                names = try FileManager.default.contentsOfDirectory(atPath: folder)
            } catch let error as CocoaError where error.code == .fileReadNoSuchFile {
                return 0
            }
            try FileManager.default.removeItem(atPath: folder)
            return names.filter(ImagePaths.isImageFileName).count
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

    private static func isRegularFile(_ path: String) -> Bool { fileType(path) == S_IFREG }

    /// The type bits of `path` itself (a symbolic link is not followed), or `nil` when it is gone.
    private static func fileType(_ path: String) -> mode_t? {
        var status = stat()
        guard lstat(path, &status) == 0 else { return nil }
        return status.st_mode & S_IFMT
    }

    private static func writeAndSync(_ bytes: Data, to path: String) throws {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
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

    /// Whether `name` is one that ``newFileName(kind:)`` could have made.
    static func isImageFileName(_ name: String) -> Bool {
        guard let dot = name.lastIndex(of: ".") else { return false }
        let stem = String(name[..<dot])
        let fileExtension = String(name[name.index(after: dot)...])
        return stem.count == 36 && stem == stem.lowercased() && UUID(uuidString: stem) != nil
            && ImageKind.allCases.contains { $0.fileExtension == fileExtension }
    }

    /// The file name in `path` when it is exactly `<uid>/<file>` with a name the store makes.
    static func fileName(in path: String, uid: String) -> String? {
        let parts = path.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2, parts[0] == uid, isImageFileName(String(parts[1])) else { return nil }
        return String(parts[1])
    }
}
