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
/// Threading: every method does blocking file I/O on the calling thread. Images are at most a
/// few MiB, so this runs inline on the cooperative pool; all file access goes through
/// `io(_:_:)` so that it can move to a dedicated thread in one place.
struct ImageStorage: Sendable {
    let root: String

    /// Creates the images root if it does not exist.
    func prepare() throws(ServiceError) {
        try io("creating the images folder") {
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        }
    }

    /// Stores `bytes` under a new name in `uid`'s folder.
    ///
    /// The bytes go to a temporary file in the same folder, are flushed to disk, and only then
    /// renamed to their final name, so a crash never leaves a partial image under that name.
    ///
    /// - Returns: the image's path relative to the root, `<uid>/<file>`.
    func store(_ bytes: Data, kind: ImageKind, uid: String) throws(ServiceError) -> String {
        let folder = "\(root)/\(uid)"
        let file = ImagePaths.newFileName(kind: kind)
        let temporary = "\(folder)/.upload-\(UUID().uuidString.lowercased()).tmp"
        try io("storing the image") {
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

    /// Deletes one image of `uid`.
    ///
    /// - Returns: `false` when there was no such image.
    func delete(uid: String, file: String) throws(ServiceError) -> Bool {
        try io("deleting the image") {
            guard unlink("\(root)/\(uid)/\(file)") == 0 else {
                if errno == ENOENT { return false }
                throw POSIXFailure(call: "unlink", code: errno)
            }
            return true
        }
    }

    /// Deletes `uid`'s folder and everything in it.
    ///
    /// - Returns: how many images it held (0 when there was no folder).
    func deleteAll(uid: String) throws(ServiceError) -> Int {
        let folder = "\(root)/\(uid)"
        return try io("deleting the images") {
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

    /// The one place file I/O happens; turns any failure into `storeUnavailable`.
    private func io<T>(_ what: String, _ body: () throws -> T) throws(ServiceError) -> T {
        do {
            return try body()
        } catch {
            throw ServiceError(.storeUnavailable, "The image store failed while \(what) (\(error)). Try again.")
        }
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
