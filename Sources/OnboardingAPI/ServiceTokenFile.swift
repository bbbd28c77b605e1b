import Foundation
import Messaging

/// The file `<data-dir>/service.token`: the secret every service started on one data directory
/// shares, so that a local deployment needs no set-up.
public struct ServiceTokenFile: Sendable {
    public let path: String

    public init(directory: String) {
        self.path = URL(fileURLWithPath: directory).appendingPathComponent("service.token").path
    }

    /// Reads the token, or creates it when there is none. Safe when several services start at
    /// once: exactly one creates the file, and the others read what it wrote.
    public func readOrCreate() throws -> String {
        if let token = read() { return token }
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent().path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var bytes = [UInt8](repeating: 0, count: 32)
        var generator = SystemRandomNumberGenerator()
        for index in bytes.indices { bytes[index] = generator.next() }
        let token = bytes.map { String(format: "%02x", $0) }.joined()
        let temporary = path + ".\(UUID().uuidString).tmp"
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        guard descriptor >= 0 else {
            throw ServiceError(.storeUnavailable, "Could not write \(temporary); check that the data directory is writable.")
        }
        let written = Array(token.utf8).withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        let synced = fsync(descriptor) == 0
        close(descriptor)
        guard written == token.utf8.count, synced else {
            unlink(temporary)
            throw ServiceError(.storeUnavailable, "Could not write \(temporary); check that the data directory is writable.")
        }
        // link(2) fails if the token file appeared meanwhile: then the other process's wins.
        let linked = link(temporary, path) == 0
        unlink(temporary)
        if linked { return token }
        guard let token = read() else {
            throw ServiceError(.storeUnavailable, "Could not create or read \(path).")
        }
        return token
    }

    /// The token, or `nil` when the file does not exist (yet) or is empty.
    public func read() -> String? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        let token = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        return token.isEmpty ? nil : token
    }
}
