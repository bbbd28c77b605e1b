import AsyncHTTPClient
import AuthService
import Foundation
import ImageUploadService
import Logging
import Messaging
import NIOCore
import NIOHTTP1
import NIOPosix
import OnboardingAPI
import OnboardingClient
import OnboardingGateway
import OnboardingOrchestrator
import ProfileService
import ServiceLifecycle
import ServiceRuntime
import Synchronization
import Testing

/// The four services in this process on one ``InProcessBus`` (data in a temporary folder), and
/// gateways in front of them on loopback ports of their own.
///
/// (A copy of SystemTests' `InProcessSystem` for the gateway's tests until it is a shared helper.)
struct GatewaySystem: Sendable {
    let bus = InProcessBus(source: "gateway-test-bus")
    let directory: URL
    /// The time auth stamps and judges sessions with (a test may move it).
    var authClock: @Sendable () -> Date = { Date() }

    static let serviceToken = "gateway-test-service-token"
    static let authRPC: Endpoint = "inproc://auth"
    static let authEvents: Endpoint = "inproc://auth-events"
    static let profileRPC: Endpoint = "inproc://profile"
    static let profileEvents: Endpoint = "inproc://profile-events"
    static let imageRPC: Endpoint = "inproc://image"
    static let orchestratorRPC: Endpoint = "inproc://orchestrator"
    static let routes: Endpoint = "inproc://routes"

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("gateway-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    static var logger: Logger {
        var logger = Logger(label: "gateway-test")
        logger.logLevel = .warning
        return logger
    }

    /// The gateway's configuration for this system; tests change what they need.
    func gatewayConfiguration() -> GatewayConfiguration {
        GatewayConfiguration(
            host: "127.0.0.1", port: 0, authRPC: Self.authRPC, profileRPC: Self.profileRPC,
            orchestratorRPC: Self.orchestratorRPC, routes: Self.routes, serviceToken: Self.serviceToken,
            callTimeout: .seconds(5), heartbeat: .seconds(1), signInLimit: .init(burst: 1000, perSecond: 1000),
            usernameCheckLimit: .init(burst: 1000, perSecond: 1000))
    }

    func orchestrator() throws -> OnboardingOrchestrator {
        try OnboardingOrchestrator(
            configuration: .init(
                rpc: Self.orchestratorRPC, routes: Self.routes, authRPC: Self.authRPC, authEvents: Self.authEvents,
                profileRPC: Self.profileRPC, profileEvents: Self.profileEvents, imageRPC: Self.imageRPC,
                databasePath: directory.appendingPathComponent("orchestrator.sqlite").path, serviceToken: Self.serviceToken),
            bus: bus, logger: Self.logger)
    }

    /// A client on the bus (another device), with `token` as its session when given.
    func client(token: String? = nil) -> OnboardingClient {
        OnboardingClient(
            bus: bus,
            configuration: .init(
                authRPC: Self.authRPC, profileRPC: Self.profileRPC, orchestratorRPC: Self.orchestratorRPC,
                routes: Self.routes, timeout: .seconds(5), name: "gateway-test-device"),
            session: token.map { .init(uid: "", sessionToken: $0, provider: .kakao) })
    }

    /// Runs the services and one gateway while `body` runs, then stops them.
    func run(
        configure: @Sendable (inout GatewayConfiguration) -> Void = { _ in },
        _ body: @Sendable (GatewaySystem, RunningGateway) async throws -> Void
    ) async throws {
        try await runServices(orchestrator: true) { system in
            var configuration = system.gatewayConfiguration()
            configure(&configuration)
            let gateway = try await RunningGateway.start(configuration, bus: system.bus)
            do {
                try await body(system, gateway)
            } catch {
                await gateway.stop()
                throw error
            }
            await gateway.stop()
        }
    }

    /// Runs auth, profile, image-upload and (unless told not to) the orchestrator while `body` runs.
    func runServices(orchestrator runOrchestrator: Bool, _ body: @Sendable (GatewaySystem) async throws -> Void) async throws {
        let logger = Self.logger
        var services: [any Service] = [
            try AuthService(
                configuration: .init(
                    rpc: Self.authRPC, events: Self.authEvents,
                    databasePath: directory.appendingPathComponent("auth.sqlite").path, devMode: true,
                    serviceToken: Self.serviceToken, clock: authClock),
                bus: bus, logger: logger),
            try ProfileService(
                configuration: .init(
                    rpc: Self.profileRPC, events: Self.profileEvents, authRPC: Self.authRPC,
                    databasePath: directory.appendingPathComponent("profile.sqlite").path, serviceToken: Self.serviceToken),
                bus: bus, logger: logger),
            try ImageUploadService(
                configuration: .init(rpc: Self.imageRPC, directory: directory.appendingPathComponent("images").path,
                    serviceToken: Self.serviceToken),
                bus: bus, logger: logger),
        ]
        if runOrchestrator { services.append(try orchestrator()) }
        let group = ServiceGroup(services: services, logger: logger)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            var endpoints = [Self.authRPC, Self.profileRPC, Self.imageRPC]
            if runOrchestrator { endpoints.append(Self.orchestratorRPC) }
            for endpoint in endpoints {
                try await bus.waitUntilAnswering(endpoint, source: "test")
            }
            do {
                try await body(self)
            } catch {
                await group.triggerGracefulShutdown()
                try? await tasks.waitForAll()
                throw error
            }
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
        }
        try? FileManager.default.removeItem(at: directory)
    }
}

/// A gateway running in a task of its own, on a loopback port.
final class RunningGateway: Sendable {
    let port: Int
    let gateway: OnboardingGateway
    private let group: ServiceGroup
    private let task: Task<Void, any Error>

    private init(port: Int, gateway: OnboardingGateway, group: ServiceGroup, task: Task<Void, any Error>) {
        self.port = port
        self.gateway = gateway
        self.group = group
        self.task = task
    }

    var base: String { "http://127.0.0.1:\(port)" }

    /// Starts a gateway and waits until it listens and follows the orchestrator.
    static func start(_ configuration: GatewayConfiguration, bus: any MessageBus) async throws -> RunningGateway {
        let (ports, portSink) = AsyncStream.makeStream(of: Int.self)
        let gateway = OnboardingGateway(
            configuration: configuration, bus: bus, logger: GatewaySystem.logger,
            onServerRunning: { port in portSink.yield(port) })
        let group = ServiceGroup(services: [gateway], logger: GatewaySystem.logger)
        let task = Task { try await group.run() }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next() else { throw ServiceError(.internalError, "the gateway did not start") }
        try await gateway.hub.waitUntilFollowing(timeout: .seconds(30))
        return RunningGateway(port: port, gateway: gateway, group: group, task: task)
    }

    /// Stops it gracefully: open streams end, then the server.
    func stop() async {
        await group.triggerGracefulShutdown()
        _ = try? await task.value
    }

    /// Stops it at once, as SIGKILL would: nothing is drained or said to the clients.
    func kill() async {
        task.cancel()
        _ = try? await task.value
    }
}

// MARK: HTTP

/// One HTTP exchange's result.
struct HTTPResult: Sendable {
    var status: Int
    var headers: HTTPHeaders
    var body: Data

    func decode<T: Decodable>(_ type: T.Type, sourceLocation: SourceLocation = #_sourceLocation) throws -> T {
        do {
            return try JSONDecoder().decode(type, from: body)
        } catch {
            Issue.record("\(status) body is not \(T.self): \(String(decoding: body, as: UTF8.self))", sourceLocation: sourceLocation)
            throw error
        }
    }

    var problem: Problem? {
        guard headers.first(name: "content-type") == Problem.mediaType else { return nil }
        return try? JSONDecoder().decode(Problem.self, from: body)
    }

    var text: String { String(decoding: body, as: UTF8.self) }
}

/// Sends requests to one gateway.
struct GatewayHTTP: Sendable {
    let base: String

    init(_ gateway: RunningGateway) { base = gateway.base }
    init(base: String) { self.base = base }

    func send(
        _ method: HTTPMethod, _ path: String, token: String? = nil, headers: [(String, String)] = [],
        body: Data? = nil, contentType: String? = nil
    ) async throws -> HTTPResult {
        var request = HTTPClientRequest(url: base + path)
        request.method = method
        if let token { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
        if let contentType { request.headers.add(name: "Content-Type", value: contentType) }
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        if let body { request.body = .bytes(ByteBuffer(bytes: body)) }
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(30))
        let collected = try await response.body.collect(upTo: 16 * 1024 * 1024)
        return HTTPResult(status: Int(response.status.code), headers: response.headers, body: Data(collected.readableBytesView))
    }

    func json(_ method: HTTPMethod, _ path: String, token: String? = nil, _ object: [String: Any], headers: [(String, String)] = []) async throws -> HTTPResult {
        try await send(
            method, path, token: token, headers: headers, body: try JSONSerialization.data(withJSONObject: object),
            contentType: "application/json")
    }

    /// Signs in (dev mode) and returns the reply.
    func signIn(_ subject: String, provider: String = "kakao", sourceLocation: SourceLocation = #_sourceLocation) async throws -> SignInResult {
        let result = try await json(.POST, "/v1/session", ["provider": provider, "subject": subject])
        #expect(result.status == 200, "sign-in: \(result.text)", sourceLocation: sourceLocation)
        return try result.decode(SignInResult.self)
    }

    /// `POST /v1/me/profile` as multipart/form-data.
    func setUp(
        token: String, username: String, image: Data? = nil, imageType: String = "image/png", key: String? = nil
    ) async throws -> HTTPResult {
        var form = MultipartForm()
        form.field("username", username)
        if let image { form.file("image", filename: "me.png", type: imageType, image) }
        return try await send(
            .POST, "/v1/me/profile", token: token, headers: key.map { [("Idempotency-Key", $0)] } ?? [], body: form.finished,
            contentType: form.contentType)
    }
}

/// A `multipart/form-data` body, built by hand as a browser or `curl -F` would.
struct MultipartForm {
    let boundary = "----gateway-test-\(UUID().uuidString)"
    private(set) var body = Data()

    var contentType: String { "multipart/form-data; boundary=\(boundary)" }

    mutating func field(_ name: String, _ value: String) {
        body.append(Data("--\(boundary)\r\nContent-Disposition: form-data; name=\"\(name)\"\r\n\r\n\(value)\r\n".utf8))
    }

    mutating func file(_ name: String, filename: String, type: String, _ bytes: Data) {
        body.append(Data("--\(boundary)\r\nContent-Disposition: form-data; name=\"\(name)\"; filename=\"\(filename)\"\r\nContent-Type: \(type)\r\n\r\n".utf8))
        body.append(bytes)
        body.append(Data("\r\n".utf8))
    }

    /// The body with its closing boundary.
    var finished: Data { body + Data("--\(boundary)--\r\n".utf8) }
}

/// A time a test moves by hand.
final class MovableTime: Sendable {
    private let value = Mutex(Date())
    var now: Date { value.withLock { $0 } }
    func advance(_ seconds: TimeInterval) { value.withLock { $0 = $0.addingTimeInterval(seconds) } }
}

extension InProcessBus {
    func waitUntilAnsweringOrchestrator() async throws {
        try await waitUntilAnswering(GatewaySystem.orchestratorRPC, source: "test")
    }
}

/// A plain TCP connection to a gateway: for requests an HTTP client library would not send as
/// they are (a path whose bytes are not UTF-8), and to see when the gateway closes it.
struct RawConnection {
    let channel: NIOAsyncChannel<ByteBuffer, ByteBuffer>

    static func open(port: Int) async throws -> RawConnection {
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connect(host: "127.0.0.1", port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
        return RawConnection(channel: channel)
    }

    /// Sends `request`, reads until the gateway closes the connection, and returns what it
    /// read and when it closed, counted from `since` (`nil`: not within `deadline`).
    func readUntilClosed(sending request: String? = nil, since: ContinuousClock.Instant, deadline: Duration)
        async throws -> (text: String, closedAfter: Duration?)
    {
        let received = try await withThrowingTaskGroup(of: (String, Duration?).self) { group in
            group.addTask {
                var text = ""
                try await channel.executeThenClose { inbound, outbound in
                    if let request { try await outbound.write(ByteBuffer(string: request)) }
                    for try await buffer in inbound { text += String(buffer: buffer) }
                }
                return (text, ContinuousClock.now - since)
            }
            group.addTask {
                try await Task.sleep(for: deadline)
                return ("", nil)
            }
            defer { group.cancelAll() }
            return try await group.next()!
        }
        return (received.0, received.1)
    }

    /// Sends `GET path` (as it is: no encoding is checked or changed) on a connection of its own
    /// and returns the status and the body of the answer.
    static func get(_ path: String, port: Int) async throws -> (status: Int, body: Data) {
        let connection = try await open(port: port)
        let text = try await connection.readUntilClosed(
            sending: "GET \(path) HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n", since: .now, deadline: .seconds(30)
        ).text
        let statusLine = text.prefix { $0 != "\r" }.split(separator: " ")
        let status = try #require(statusLine.count > 1 ? Int(statusLine[1]) : nil, "no status line in \(text.prefix(200))")
        let body = text.range(of: "\r\n\r\n").map { String(text[$0.upperBound...]) } ?? ""
        return (status, Data(body.utf8))
    }
}
