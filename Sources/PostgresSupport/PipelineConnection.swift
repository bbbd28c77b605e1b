import CLibpq
import Foundation
import Logging
import Messaging
import NIOCore
import PostgresNIO

/// One connection to PostgreSQL in libpq's pipeline mode, for the transactions a store runs most
/// (see ``PostgresStore/pipelinedEventTransaction(_:afterCommit:)``).
///
/// Why: postgres-nio sends a statement only once the one before has been answered, so a
/// transaction of n statements waits for n + 2 round trips (with `BEGIN` and `COMMIT`), each
/// waking the service and the server. In pipeline mode a transaction's statements go out
/// together up to the first one whose rows it needs, and the rest with `COMMIT`: two round trips
/// for a batch of sign-ins or decisions. The statements are postgres-nio's (``PipelineQuery``
/// encodes with its codecs); only the connection is libpq's.
///
/// A thread of its own owns the connection for its whole life, and runs each transaction's body
/// there, synchronously (libpq's calls block; a Swift concurrency thread must never wait on
/// them). It connects when the first transaction comes, and after any failure closes the
/// connection (the server rolls back what was open) and opens a new one for the next.
///
/// Thread safety: any task may call ``run(deadline:_:afterCommit:)``; transactions run one at a time.
final class PipelineConnection: Sendable {
    private let jobs = PipelineJobs()

    /// - Parameter timeout: how long a transaction may take; the server ends a statement that
    ///   runs longer and a transaction left idle that long (`statement_timeout`,
    ///   `idle_in_transaction_session_timeout`), so that one its caller has given up on does not
    ///   hold the outbox's lock, or anything else, much past it.
    init(location: PostgresLocation, applicationName: String, timeout: Duration, logger: Logger) {
        let jobs = self.jobs
        let link = Link(location: location, applicationName: applicationName, timeout: timeout, logger: logger)
        let thread = Thread {
            while let batch = jobs.waitAndTake() {
                for job in batch { job(link) }
            }
            link.close()
            for job in jobs.takeLeft() { job(nil) }
        }
        thread.name = "postgres-pipeline"
        thread.start()
    }

    deinit {
        jobs.stop()
    }

    /// Stops the thread once it has run what is queued, and closes the connection; later
    /// transactions fail with `storeUnavailable`.
    func close() {
        jobs.stop()
    }

    /// Runs `body` in one transaction on the connection's thread, and `afterCommit` there once it
    /// has committed; `finish` gets the outcome. No `COMMIT` is sent after `deadline`.
    func run<T>(
        deadline: ContinuousClock.Instant, _ body: @escaping @Sendable (PipelineTransaction) throws -> T,
        afterCommit: @escaping @Sendable (T) -> Void, finish: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        jobs.append { link in
            guard let link else {
                return finish(.failure(ServiceError(.storeUnavailable, "The store is closed (the service is stopping).")))
            }
            finish(Result { try link.transaction(deadline: deadline, body, afterCommit: afterCommit) })
        }
    }
}

/// A transaction's statements, as its body sends them (see ``PipelineConnection``).
///
/// ``send(_:)`` queues a statement whose result is only checked; ``rows(_:)`` sends what is
/// queued with its statement and waits for them all. Statements run in the order given, so a
/// read sees every write sent before it. An error in any of them fails the transaction (at the
/// next ``rows(_:)``, or at the commit), and nothing is committed.
///
/// Only for the body it is given to, on the connection's thread.
public final class PipelineTransaction {
    fileprivate let link: Link

    fileprivate init(link: Link) {
        self.link = link
    }

    /// Queues `query`: sent with the next flight.
    public func send(_ query: PipelineQuery) throws {
        try link.send(query)
    }

    /// Sends what is queued and `query`, and returns `query`'s rows.
    public func rows(_ query: PipelineQuery) throws -> PipelineRows {
        try link.send(query, as: .wanted)
        return try link.readAll(flushing: true)
    }

    /// The last sequence number the service's outbox assigned, read under the head's lock
    /// (``PostgresOutbox/lockHead``), which the transaction took first.
    public func lastSequence() throws -> Int64 {
        if link.lockedHead == nil { _ = try link.readAll(flushing: true) }
        guard let head = link.lockedHead else {
            throw ServiceError(.storeUnavailable, "The outbox has no head row: was the store migrated?")
        }
        return head
    }
}

/// The connection's state, touched only on its thread.
//
// @unchecked Sendable: handed to the thread once; every use is on that thread.
private final class Link: @unchecked Sendable {
    let location: PostgresLocation
    let applicationName: String
    let timeout: Duration
    let logger: Logger
    private var connection: OpaquePointer?
    /// Statements prepared on ``connection``, by SQL and parameter types: their names.
    private var prepared: [PreparedKey: String] = [:]
    /// What each statement sent and not yet read is for, in the order sent.
    private var unread: [Unread] = []
    private var deadline = ContinuousClock.now
    /// What ``PostgresOutbox/lockHead`` returned in this transaction.
    fileprivate var lockedHead: Int64?
    /// The first statement of this transaction the server refused: every later one, COMMIT
    /// included, was skipped, even when the body caught the error.
    private var failure: StatementFailure?
    /// Whether this transaction's COMMIT was answered: it has committed.
    private var committed = false

    private struct PreparedKey: Hashable {
        var sql: String
        var types: [UInt32]
    }

    fileprivate enum Unread {
        /// A preparation's, or a statement's whose rows nobody waits for.
        case checked
        /// The lock of the outbox's head: its number is kept.
        case head
        /// The statement whose rows ``readAll(flushing:)`` returns.
        case wanted
        /// The transaction's COMMIT.
        case commit
    }

    /// Prepared statements kept per connection, at most: the stores' statements are a few dozen.
    private static let preparedLimit = 256

    init(location: PostgresLocation, applicationName: String, timeout: Duration, logger: Logger) {
        self.location = location
        self.applicationName = applicationName
        self.timeout = timeout
        self.logger = logger
    }

    /// `body` between `BEGIN` (with the outbox head's lock) and `COMMIT`; `afterCommit` once
    /// COMMIT is answered, even when that is after `deadline` (the caller has stopped waiting).
    func transaction<T>(
        deadline: ContinuousClock.Instant, _ body: (PipelineTransaction) throws -> T, afterCommit: (T) -> Void
    ) throws -> T {
        guard ContinuousClock.now < deadline else {
            throw ServiceError(.timeout, "The store was busy past the time limit; nothing was changed. Try again.")
        }
        self.deadline = deadline
        (lockedHead, failure, committed) = (nil, nil, false)
        var committing = false
        do {
            try connectIfNeeded()
            try send("BEGIN")
            try send(PipelineQuery(stringLiteral: PostgresOutbox.lockHead), as: .head)
            let result = try body(PipelineTransaction(link: self))
            if let failure { throw failure }
            guard ContinuousClock.now < deadline else { throw PipelineError("the time limit passed before COMMIT") }
            try send("COMMIT", as: .commit)
            committing = true
            // Its outcome is read past the caller's deadline, so that a commit that lands late
            // (a paused server) is still published: for as long as keepalives take to call the
            // connection dead.
            self.deadline = ContinuousClock.now + timeout + .seconds(25)
            do {
                try sync()
            } catch where committed {
                disconnect()
            }
            guard committed else { throw PipelineError("COMMIT went unanswered") }
            afterCommit(result)
            return result
        } catch let failure as StatementFailure where !failure.outcomeUnknown {
            // The server refused a statement: the rest was skipped, COMMIT with it.
            disconnect()
            throw PipelineError(failure.message)
        } catch {
            disconnect()
            guard committing, !(error is ServiceError) else { throw error }
            logger.error("the pipelined connection failed while committing: \(error)")
            throw ServiceError(
                .timeout,
                "The store's connection failed while committing: the change may or may not have been made. Try again "
                    + "(a request with an idempotency key is safe to repeat).")
        }
    }

    func close() {
        disconnect()
    }

    // MARK: Sending

    /// Queues `query` (prepared once per connection) for the next flight.
    func send(_ query: PipelineQuery, as kind: Unread = .checked) throws {
        guard let connection else { throw PipelineError("not connected") }
        let types = query.parameters.map(\.type)
        let key = PreparedKey(sql: query.sql, types: types)
        var name = prepared[key]
        if name == nil, prepared.count < Self.preparedLimit {
            let newName = "p\(prepared.count + 1)"
            let sent = types.withUnsafeBufferPointer { types in
                PQsendPrepare(connection, newName, query.sql, Int32(types.count), types.baseAddress)
            }
            guard sent == 1 else { throw connectionFailure("preparing a statement") }
            unread.append(.checked)
            prepared[key] = newName
            name = newName
        }
        let sent = withParameters(query.parameters) { count, values, lengths, formats in
            if let name {
                PQsendQueryPrepared(connection, name, count, values, lengths, formats, 1)
            } else {
                types.withUnsafeBufferPointer { types in
                    PQsendQueryParams(connection, query.sql, count, types.baseAddress, values, lengths, formats, 1)
                }
            }
        }
        guard sent == 1 else { throw connectionFailure("sending a statement") }
        unread.append(kind)
    }

    /// Calls `body` with libpq's parameter arrays for `parameters`.
    private func withParameters(
        _ parameters: [PipelineQuery.Parameter],
        _ body: (Int32, UnsafePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int32>?, UnsafePointer<Int32>?) -> Int32
    ) -> Int32 {
        // All values in one buffer, with a byte after them so that an empty value (not NULL)
        // still has an address.
        var bytes: [UInt8] = []
        bytes.reserveCapacity(parameters.reduce(1) { $0 + ($1.bytes?.count ?? 0) })
        var offsets: [Int?] = []
        for parameter in parameters {
            offsets.append(parameter.bytes == nil ? nil : bytes.count)
            bytes += parameter.bytes ?? []
        }
        bytes.append(0)
        let lengths = parameters.map { Int32($0.bytes?.count ?? 0) }
        let formats = parameters.map(\.format)
        return bytes.withUnsafeBufferPointer { storage in
            let base = UnsafeRawPointer(storage.baseAddress!)
            let values: [UnsafePointer<CChar>?] = offsets.map { offset in
                offset.map { (base + $0).assumingMemoryBound(to: CChar.self) }
            }
            return values.withUnsafeBufferPointer { values in
                lengths.withUnsafeBufferPointer { lengths in
                    formats.withUnsafeBufferPointer { formats in
                        body(Int32(parameters.count), values.baseAddress, lengths.baseAddress, formats.baseAddress)
                    }
                }
            }
        }
    }

    // MARK: Reading

    /// Sends what is queued (asking the server to answer at once) and reads every result sent
    /// for; returns the rows of the last one wanted.
    func readAll(flushing: Bool) throws -> PipelineRows {
        guard let connection else { throw PipelineError("not connected") }
        if let failure { throw failure }
        if flushing {
            guard PQsendFlushRequest(connection) == 1 else { throw connectionFailure("asking for results") }
        }
        try flush()
        var wanted = PipelineRows(types: [], rows: [])
        let expected = unread
        unread = []
        for kind in expected {
            guard let result = try nextResult() else { throw PipelineError("a statement's result is missing") }
            defer { PQclear(result) }
            switch PQresultStatus(result) {
            case PGRES_TUPLES_OK, PGRES_COMMAND_OK:
                switch kind {
                case .checked: break
                case .wanted: wanted = Self.rows(of: result)
                case .head: lockedHead = try Self.rows(of: result).first.map { try $0.decode(Int64.self) }
                case .commit: committed = true
                }
            case PGRES_PIPELINE_ABORTED:
                failure = failure ?? StatementFailure(message: "a statement was skipped after an earlier one failed")
            default:
                // COMMIT refused with an ERROR rolled back; a FATAL one (the server ending the
                // session) may have come after the commit was made.
                let severity = PQresultErrorField(result, Int32(UInt8(ascii: "V"))).map { String(cString: $0) }
                failure =
                    failure
                    ?? StatementFailure(message: Self.message(of: result), outcomeUnknown: kind == .commit && severity != "ERROR")
            }
            // Each statement's results end with a null result.
            if let extra = try nextResult() {
                PQclear(extra)
                throw PipelineError("a statement returned more than one result")
            }
        }
        if let failure { throw failure }
        return wanted
    }

    /// Sends `COMMIT`'s flight with a synchronisation point, and reads to it.
    private func sync() throws {
        guard let connection, PQpipelineSync(connection) == 1 else { throw connectionFailure("synchronising") }
        _ = try readAll(flushing: false)
        guard let result = try nextResult() else { throw PipelineError("the synchronisation point is missing") }
        defer { PQclear(result) }
        guard PQresultStatus(result) == PGRES_PIPELINE_SYNC else {
            throw PipelineError("expected the synchronisation point, got \(String(cString: PQresStatus(PQresultStatus(result))))")
        }
    }

    private struct StatementFailure: Error {
        var message: String
        /// Whether the transaction may have committed all the same.
        var outcomeUnknown = false
    }

    /// The next result, waiting for it until the deadline; `nil` ends a statement's results.
    private func nextResult() throws -> OpaquePointer? {
        guard let connection else { throw PipelineError("not connected") }
        while PQisBusy(connection) == 1 {
            try wait(for: Int16(POLLIN))
            guard PQconsumeInput(connection) == 1 else { throw connectionFailure("reading") }
        }
        return PQgetResult(connection)
    }

    /// Writes what libpq holds for the server.
    private func flush() throws {
        guard let connection else { throw PipelineError("not connected") }
        while true {
            switch PQflush(connection) {
            case 0: return
            case 1:
                try wait(for: Int16(POLLOUT | POLLIN))
                guard PQconsumeInput(connection) == 1 else { throw connectionFailure("reading") }
            default: throw connectionFailure("writing")
            }
        }
    }

    /// Waits until the socket is ready for `events`, at most until the deadline.
    private func wait(for events: Int16) throws {
        guard let connection else { throw PipelineError("not connected") }
        while true {
            let left = deadline - ContinuousClock.now
            guard left > .zero else {
                throw PipelineError("no answer within the time limit (is the server paused or unreachable?)")
            }
            let (seconds, attoseconds) = left.components
            let milliseconds = Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000 + 1)
            var descriptor = pollfd(fd: PQsocket(connection), events: events, revents: 0)
            let ready = poll(&descriptor, 1, milliseconds)
            if ready > 0 { return }
            if ready < 0, errno != EINTR { throw PipelineError("poll failed: errno \(errno)") }
        }
    }

    private static func rows(of result: OpaquePointer) -> PipelineRows {
        let columns = Int(PQnfields(result))
        let types = (0..<columns).map { PostgresDataType(UInt32(PQftype(result, Int32($0)))) }
        var rows: [[ByteBuffer?]] = []
        rows.reserveCapacity(Int(PQntuples(result)))
        for row in 0..<PQntuples(result) {
            rows.append(
                (0..<Int32(columns)).map { column in
                    guard PQgetisnull(result, row, column) == 0 else { return nil }
                    let length = Int(PQgetlength(result, row, column))
                    let value = UnsafeRawBufferPointer(start: PQgetvalue(result, row, column), count: length)
                    return ByteBuffer(bytes: value)
                })
        }
        return PipelineRows(types: types, rows: rows)
    }

    private static func message(of result: OpaquePointer) -> String {
        String(cString: PQresultErrorMessage(result)).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    // MARK: Connecting

    private func connectIfNeeded() throws {
        if let connection, PQstatus(connection) == CONNECTION_OK, Self.isQuiet(connection) { return }
        disconnect()
        let left = deadline - ContinuousClock.now
        // libpq's connect_timeout is whole seconds, and at least 2.
        let seconds = max(2, left.components.seconds + 1)
        // `require` verifies the server's certificate against the system's authorities, as
        // postgres-nio's `.require` does; libpq's `prefer` encrypts without verifying.
        let verifying = location.tls == .require && FileManager.default.fileExists(atPath: Self.systemAuthorities)
        let sslmode = verifying ? "verify-full" : location.tls.rawValue
        let milliseconds = max(1, timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000)
        var parameters: [(String, String)] = [
            ("host", location.socketDirectory ?? location.host), ("port", String(location.port)),
            ("user", location.username), ("dbname", location.database), ("sslmode", sslmode),
            ("application_name", applicationName), ("connect_timeout", String(seconds)),
            // As postgres-nio's connections (PostgresLocation.clientConfiguration): the schema, a
            // plan per run for statements over arrays of any length, and the server probing the
            // connection when idle (a vanished client's transaction ends within about 25 s). And
            // a transaction the caller has given up on must not hold the outbox's lock past the
            // time limit: the server ends a statement that runs longer, and a transaction left
            // idle that long.
            (
                "options",
                [
                    "search_path=\(location.schema)", "plan_cache_mode=force_custom_plan", "tcp_keepalives_idle=10",
                    "tcp_keepalives_interval=5", "tcp_keepalives_count=3", "statement_timeout=\(milliseconds)",
                    "idle_in_transaction_session_timeout=\(milliseconds)",
                ].map { "-c \($0)" }.joined(separator: " ")
            ),
            // This side probes too: a server host that vanishes is noticed within about 25 s.
            ("keepalives", "1"), ("keepalives_idle", "10"), ("keepalives_interval", "5"), ("keepalives_count", "3"),
        ]
        if verifying { parameters.append(("sslrootcert", Self.systemAuthorities)) }
        if let password = location.password { parameters.append(("password", password)) }
        let opened = Self.withCStrings(parameters.map(\.0)) { keys in
            Self.withCStrings(parameters.map(\.1)) { values in PQconnectdbParams(keys, values, 0) }
        }
        guard let opened else { throw PipelineError("libpq could not allocate a connection") }
        guard PQstatus(opened) == CONNECTION_OK else {
            let message = String(cString: PQerrorMessage(opened)).trimmingCharacters(in: .whitespacesAndNewlines)
            PQfinish(opened)
            throw PipelineError("cannot connect to \(location): \(message)")
        }
        guard PQsetnonblocking(opened, 1) == 0, PQenterPipelineMode(opened) == 1 else {
            let message = String(cString: PQerrorMessage(opened))
            PQfinish(opened)
            throw PipelineError("cannot enter pipeline mode: \(message)")
        }
        PQsetNoticeProcessor(
            opened,
            { context, message in
                guard let context, let message else { return }
                let link = Unmanaged<Link>.fromOpaque(context).takeUnretainedValue()
                link.logger.warning("PostgreSQL: \(String(cString: message).trimmingCharacters(in: .whitespacesAndNewlines))")
            }, Unmanaged.passUnretained(self).toOpaque())
        connection = opened
    }

    /// Debian's bundle of the system's certificate authorities.
    private static let systemAuthorities = "/etc/ssl/certs/ca-certificates.crt"

    /// Whether an idle `connection` has heard nothing from the server: a server that restarted
    /// or ended the session has closed it, or said why, and libpq learns that only by reading.
    private static func isQuiet(_ connection: OpaquePointer) -> Bool {
        var descriptor = pollfd(fd: PQsocket(connection), events: Int16(POLLIN), revents: 0)
        return poll(&descriptor, 1, 0) == 0
    }

    /// Closes the connection (the server rolls back what it left open) and forgets its state.
    private func disconnect() {
        if let connection { PQfinish(connection) }
        connection = nil
        prepared = [:]
        unread = []
    }

    private func connectionFailure(_ doing: String) -> PipelineError {
        let message = connection.map { String(cString: PQerrorMessage($0)) } ?? "not connected"
        return PipelineError("the connection failed \(doing): \(message.trimmingCharacters(in: .whitespacesAndNewlines))")
    }

    /// `body` with `strings` as a null-terminated array of C strings.
    private static func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> R) -> R {
        let copies = strings.map { strdup($0) }
        defer { copies.forEach { free($0) } }
        let pointers: [UnsafePointer<CChar>?] = copies.map { $0.map { UnsafePointer($0) } } + [nil]
        return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
    }
}

/// The transactions waiting for the connection's thread.
//
// @unchecked Sendable: `jobs` and `stopped` are only touched with `condition` locked.
private final class PipelineJobs: @unchecked Sendable {
    typealias Job = @Sendable (Link?) -> Void
    private let condition = NSCondition()
    private var jobs: [Job] = []
    private var stopped = false

    /// Queues `job`; once stopped, runs it at once without the connection.
    func append(_ job: @escaping Job) {
        condition.lock()
        guard !stopped else {
            condition.unlock()
            return job(nil)
        }
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    func stop() {
        condition.lock()
        stopped = true
        condition.signal()
        condition.unlock()
    }

    /// Waits until jobs are queued and takes them all; `nil` once stopped.
    func waitAndTake() -> [Job]? {
        condition.lock()
        defer { condition.unlock() }
        while jobs.isEmpty, !stopped { condition.wait() }
        guard !stopped else { return nil }
        defer { jobs = [] }
        return jobs
    }

    /// What was queued when it stopped.
    func takeLeft() -> [Job] {
        condition.lock()
        defer { condition.unlock() }
        defer { jobs = [] }
        return jobs
    }
}
