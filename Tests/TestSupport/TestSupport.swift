import Foundation
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif


/// Keeps what a logger was told, for tests that check a log line.
public final class LogCapture: Sendable {
    public struct Entry: Sendable {
        public var level: Logger.Level
        public var message: String
        public var metadata: [String: String]
    }

    private let storage = Mutex<[Entry]>([])

    public init() {}

    public var entries: [Entry] { storage.withLock { $0 } }

    /// Whether a line says `text`.
    public func contains(_ text: String) -> Bool {
        entries.contains { $0.message.contains(text) }
    }

    public var logger: Logger {
        Logger(label: "test") { _ in Handler(capture: self) }
    }

    fileprivate func append(_ entry: Entry) { storage.withLock { $0.append(entry) } }

    private struct Handler: LogHandler {
        let capture: LogCapture
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            let merged = metadata.merging(event.metadata ?? [:]) { $1 }
            capture.append(Entry(level: event.level, message: "\(event.message)", metadata: merged.mapValues { "\($0)" }))
        }
    }
}

/// A TCP socket listening on a free loopback port (the kernel picks it).
///
/// - Returns: the socket and its port, or `nil` when it could not listen.
public func loopbackListener() -> (fd: Int32, port: Int)? {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let listening = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            bind(fd, $0, length) == 0 && listen(fd, 16) == 0 && getsockname(fd, $0, &length) == 0
        }
    }
    guard listening else {
        close(fd)
        return nil
    }
    return (fd, Int(UInt16(bigEndian: address.sin_port)))
}
