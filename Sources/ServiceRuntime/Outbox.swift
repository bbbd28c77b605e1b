import Foundation
import GRDB
import Messaging
import OnboardingAPI

/// A transactional outbox: an event is written in the same transaction as the change it reports,
/// and published once that transaction commits.
///
/// Each event's sequence number is its row id in the `outbox` table, so it only grows (the table
/// uses `AUTOINCREMENT`: ids are never reused, even after old rows are pruned). Events are
/// published in commit order from the database's writer, so subscribers see sequence numbers
/// in order, and the table is the record to replay from.
///
/// Thread safety: immutable after `init`; `append` runs inside a write transaction.
public final class Outbox: Sendable {
    public let source: String
    private let publisher: any EventPublisher

    public init(source: String, publisher: any EventPublisher) {
        self.source = source
        self.publisher = publisher
    }

    /// Registers the `outbox` table's migration.
    public static func registerMigration(in migrator: inout DatabaseMigrator) {
        migrator.registerMigration("outbox-v1") { db in
            try db.create(table: "outbox") { table in
                table.autoIncrementedPrimaryKey("sequence")
                table.column("type", .text).notNull()
                table.column("topic", .text).notNull()
                table.column("uid", .text)
                table.column("envelope", .blob).notNull()
                table.column("createdAt", .text).notNull()
            }
        }
    }

    /// Records `event` in the current transaction and publishes it after commit.
    ///
    /// - Returns: the event's sequence number.
    @discardableResult
    public func append<Event: APIEvent>(
        _ event: Event, uid: String?, correlationId: String? = nil, topic: String? = nil, in db: Database
    ) throws -> UInt64 {
        let topic = topic ?? Event.type
        let time = Timestamp.now()
        try db.execute(
            sql: "INSERT INTO outbox (type, topic, uid, envelope, createdAt) VALUES (?, ?, ?, x'', ?)",
            arguments: [Event.type, topic, uid, time])
        let sequence = UInt64(db.lastInsertedRowID)
        let header = EnvelopeHeader(
            type: Event.type, source: source, sequence: sequence, time: time, correlationId: correlationId, uid: uid)
        let body = try Envelope(header: header, payload: event).encoded()
        try db.execute(sql: "UPDATE outbox SET envelope = ? WHERE sequence = ?", arguments: [body, sequence])
        let publisher = self.publisher
        db.afterNextTransaction { _ in
            // Publishing only queues the message for the bus's I/O thread; it never blocks.
            try? publisher.publish(OutgoingMessage(topic: topic, body: body))
        }
        return sequence
    }
}
