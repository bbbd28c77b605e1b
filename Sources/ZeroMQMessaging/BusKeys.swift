import Foundation
import Messaging

/// The CURVE keys of one process's bus: its own key pair, the public key of each server it
/// connects to, and, for a process that serves, the clients it admits and who each is.
///
/// With keys, every TCP and IPC socket of the bus is encrypted: a server proves it holds the
/// secret key of the public key its clients expect (a port squatter cannot complete the
/// handshake), and a client is admitted only if its public key is one of ``clients`` (checked by
/// the bus's ZAP handler, which also tells each request who sent it).
public struct BusKeys: Sendable {
    /// Who this process is (`auth`, `orchestrator`, `gateway`, `tap`, …): the name of its key pair.
    public var identity: String
    public var own: CurveKeyPair
    /// The public key of the server at each endpoint this process may connect to.
    public var servers: [Endpoint: CurveKey]
    /// The public key of a server at an endpoint not in ``servers``; `nil` (the default) refuses
    /// to connect there. For tests whose servers bind fresh endpoints with one key pair.
    public var otherServers: CurveKey?
    /// Every client key this process's servers admit, with the identity it belongs to. Several
    /// keys may name one identity: the old and the new one while a key is being replaced.
    public var clients: [CurveKey: String]
    /// The keys directory ``clients`` were read from: the bus reads it again when it changes, so
    /// that a key added (a replacement) or removed takes effect without a restart. `nil`: never.
    public var directory: String?
    /// Whether the key named by its first argument may subscribe to this process's publisher at
    /// the endpoint given second; by default every known key may.
    public var mayFollow: @Sendable (_ caller: String, _ publisher: Endpoint) -> Bool = { _, _ in true }

    public init(
        identity: String, own: CurveKeyPair, servers: [Endpoint: CurveKey], otherServers: CurveKey? = nil,
        clients: [CurveKey: String]
    ) {
        self.identity = identity
        self.own = own
        self.servers = servers
        self.otherServers = otherServers
        self.clients = clients
    }

    /// The public key of the server at `endpoint`, if known.
    public func serverKey(for endpoint: Endpoint) -> CurveKey? {
        servers[endpoint] ?? otherServers
    }

    /// The identity a key file's name gives: the name before the first `+`. `orchestrator.key`
    /// and `orchestrator+2026-12.key` are both the orchestrator's (the second a replacement).
    public static func identity(ofKeyFile name: String) -> String? {
        guard name.hasSuffix(".key") else { return nil }
        let stem = name.dropLast(".key".count)
        let identity = stem.split(separator: "+", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? ""
        return identity.isEmpty ? nil : identity
    }

    /// Loads the keys of `identity` from `directory`: its secret file, the public key of each
    /// server named in `servers` (by its identity), and every public key in the directory as a
    /// client.
    ///
    /// - Parameter servers: the endpoints of each server this process connects to, by the
    ///   server's identity (`["auth": [authRPC, authEvents], …]`).
    /// - Throws: ``CurveKeyError`` naming the file that is missing, unreadable, too open or
    ///   malformed.
    public static func load(
        from directory: String, identity: String, servers: [String: [Endpoint]]
    ) throws(CurveKeyError) -> BusKeys {
        let own = try CurveKeyFile.readPair(CurveKeyFile.secretPath(identity, in: directory))
        var serverKeys: [Endpoint: CurveKey] = [:]
        for (server, endpoints) in servers {
            let key = server == identity ? own.publicKey : try CurveKeyFile.readPublic(CurveKeyFile.publicPath(server, in: directory))
            for endpoint in endpoints.flatMap(\.replicas) { serverKeys[endpoint] = key }
        }
        var keys = BusKeys(identity: identity, own: own, servers: serverKeys, clients: try clients(in: directory))
        keys.directory = directory
        return keys
    }

    /// Every public key file in `directory` (`NAME.key`, `NAME+LABEL.key`), by key.
    public static func clients(in directory: String) throws(CurveKeyError) -> [CurveKey: String] {
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: directory)
        } catch {
            throw .unreadable(path: directory, reason: "\(error.localizedDescription)")
        }
        var clients: [CurveKey: String] = [:]
        for name in names.sorted() {
            guard let client = Self.identity(ofKeyFile: name) else { continue }
            clients[try CurveKeyFile.readPublic("\(directory)/\(name)")] = client
        }
        return clients
    }
}
