import GRDB
import GRDBSQLite
import Synchronization

/// A value read from a database that its writer keeps from one commit to its next transaction,
/// for as long as nothing else has changed the file in between: a watermark that spares a
/// statement per transaction on the hot path.
///
/// SQLite's data version of the main file (`SQLITE_FCNTL_DATA_VERSION`) moves with every commit
/// to it, from this connection or any other (another process's included), and a transaction sees
/// the move once it has begun. ``keep(_:committedIn:)`` notes the version right after the commit
/// that made the value true; ``value(in:)`` gives the value back only while the version is still
/// that one. Any other commit (pruning, another writer, another outbox) or a rollback means the
/// value is read again from the database.
///
/// ```swift
/// let next = cache.value(in: db) ?? try readFromTheTable(db)
/// // ... write, then, once the transaction commits:
/// db.afterNextTransaction(onCommit: { db in cache.keep(updated, committedIn: db) },
///                         onRollback: { _ in cache.forget() })
/// ```
public final class KeptSinceCommit<Value: Sendable>: Sendable {
    private let kept = Mutex<(value: Value, version: UInt32)?>(nil)

    public init() {}

    /// The value kept at this writer's last commit, or `nil` when the file has changed since
    /// (or nothing is kept). Call it inside the transaction that uses the value.
    public func value(in db: Database) -> Value? {
        kept.withLock { kept in
            guard let kept, let version = Self.dataVersion(of: db), version == kept.version else { return nil }
            return kept.value
        }
    }

    /// Keeps `value` as of the commit that has just happened on `db` (call it from
    /// `afterNextTransaction`'s `onCommit`, before any other transaction can begin).
    public func keep(_ value: Value, committedIn db: Database) {
        let version = Self.dataVersion(of: db)
        kept.withLock { $0 = version.map { (value, $0) } }
    }

    /// Drops the kept value: the next transaction reads it again.
    public func forget() {
        kept.withLock { $0 = nil }
    }

    /// SQLite's data version of `db`'s main file, or `nil` when SQLite cannot tell.
    static func dataVersion(of db: Database) -> UInt32? {
        guard let connection = db.sqliteConnection else { return nil }
        var version: UInt32 = 0
        guard sqlite3_file_control(connection, "main", SQLITE_FCNTL_DATA_VERSION, &version) == SQLITE_OK else { return nil }
        return version
    }
}
