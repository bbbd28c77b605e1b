import Foundation
import Logging
import Messaging
import Synchronization
import Testing
import ZeroMQMessaging

/// CURVE keys, their files, and what a bus with keys refuses, over real sockets.
@Suite("CURVE: keys and refusals", .timeLimit(.minutes(1)))
struct CurveTests {
    // MARK: Key files

    func withKeysDirectory(_ body: (String) throws -> Void) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("curve-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try body(directory)
    }

    func mode(_ path: String) throws -> Int {
        (try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int) ?? -1
    }

    @Test("a key pair written to files reads back; the secret file is 0600, the public one readable")
    func keyFilesRoundTrip() throws {
        try withKeysDirectory { directory in
            let pair = try CurveKeyPair.generate()
            try CurveKeyFile.write(pair, name: "auth", in: directory)
            let secret = CurveKeyFile.secretPath("auth", in: directory)
            let shared = CurveKeyFile.publicPath("auth", in: directory)
            #expect(try CurveKeyFile.readPair(secret) == pair)
            #expect(try CurveKeyFile.readPublic(shared) == pair.publicKey)
            #expect(try mode(secret) == 0o600)
            #expect(try mode(shared) == 0o644)
            let publicText = try String(contentsOfFile: shared, encoding: .utf8)
            #expect(!publicText.contains(pair.secretKey.z85), "the public file holds no secret")
            #expect(throws: CurveKeyError.unwritable(path: secret, reason: "File exists")) {
                try CurveKeyFile.write(pair, name: "auth", in: directory)
            }
        }
    }

    @Test("a secret key file that others may read, a missing one, and a malformed one are refused by name")
    func keyFileRefusals() throws {
        try withKeysDirectory { directory in
            try CurveKeyFile.write(try CurveKeyPair.generate(), name: "profile", in: directory)
            let secret = CurveKeyFile.secretPath("profile", in: directory)
            chmod(secret, 0o640)
            #expect(throws: CurveKeyError.tooOpen(path: secret, mode: 0o100640)) { try CurveKeyFile.readPair(secret) }
            let missing = CurveKeyFile.secretPath("nobody", in: directory)
            #expect(throws: CurveKeyError.missing(path: missing)) { try CurveKeyFile.readPair(missing) }
            let broken = "\(directory)/broken.key"
            try "curve\n    public-key = \"not a key\"\n".write(toFile: broken, atomically: true, encoding: .utf8)
            #expect(throws: CurveKeyError.badKey(path: broken, which: "public-key")) { try CurveKeyFile.readPublic(broken) }
            #expect(throws: CurveKeyError.malformed(3)) { try CurveKey(z85: "abc") }
        }
    }

    @Test("a keys directory gives each public key file's identity; a replacement key names the same identity")
    func loadDirectory() throws {
        try withKeysDirectory { directory in
            for name in ["auth", "orchestrator", "orchestrator+next", "tap"] {
                try CurveKeyFile.write(try CurveKeyPair.generate(), name: name, in: directory)
            }
            let auth = Endpoint("tcp://127.0.0.1:7101")
            let keys = try BusKeys.load(from: directory, identity: "orchestrator", servers: ["auth": [auth]])
            #expect(keys.identity == "orchestrator")
            #expect(keys.serverKey(for: auth) == (try CurveKeyFile.readPublic(CurveKeyFile.publicPath("auth", in: directory))))
            #expect(keys.serverKey(for: Endpoint("tcp://127.0.0.1:9999")) == nil, "an unknown server is not trusted")
            #expect(keys.clients.values.sorted() == ["auth", "orchestrator", "orchestrator", "tap"])
            #expect(BusKeys.identity(ofKeyFile: "orchestrator+2026-12.key") == "orchestrator")
            #expect(BusKeys.identity(ofKeyFile: "auth.key_secret") == nil)
        }
    }

    // MARK: Over real sockets

    static let quiet: Logger = {
        var logger = Logger(label: "test.curve")
        logger.logLevel = .critical
        return logger
    }()

    func bus(_ identity: String, own: CurveKeyPair, server: CurveKeyPair, admitting clients: [CurveKey: String] = [:])
        -> ZeroMQBus
    {
        var configuration = ZeroMQBus.Configuration()
        configuration.connectGrace = .milliseconds(500)
        configuration.keys = BusKeys(
            identity: identity, own: own, servers: [:], otherServers: server.publicKey, clients: clients)
        return ZeroMQBus(source: identity, logger: Self.quiet, configuration: configuration)
    }

    @Test("a client whose key the server does not know gets noResponder saying so, and the server counts the refusal")
    func unknownClient() async throws {
        let serverKeys = try CurveKeyPair.generate(), known = try CurveKeyPair.generate(), stranger = try CurveKeyPair.generate()
        let server = bus("server", own: serverKeys, server: serverKeys, admitting: [known.publicKey: "known"])
        let outsider = bus("outsider", own: stranger, server: serverKeys)
        let (endpoint, requests) = try await bindRetrying { try await server.serve(at: $0, limits: MessageLimits()) }
        let received = Mutex(0)
        let serving = Task { for await _ in requests { received.withLock { $0 += 1 } } }
        let error = await serviceError { try await outsider.request(try echoRequest("let me in"), to: endpoint, timeout: .seconds(5)) }
        #expect(error?.code == .noResponder)
        #expect(error?.message.contains("the server refused this process's key") == true, "and why: \(error?.message ?? "")")
        await eventually { server.statistics.refusedHandshakes >= 1 }
        #expect(received.withLock { $0 } == 0)
        serving.cancel()
        await outsider.shutdown()
        await server.shutdown()
    }

    @Test("a subscriber whose key the publisher does not know receives nothing while a known one receives events")
    func unknownSubscriber() async throws {
        let serverKeys = try CurveKeyPair.generate(), known = try CurveKeyPair.generate(), stranger = try CurveKeyPair.generate()
        let server = bus("server", own: serverKeys, server: serverKeys, admitting: [known.publicKey: "known"])
        let insider = bus("insider", own: known, server: serverKeys)
        let outsider = bus("outsider", own: stranger, server: serverKeys)
        let (endpoint, publisher) = try await bindRetrying { try await server.publisher(at: $0) }
        let inside = try await insider.subscribe(to: [endpoint], topics: [""], limits: MessageLimits())
        let outside = try await outsider.subscribe(to: [endpoint], topics: [""], limits: MessageLimits())
        let overheard = Mutex(0)
        let listening = Task { for await _ in outside { overheard.withLock { $0 += 1 } } }
        // Publish until the known subscriber has five events (it joins a moment after subscribing).
        let publishing = Task {
            while !Task.isCancelled {
                try? publisher.publish(try event("route.u1", text: "a person's intent"))
                try? await Task.sleep(for: .milliseconds(5))
            }
        }
        var heard = 0
        for await _ in inside {
            heard += 1
            if heard == 5 { break }
        }
        publishing.cancel()
        await eventually { server.statistics.refusedHandshakes >= 1 }
        #expect(overheard.withLock { $0 } == 0)
        listening.cancel()
        for bus in [insider, outsider, server] { await bus.shutdown() }
    }

    @Test("a squatter on a server's port, without that server's secret key, receives nothing from a client")
    func squatter() async throws {
        let realServer = try CurveKeyPair.generate(), squatterKeys = try CurveKeyPair.generate(), client = try CurveKeyPair.generate()
        // The squatter admits everyone, and has a key pair of its own, not the real server's.
        let squatter = bus("squatter", own: squatterKeys, server: squatterKeys, admitting: [client.publicKey: "client"])
        let caller = bus("client", own: client, server: realServer)
        let (endpoint, requests) = try await bindRetrying { try await squatter.serve(at: $0, limits: MessageLimits()) }
        let received = Mutex(0)
        let serving = Task { for await _ in requests { received.withLock { $0 += 1 } } }
        let error = await serviceError {
            try await caller.request(try echoRequest("the service token is hunter2"), to: endpoint, timeout: .seconds(5))
        }
        #expect(error?.code == .noResponder, "the caller is told, not left hanging")
        #expect(error?.message.contains("the CURVE handshake with it failed") == true, "and why: \(error?.message ?? "")")
        #expect(caller.statistics.failedHandshakes >= 1, "the caller counts the failed handshake")
        #expect(received.withLock { $0 } == 0, "the squatter got no request")
        serving.cancel()
        await caller.shutdown()
        await squatter.shutdown()
    }

    @Test("a key added to the server's keys directory is admitted without a restart; one removed is refused")
    func rollover() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("curve-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try CurveKeyFile.write(try CurveKeyPair.generate(), name: "server", in: directory)
        var configuration = ZeroMQBus.Configuration()
        configuration.keys = try BusKeys.load(from: directory, identity: "server", servers: [:])
        let server = ZeroMQBus(source: "server", logger: Self.quiet, configuration: configuration)
        let serverKeys = try CurveKeyFile.readPair(CurveKeyFile.secretPath("server", in: directory))
        let callers = Mutex<[String?]>([])
        let (endpoint, registration) = try await bindRetrying { endpoint in
            try await server.serve(at: endpoint, limits: MessageLimits(), onLoop: { batch in
                for raw in batch {
                    callers.withLock { $0.append(raw.caller) }
                    raw.reply(OutgoingMessage(body: raw.body))
                }
            })
        }
        // The new key, not yet in the directory: refused.
        let next = try CurveKeyPair.generate()
        let early = bus("client+next", own: next, server: serverKeys)
        #expect(await serviceError { try await early.request(try echoRequest("too soon"), to: endpoint, timeout: .seconds(2)) }?.code == .noResponder)
        await early.shutdown()
        // Its public key copied into the directory: admitted by the running server.
        let publicOnly = "\(directory)/staging"
        try FileManager.default.createDirectory(atPath: publicOnly, withIntermediateDirectories: true)
        try CurveKeyFile.write(next, name: "client+next", in: publicOnly)
        try FileManager.default.moveItem(
            atPath: CurveKeyFile.publicPath("client+next", in: publicOnly), toPath: CurveKeyFile.publicPath("client+next", in: directory))
        let late = bus("client+next", own: next, server: serverKeys)
        let reply = try await late.request(try echoRequest("now"), to: endpoint, timeout: .seconds(5))
        #expect(try reply.payload(as: Echo.self).text == "now")
        #expect(callers.withLock { $0 } == ["client"], "the request names its key's identity: the file's name before '+'")
        await late.shutdown()
        // Removed again: the next connection is refused.
        try FileManager.default.removeItem(atPath: CurveKeyFile.publicPath("client+next", in: directory))
        let gone = bus("client+next", own: next, server: serverKeys)
        #expect(await serviceError { try await gone.request(try echoRequest("again"), to: endpoint, timeout: .seconds(2)) }?.code == .noResponder)
        await gone.shutdown()
        registration.close()
        await server.shutdown()
    }

    @Test("bytes captured between a client and a server over CURVE hold no JSON, token or payload in clear; without CURVE they do")
    func capturedBytesAreEncrypted() async throws {
        let serverKeys = try CurveKeyPair.generate(), clientKeys = try CurveKeyPair.generate()
        for curve in [true, false] {
            let server = curve ? bus("server", own: serverKeys, server: serverKeys, admitting: [clientKeys.publicKey: "client"])
                : ZeroMQBus(source: "server", logger: Self.quiet)
            let (endpoint, registration) = try await bindRetrying { endpoint in
                try await server.serve(at: endpoint, limits: MessageLimits(), onLoop: { batch in
                    for raw in batch { raw.reply(OutgoingMessage(body: raw.body)) }
                })
            }
            let port = Int(endpoint.rawValue.split(separator: ":").last!)!
            let relay = try TCPRelay(to: port)
            let client = curve ? bus("client", own: clientKeys, server: serverKeys) : ZeroMQBus(source: "client", logger: Self.quiet)
            let secret = "the-service-token-\(UUID().uuidString)"
            let reply = try await client.request(
                try echoRequest(secret), to: Endpoint("tcp://127.0.0.1:\(relay.port)"), timeout: .seconds(5))
            #expect(try reply.payload(as: Echo.self).text == secret, "the request went through the relay")
            let captured = relay.bytes
            let clear = captured.range(of: Data(secret.utf8)) != nil || captured.range(of: Data("\"type\":\"test.echo\"".utf8)) != nil
            #expect(clear == !curve, curve ? "CURVE: nothing in clear" : "plain: the relay sees the request (the test can see)")
            relay.stop()
            registration.close()
            await client.shutdown()
            await server.shutdown()
        }
    }

    @Test("a bus refuses to connect to a server whose public key it does not have")
    func unknownServer() async throws {
        var configuration = ZeroMQBus.Configuration()
        configuration.keys = BusKeys(identity: "client", own: try CurveKeyPair.generate(), servers: [:], clients: [:])
        let client = ZeroMQBus(source: "client", logger: Self.quiet, configuration: configuration)
        let error = await serviceError { try await client.request(try echoRequest("?"), to: Endpoints.fresh(), timeout: .seconds(2)) }
        #expect(error?.code == .invalidEndpoint)
        #expect(error?.message.contains("No CURVE public key") == true)
        await client.shutdown()
    }
}
