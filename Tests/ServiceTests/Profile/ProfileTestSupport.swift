import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import ProfilePostgres
@testable import ProfileService
import ServiceRuntime
import Testing
import TestSupport

/// Every profile-service suite nests in here, so `swift test --filter ProfileService` runs them all.
@Suite("Profile service")
enum ProfileServiceTests {}

/// Accepts "token-<uid>" as a live session of <uid> and refuses every other token.
struct StubSessions: SessionVerifier {
    func uid(forSessionToken token: String) async throws -> String {
        guard token.hasPrefix("token-"), token.count > "token-".count else {
            throw ServiceError(.unauthenticated, "Unknown session.")
        }
        return String(token.dropFirst("token-".count))
    }
}

/// A temporary directory, removed after `body`.
func withTemporaryFolder<T>(_ body: (URL) async throws -> T) async throws -> T {
    let directory = FileManager.default.temporaryDirectory
        .appendingPathComponent("profile-tests-\(UUID().uuidString)", isDirectory: true)
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    return try await body(directory)
}

/// A store over `writer` (an in-memory database when `nil`) whose events go to a publisher
/// nobody listens to.
func makeStore(writer: (any DatabaseWriter)? = nil, afterCommit: ProfileStore.CommitObserver? = nil) async throws -> ProfileStore {
    let writer = try writer ?? ProfileStore.openDatabase(path: nil)
    let publisher = try await InProcessBus().publisher(at: "inproc://profile-events")
    return ProfileStore(
        writer: writer, outbox: Outbox(source: ServiceName.profile, publisher: publisher), logger: quietLogger,
        afterCommit: afterCommit)
}

/// The events recorded in the outbox, oldest first, as (sequence, type, uid): read through
/// `events.after`, so the same on every store.
func outboxRows(_ store: any ProfileStorage) async throws -> [OutboxRow] {
    try await store.events(after: 0, limit: nil).events.map { event in
        let header = try JSONDecoder().decode(OutboxHeader.self, from: Data(event.envelope.utf8))
        return OutboxRow(sequence: Int(event.sequence), type: header.type, uid: header.uid)
    }
}

/// The fields of an envelope's header that ``outboxRows(_:)`` shows.
private struct OutboxHeader: Decodable {
    var type: String
    var uid: String?
}

/// Runs `body` with profile's database of `kind`: SQLite in memory (or in a file of a fresh
/// folder), or a fresh PostgreSQL schema.
func withProfileDatabase<Result: Sendable>(
    _ kind: StoreKind, inMemory: Bool = true, _ body: (any ProfileDatabase) async throws -> Result
) async throws -> Result {
    switch kind {
    case .sqlite where inMemory:
        return try await body(SQLiteProfileDatabase(path: nil))
    case .sqlite:
        return try await withTemporaryDirectory { directory in try await body(SQLiteProfileDatabase(path: "\(directory)/profile.sqlite")) }
    case .postgres:
        // Tests run many stores at once on a loaded machine: a small pool each, and time.
        return try await TestPostgres.withSchema { location in
            try await body(ProfilePostgresDatabase(location: location, maxConnections: 4, timeout: .seconds(15)))
        }
    }
}

/// Opens a store of `database` (its own cache and a publisher nobody listens to), runs `body`
/// with it, and closes it.
func withProfileStore<Result: Sendable>(
    of database: any ProfileDatabase, cache: ProfileCache = ProfileCache(capacity: 100),
    _ body: @Sendable (any ProfileStorage) async throws -> Result
) async throws -> Result {
    let publisher = try await InProcessBus().publisher(at: "inproc://profile-events")
    let context = ProfileStorageContext(publisher: publisher, cache: cache, eventRetention: Outbox.Retention(), logger: quietLogger)
    return try await database.withStorage(context, body)
}

/// Runs `body` with a fresh store of `kind`.
func withProfileStore<Result: Sendable>(
    _ kind: StoreKind, _ body: @Sendable (any ProfileStorage) async throws -> Result
) async throws -> Result {
    try await withProfileDatabase(kind) { database in try await withProfileStore(of: database, body) }
}

struct OutboxRow: Equatable, CustomStringConvertible {
    var sequence: Int
    var type: String
    var uid: String?
    var description: String { "#\(sequence) \(type) \(uid ?? "-")" }
}

/// The error `body` throws, as a `ServiceError`, or `nil` (and a recorded issue) when it throws
/// none or another kind.
func refusal(_ body: () async throws -> Void, sourceLocation: SourceLocation = #_sourceLocation) async -> ServiceError? {
    do {
        try await body()
        Issue.record("Expected a ServiceError, but the call succeeded.", sourceLocation: sourceLocation)
    } catch let error as ServiceError {
        return error
    } catch {
        Issue.record("Expected a ServiceError, got \(error).", sourceLocation: sourceLocation)
    }
    return nil
}

/// A running ``ProfileService`` on an ``InProcessBus``, and ways to talk to it.
struct RunningProfileService {
    let bus: InProcessBus
    let configuration: ProfileService.Configuration
    var rpc: Endpoint { configuration.rpc }

    /// Starts the service, waits until it answers `health`, runs `body`, then stops it.
    static func with<T>(
        databasePath: String? = nil, database: (any ProfileDatabase)? = nil,
        cacheCapacity: Int = ProfileService.Configuration.defaultCacheCapacity,
        _ body: (RunningProfileService) async throws -> T
    ) async throws -> T {
        let bus = InProcessBus(source: "test-bus")
        let configuration = ProfileService.Configuration(
            rpc: "inproc://profile", events: "inproc://profile-events", authRPC: "inproc://auth",
            databasePath: databasePath, cacheCapacity: cacheCapacity, database: database)
        let service = try ProfileService(
            configuration: configuration, bus: bus, logger: quietLogger, sessions: StubSessions())
        let task = Task { try await service.run() }
        defer { task.cancel() }
        try await bus.waitUntilAnswering(configuration.rpc, source: "test")
        let result = try await body(RunningProfileService(bus: bus, configuration: configuration))
        task.cancel()
        try await task.value
        return result
    }

    /// ``with(databasePath:database:cacheCapacity:_:)`` on a fresh store of `kind`.
    static func with<T: Sendable>(_ kind: StoreKind, _ body: (RunningProfileService) async throws -> T) async throws -> T {
        try await withProfileDatabase(kind) { database in try await with(database: database, body) }
    }

    func call<Request: APIRequest>(
        _ request: Request, uid: String? = nil, token: String? = nil
    ) async throws -> Request.Response {
        try await bus.call(request, to: rpc, source: "test", uid: uid, sessionToken: token)
    }

    /// Sends raw bytes and returns the error the reply carries, if any.
    func sendRaw(_ body: Data, attachment: Data? = nil) async throws -> ServiceError? {
        try await bus.request(OutgoingMessage(body: body, attachment: attachment), to: rpc, timeout: .seconds(3))
            .serviceError
    }

    /// Whether the service still answers `health`.
    func isHealthy() async -> Bool {
        (try? await call(HealthCheck()).status) == "ok"
    }

    /// Subscribes to every profile event; subscribe before causing the events.
    func events() async throws -> EventReader {
        EventReader(stream: try await bus.subscribe(to: [configuration.events], topics: ["profile."], limits: MessageLimits()))
    }
}

/// Reads events one at a time, failing instead of hanging when one does not come.
struct EventReader {
    let stream: AsyncStream<Message>

    func next(within limit: Duration = .seconds(5)) async throws -> Message {
        let stream = self.stream
        return try await withThrowingTaskGroup(of: Message?.self) { group in
            group.addTask {
                var iterator = stream.makeAsyncIterator()
                return await iterator.next()
            }
            group.addTask {
                try await Task.sleep(for: limit)
                return nil
            }
            defer { group.cancelAll() }
            guard let message = try await group.next() ?? nil else {
                throw ServiceError(.timeout, "No event within \(limit).")
            }
            return message
        }
    }
}
