import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime

/// Where the orchestrator keeps people, cursors, set-ups and the route outbox: SQLite (the
/// embedded default, ``SQLiteOrchestratorDatabase``) or PostgreSQL (`OrchestratorPostgresDatabase`
/// in the `OrchestratorPostgres` module).
///
/// Decisions commit one batch per transaction either way, with the cursors of the events that
/// caused them and the route intents they emit. On SQLite the batch is decided and written on the
/// bus's own thread; a shared database is written off it (``BufferedDecisionStore``).
///
/// Thread safety: any task may call any method.
public protocol OrchestratorStorage: Sendable {
    /// The intent in force for `uid`, with its route sequence and time.
    func routeState(of uid: String) async throws -> RouteState
    /// Everyone with an intent in force after `uid`, in uid order.
    func routeStates(after uid: String?, limit: Int) async throws -> RouteStatePage
    /// The route intents recorded after `sequence`, for `events.after`.
    func events(after sequence: UInt64, limit: Int?) async throws -> EventPage
    /// Per publisher, the sequence of the last event handled.
    func cursors() async throws -> [String: UInt64]
    /// Everyone with work under way (a pending check or clean-up), to resume after a restart.
    func peopleWithWork() async throws -> [(String, OnboardingStateMachine.PersistedPerson)]

    /// Records that a set-up is under way, so that a crash leaves it to be settled.
    /// - Returns: its attempt (see ``SetUpRecord/attempt``), which replaces the record's.
    func beginSetup(_ setup: SetUpRecord) async throws -> UInt64
    /// Removes the record of a set-up that is over, unless a newer try of it (same key, higher
    /// attempt) has begun since: that try's record stays until it is over too.
    func endSetup(_ setup: SetUpRecord) async throws
    /// Removes the records of `uid`'s set-ups with an attempt at or below `attempt`: settled
    /// together by settling the newest of them.
    func endSetups(of uid: String, through attempt: UInt64) async throws
    func unfinishedSetups() async throws -> [SetUpRecord]
    /// Whether `setup` is still its person's newest set-up on record, at its attempt (no newer
    /// try of that person has begun, and nobody has settled it) and, with replicas, this one
    /// still leads: asked before removing the person's images, which a newer try may have stored.
    func isCurrentSetup(_ setup: SetUpRecord) async throws -> Bool
}

/// A set-up under way, recorded so that one a crash interrupts is settled later.
public struct SetUpRecord: Sendable, Hashable {
    public var uid: String
    public var idempotencyKey: String
    public var username: String
    /// The number the store gave this try when it began: higher than any it gave before, for
    /// anyone, so `profile.abandonCreates` through it also stops every earlier try's creates.
    public var attempt: UInt64

    public init(uid: String, idempotencyKey: String, username: String, attempt: UInt64 = 0) {
        self.uid = uid
        self.idempotencyKey = idempotencyKey
        self.username = username
        self.attempt = attempt
    }
}

/// A store the engine writes off the bus's thread: each batch is decided into a
/// ``DecisionBuffer`` inside a transaction and the buffer then written.
package protocol BufferedDecisionStore: OrchestratorStorage {
    /// In one transaction: reads the stored rows of `uids` (and, with `restarting`, everyone with
    /// work under way) and the route outbox's last sequence, runs `decide` over a buffer made
    /// from them, writes what it buffered, commits, and publishes the buffered intents.
    ///
    /// - Throws: `storeUnavailable` or `timeout` as the store's transactions do; what `decide`
    ///   throws (nothing is then written).
    func commit<Result: Sendable>(
        reading uids: [String], restarting: Bool, _ decide: @escaping @Sendable (inout DecisionBuffer) throws -> Result
    ) async throws -> Result
}

/// What every store of the orchestrator is opened with.
public struct OrchestratorStorageContext: Sendable {
    /// Where route intents are published once committed.
    public var publisher: any EventPublisher
    public var retention: Outbox.Retention
    public var logger: Logger

    public init(publisher: any EventPublisher, retention: Outbox.Retention, logger: Logger) {
        self.publisher = publisher
        self.retention = retention
        self.logger = logger
    }
}

/// What ``OrchestratorDatabase/withStorage(_:_:)`` throws when the orchestrator is asked to stop
/// (gracefully) while it waits to lead: a standby has nothing to finish.
public struct StoppedWhileStandingBy: Error {
    public init() {}
}

/// A database the orchestrator can keep its store in: opened, migrated and looked after for as
/// long as the orchestrator runs.
public protocol OrchestratorDatabase: Sendable, CustomStringConvertible {
    /// Opens the store, runs `body` with it, and closes it when `body` returns or throws.
    ///
    /// - Throws: ``ServiceError`` `storeUnavailable` when the database cannot be opened or
    ///   migrated; what `body` throws.
    func withStorage<T: Sendable>(
        _ context: OrchestratorStorageContext, _ body: @Sendable (any OrchestratorStorage) async throws -> T
    ) async throws -> T
}

// MARK: SQLite

/// The orchestrator's store in a SQLite file (or in memory, for tests): the embedded default.
public struct SQLiteOrchestratorDatabase: OrchestratorDatabase {
    /// The file; `nil` keeps everything in memory.
    public var path: String?

    public init(path: String?) {
        self.path = path
    }

    public var description: String { path.map { "SQLite at \($0)" } ?? "SQLite in memory" }

    public func withStorage<T: Sendable>(
        _ context: OrchestratorStorageContext, _ body: @Sendable (any OrchestratorStorage) async throws -> T
    ) async throws -> T {
        let logger = context.logger
        return try await withSQLiteStore(
            path: path, retention: context.retention, logger: logger, open: { try OrchestratorStore.openDatabase(path: $0) }
        ) { database in
            let storage = SQLiteOrchestratorStorage(
                database: database, outbox: Outbox(source: ServiceName.orchestrator, publisher: context.publisher),
                logger: logger)
            return try await body(storage)
        }
    }
}

/// The orchestrator's SQLite store: ``OrchestratorStore``'s statements, each in a transaction of
/// its own; the engine writes decisions on the bus's thread through ``database`` itself.
final class SQLiteOrchestratorStorage: OrchestratorStorage {
    let database: any DatabaseWriter
    let outbox: Outbox
    let logger: Logger

    init(database: any DatabaseWriter, outbox: Outbox, logger: Logger) {
        self.database = database
        self.outbox = outbox
        self.logger = logger
    }

    func routeState(of uid: String) async throws -> RouteState {
        try await withStore(database, write: false, logger: logger) { try OrchestratorStore.routeState(of: uid, in: $0) }
    }

    func routeStates(after uid: String?, limit: Int) async throws -> RouteStatePage {
        try await withStore(database, write: false, logger: logger) {
            try OrchestratorStore.routeStates(after: uid, limit: limit, in: $0)
        }
    }

    func events(after sequence: UInt64, limit: Int?) async throws -> EventPage {
        try await withStore(database, write: false, logger: logger) { try Outbox.events(after: sequence, limit: limit, in: $0) }
    }

    func cursors() async throws -> [String: UInt64] {
        try await withStore(database, write: false, logger: logger) { try OrchestratorStore.cursors(in: $0) }
    }

    func peopleWithWork() async throws -> [(String, OnboardingStateMachine.PersistedPerson)] {
        try await withStore(database, write: false, logger: logger) { try OrchestratorStore.peopleWithWork(in: $0) }
    }

    func beginSetup(_ setup: SetUpRecord) async throws -> UInt64 {
        try await withStore(database, logger: logger) { try OrchestratorStore.beginSetup(setup, in: $0) }
    }

    func endSetup(_ setup: SetUpRecord) async throws {
        try await withStore(database, logger: logger) {
            try OrchestratorStore.endSetup(setup, in: $0)
        }
    }

    func unfinishedSetups() async throws -> [SetUpRecord] {
        try await withStore(database, write: false, logger: logger) { try OrchestratorStore.unfinishedSetups(in: $0) }
    }

    func endSetups(of uid: String, through attempt: UInt64) async throws {
        try await withStore(database, logger: logger) { try OrchestratorStore.endSetups(of: uid, through: attempt, in: $0) }
    }

    func isCurrentSetup(_ setup: SetUpRecord) async throws -> Bool {
        try await withStore(database, write: false, logger: logger) { try OrchestratorStore.isCurrentSetup(setup, in: $0) }
    }
}

// MARK: Decisions

/// What one decision transaction reads and writes (see `Engine.apply`): the stored rows of people
/// the machine is not tracking, the route intents it emits, and the rows and cursors it changes.
package protocol DecisionTransaction {
    /// The stored row of `uid`, someone the machine is not tracking.
    mutating func storedPerson(_ uid: String) throws -> OnboardingStateMachine.PersistedPerson?
    /// Everyone with work under way, to start the machine again from the store.
    mutating func peopleWithWork() throws -> [(String, OnboardingStateMachine.PersistedPerson)]
    /// Puts `intent` in the route outbox, published once the transaction commits.
    mutating func emit(_ intent: RouteIntent, time: String) throws -> OrchestratorStore.PublishedIntent
    mutating func setCursor(_ publisher: String, to sequence: UInt64) throws
    /// Writes `person`'s row; `published`, emitted in this transaction, is the intent in force.
    mutating func save(_ uid: String, _ person: OnboardingStateMachine.PersistedPerson, published: OrchestratorStore.PublishedIntent?) throws
    /// Records `published` as the intent in force for its person, the rest of the row as it is.
    mutating func recordIntent(_ published: OrchestratorStore.PublishedIntent) throws
}

/// A decision transaction on SQLite: every read and write goes straight to the open transaction.
struct SQLiteDecisions: DecisionTransaction {
    let db: Database
    let outbox: Outbox
    /// The largest uid with a row: someone above it has none, so nothing is read for them (see
    /// `Engine.largestStoredUID`).
    var largestStored: String

    mutating func storedPerson(_ uid: String) throws -> OnboardingStateMachine.PersistedPerson? {
        guard !Engine.isAbove(uid, largestStored) else { return nil }
        return try OrchestratorStore.person(uid, in: db)
    }

    mutating func peopleWithWork() throws -> [(String, OnboardingStateMachine.PersistedPerson)] {
        try OrchestratorStore.peopleWithWork(in: db)
    }

    mutating func emit(_ intent: RouteIntent, time: String) throws -> OrchestratorStore.PublishedIntent {
        let sequence = try outbox.append(intent, uid: intent.uid, topic: Topics.route(uid: intent.uid), time: time, in: db)
        return OrchestratorStore.PublishedIntent(intent: intent, sequence: sequence, time: time)
    }

    mutating func setCursor(_ publisher: String, to sequence: UInt64) throws {
        try OrchestratorStore.setCursor(publisher, to: sequence, in: db)
    }

    mutating func save(
        _ uid: String, _ person: OnboardingStateMachine.PersistedPerson, published: OrchestratorStore.PublishedIntent?
    ) throws {
        try OrchestratorStore.save(uid, person, published: published, in: db)
        if Engine.isAbove(uid, largestStored) { largestStored = uid }
    }

    mutating func recordIntent(_ published: OrchestratorStore.PublishedIntent) throws {
        try OrchestratorStore.recordIntent(published, in: db)
        if Engine.isAbove(published.intent.uid, largestStored) { largestStored = published.intent.uid }
    }
}

/// A decision transaction kept in memory, for a store that reads what a batch needs first and
/// writes what it decided afterwards, a statement per kind of write (``BufferedDecisionStore``).
package struct DecisionBuffer: DecisionTransaction {
    /// The stored rows read for the batch, by uid (people without a row are absent).
    package let stored: [String: OnboardingStateMachine.PersistedPerson]
    /// Everyone with work under way, when read for a restart.
    package let withWork: [(String, OnboardingStateMachine.PersistedPerson)]?
    /// The route outbox's last sequence before this transaction.
    package let lastSequence: UInt64

    /// The intents emitted, in route sequence order.
    package private(set) var emitted: [OrchestratorStore.PublishedIntent] = []
    package private(set) var cursors: [String: UInt64] = [:]
    /// Rows written whole, with the intent in force when it was emitted in this transaction.
    package private(set) var saved: [(row: PersonRow, published: OrchestratorStore.PublishedIntent?)] = []
    /// Intents recorded as in force for people whose rows are otherwise unchanged. Written before
    /// ``saved``, which may overwrite them (one person appears at most once in each list).
    package private(set) var recorded: [OrchestratorStore.PublishedIntent] = []

    package init(
        stored: [String: OnboardingStateMachine.PersistedPerson],
        withWork: [(String, OnboardingStateMachine.PersistedPerson)]?, lastSequence: UInt64
    ) {
        self.stored = stored
        self.withWork = withWork
        self.lastSequence = lastSequence
    }

    package mutating func storedPerson(_ uid: String) throws -> OnboardingStateMachine.PersistedPerson? {
        stored[uid]
    }

    package mutating func peopleWithWork() throws -> [(String, OnboardingStateMachine.PersistedPerson)] {
        guard let withWork else {
            throw ServiceError(.internalError, "The orchestrator restarted its decisions without reading the work under way.")
        }
        return withWork
    }

    package mutating func emit(_ intent: RouteIntent, time: String) throws -> OrchestratorStore.PublishedIntent {
        // The trace is taken now, while the intent's publication span is current: the outbox
        // writes the buffer after the decisions.
        let trace = Traces.current()
        let published = OrchestratorStore.PublishedIntent(
            intent: intent, sequence: lastSequence + UInt64(emitted.count) + 1, time: time, traceparent: trace.traceparent,
            tracestate: trace.tracestate)
        emitted.append(published)
        return published
    }

    package mutating func setCursor(_ publisher: String, to sequence: UInt64) throws {
        cursors[publisher] = sequence
    }

    package mutating func save(
        _ uid: String, _ person: OnboardingStateMachine.PersistedPerson, published: OrchestratorStore.PublishedIntent?
    ) throws {
        saved.append((PersonRow(uid: uid, person), published))
    }

    package mutating func recordIntent(_ published: OrchestratorStore.PublishedIntent) throws {
        recorded.append(published)
    }
}

/// A person's row as stored, column by column.
package struct PersonRow: Sendable, Hashable {
    package var uid: String
    /// `present`, `absent` or `unknown`.
    package var profile: String
    package var profileAsOf: Int64
    package var sessions: Int
    package var owesDismiss: Bool
    package var pendingCheck: String?
    package var withdrawn: Bool
    /// Clean-up steps still to do, comma-separated.
    package var cleanup: String
    package var intentId: String?
    package var intent: String?
    package var reason: String?

    package init(
        uid: String, profile: String, profileAsOf: Int64, sessions: Int, owesDismiss: Bool, pendingCheck: String?,
        withdrawn: Bool, cleanup: String, intentId: String?, intent: String?, reason: String?
    ) {
        self.uid = uid
        self.profile = profile
        self.profileAsOf = profileAsOf
        self.sessions = sessions
        self.owesDismiss = owesDismiss
        self.pendingCheck = pendingCheck
        self.withdrawn = withdrawn
        self.cleanup = cleanup
        self.intentId = intentId
        self.intent = intent
        self.reason = reason
    }

    package init(uid: String, _ person: OnboardingStateMachine.PersistedPerson) {
        let profile: String =
            switch person.profile {
            case .present: "present"
            case .absent: "absent"
            case .unknown: "unknown"
            }
        self.init(
            uid: uid, profile: profile, profileAsOf: Int64(clamping: person.profileAsOf), sessions: person.sessions,
            owesDismiss: person.owesDismiss, pendingCheck: person.pendingCheck?.rawValue, withdrawn: person.withdrawn,
            cleanup: OnboardingStateMachine.CleanupStep.allCases.filter(person.cleanup.contains).map(\.rawValue).joined(separator: ","),
            intentId: person.intent?.intentId, intent: person.intent?.intent.rawValue, reason: person.intent?.reason.rawValue)
    }

    package var persisted: OnboardingStateMachine.PersistedPerson {
        let knowledge: OnboardingStateMachine.ProfileKnowledge =
            switch profile {
            case "present": .present
            case "absent": .absent
            default: .unknown
            }
        let steps = cleanup.split(separator: ",").compactMap { OnboardingStateMachine.CleanupStep(rawValue: String($0)) }
        return .init(
            profile: knowledge, profileAsOf: UInt64(clamping: profileAsOf), sessions: sessions,
            intent: OrchestratorStore.intent(uid: uid, id: intentId, kind: intent, reason: reason),
            owesDismiss: owesDismiss, pendingCheck: pendingCheck.flatMap(RouteIntent.Reason.init(rawValue:)),
            withdrawn: withdrawn, cleanup: Set(steps))
    }
}
