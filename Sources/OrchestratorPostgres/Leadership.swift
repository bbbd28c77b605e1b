import Foundation
import Logging
import Messaging
import OnboardingAPI
import PostgresNIO
import PostgresSupport

/// Which orchestrator replica decides: the one holding the schema's session-level advisory lock,
/// on a connection it keeps for as long as it leads.
///
/// Taking the lead also increments the `leader` row's epoch, in a transaction that takes the
/// outbox head's lock (as every decision transaction does), so the two take turns: a decision
/// transaction of the replica that led before either commits before the new leader reads
/// anything, or finds the epoch changed and writes nothing (``OrchestratorPostgresStore``).
///
/// A leader that loses its connection (the database restarted, the network failed) stops
/// deciding at once: ``watch(on:every:)`` throws, and the orchestrator stops so that it is
/// restarted and stands by again.
struct Leadership: Sendable {
    /// This replica's term: the `leader` row's epoch it set.
    let epoch: Int64
    let key: Int64
    let logger: Logger

    /// The lead lost: the orchestrator stops (and is restarted by its supervisor, as a standby),
    /// saying why in one line.
    static func lost(_ reason: String) -> ServiceError {
        ServiceError(
            .storeUnavailable,
            "This orchestrator no longer leads (\(reason)); it stops so that the one that leads now decides. Restarted, it stands by.")
    }

    /// Waits until this replica holds the lead, then starts its term.
    ///
    /// - Throws: ``lost(_:)`` when the connection fails or does not answer within `patience`.
    static func take(
        on connection: PostgresConnection, store: PostgresStore, every interval: Duration, patience: Duration, logger: Logger
    ) async throws -> Leadership {
        let schema = store.location.schema
        var hashed: Int64 = 0
        for try await value in try await connection.query(
            "SELECT hashtextextended(\("onboarding.lead." + schema), 0)", logger: logger
        ).decode(Int64.self) { hashed = value }
        let key = hashed
        var standingBy = false
        while true {
            let held: Bool
            do {
                held = try await store.withinTimeout(patience) {
                    var held = false
                    for try await got in try await connection.query("SELECT pg_try_advisory_lock(\(key))", logger: logger)
                        .decode(Bool.self)
                    { held = got }
                    return held
                }
            } catch {
                if Task.isCancelled { throw CancellationError() }
                throw Self.lost("its connection to PostgreSQL failed or did not answer: \(String(reflecting: error))")
            }
            if held { break }
            if !standingBy {
                logger.notice("another orchestrator leads (schema \(schema)): standing by to take over when it stops")
                standingBy = true
            }
            try await Task.sleep(for: interval)
        }
        let holder = "\(hostName())#\(ProcessInfo.processInfo.processIdentifier)"
        let epoch = try await store.eventTransaction { connection, _ in
            var epoch: Int64 = 0
            for try await value in try await connection.query(
                "UPDATE leader SET epoch = epoch + 1, holder = \(holder), since = now() WHERE id = 1 RETURNING epoch",
                logger: logger
            ).decode(Int64.self) { epoch = value }
            return epoch
        } afterCommit: { _ in }
        logger.notice("this orchestrator leads now (schema \(schema), term \(epoch))\(standingBy ? ", taking over" : "")")
        return Leadership(epoch: epoch, key: key, logger: logger)
    }

    /// Returns only by throwing: ``lost(_:)`` when the lead's connection fails, does not answer
    /// within `patience` (a connection the server ended can leave a query unanswered), or another
    /// replica's term has begun; cancellation when the orchestrator stops.
    func watch(on connection: PostgresConnection, store: PostgresStore, every interval: Duration, patience: Duration)
        async throws
    {
        let logger = self.logger
        while true {
            try await Task.sleep(for: interval)
            let current: Int64?
            do {
                current = try await store.withinTimeout(patience) {
                    var current: Int64?
                    for try await value in try await connection.query("SELECT epoch FROM leader WHERE id = 1", logger: logger)
                        .decode(Int64.self)
                    { current = value }
                    return current
                }
            } catch {
                if Task.isCancelled { throw CancellationError() }
                throw Self.lost("its connection to PostgreSQL failed or did not answer: \(String(reflecting: error))")
            }
            guard current == epoch else { throw Self.lost("term \(current.map(String.init) ?? "?") has begun, this one was \(epoch)") }
        }
    }

    /// Gives the lead up (on a graceful stop), so a standby takes over within its next try:
    /// the lead's connection is closed, which ends its session and the lock with it (the pool
    /// opens another connection when it needs one).
    func release(on connection: PostgresConnection) async {
        try? await connection.close()
    }

    private static func hostName() -> String {
        var name = [CChar](repeating: 0, count: 256)
        guard gethostname(&name, name.count) == 0 else { return "unknown-host" }
        return String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
