import Foundation
import Synchronization
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A TCP relay on loopback that forwards every byte between its clients and one server, and
/// keeps a copy of what passed: what someone on the path between two services would capture.
///
/// Threading: its own threads, blocking on sockets (never a Swift concurrency thread).
final class TCPRelay: Sendable {
    let port: Int
    private let listener: Int32
    private let captured = Mutex(Data())
    private let target: Int

    /// Listens on a free loopback port and relays each connection to `targetPort`.
    init(to targetPort: Int) throws {
        target = targetPort
        guard let (listener, port) = loopbackListener() else { throw POSIXError(.EADDRINUSE) }
        self.listener = listener
        self.port = port
        let relay = self
        Thread { relay.accepting() }.start()
    }

    /// Everything that passed, both ways.
    var bytes: Data { captured.withLock { $0 } }

    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }

    private func accepting() {
        while true {
            let client = accept(listener, nil, nil)
            guard client >= 0 else { return }
            let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = UInt16(target).bigEndian
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard connected == 0 else {
                close(client)
                close(server)
                continue
            }
            let relay = self
            Thread { relay.pump(from: client, to: server) }.start()
            Thread { relay.pump(from: server, to: client) }.start()
        }
    }

    private func pump(from source: Int32, to destination: Int32) {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(source, $0.baseAddress, $0.count) }
            guard count > 0 else { break }
            captured.withLock { $0.append(contentsOf: buffer[..<count]) }
            var sent = 0
            while sent < count {
                let written = buffer[sent..<count].withUnsafeBytes { write(destination, $0.baseAddress, $0.count) }
                guard written > 0 else { break }
                sent += written
            }
        }
        shutdown(destination, Int32(SHUT_WR))
    }
}
