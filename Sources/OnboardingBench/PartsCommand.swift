import ArgumentParser
import Foundation
import GRDB
import Messaging
import OnboardingAPI
import ServiceRuntime

/// `onboarding-bench-parts`: what the pieces of a message's handling cost in a tight loop.
///
/// The system benchmark (`onboarding-bench`) measures whole messages, each arriving after a
/// millisecond in which other threads had the core; this measures the same pieces run back to
/// back, with warm caches. A piece that costs much more per message in the system (per
/// `perf record`) than here costs it in cache misses, not in instructions.
public struct PartsCommand: ParsableCommand {
    public static let configuration = CommandConfiguration(
        commandName: "onboarding-bench-parts",
        abstract: "Microseconds per call of the hot path's pieces in a tight loop: transactions, JSON reads and writes.",
        discussion: """
            Transactions run on a service database (WAL, synchronous=NORMAL, as the services open it) \
            in a temporary directory; the log is checkpointed between pieces. Each piece is warmed up \
            with 2,000 calls, then timed over --count calls, --rounds times; the table shows the lowest \
            and the median round. Build with -c release: a debug build measures the debug build.
            """)

    @Option(help: "Calls per piece per round.")
    var count: Int = 30_000
    @Option(help: "Rounds per piece.")
    var rounds: Int = 3

    public init() {}

    public func validate() throws {
        guard count > 0, rounds > 0 else { throw ValidationError("--count and --rounds must be at least 1.") }
    }

    public func run() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("bench-parts-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let writer = try ServiceDatabase.open(path: directory.appendingPathComponent("parts.sqlite").path)
        defer { try? writer.close() }
        try writer.writeWithoutTransaction { try $0.execute(sql: "CREATE TABLE t (x INTEGER PRIMARY KEY, y TEXT NOT NULL)") }

        var results: [(name: String, rounds: [Double])] = []
        func time(_ name: String, _ body: () throws -> Void) throws {
            for _ in 0..<2_000 { try body() }
            var rounds: [Double] = []
            for _ in 0..<self.rounds {
                let start = MonotonicClock.now()
                for _ in 0..<count { try body() }
                rounds.append(Double(MonotonicClock.now() - start) / Double(count) / 1_000)
            }
            results.append((name, rounds))
            _ = try writer.writeWithoutTransaction { try $0.checkpoint(.truncate) }
        }

        var next: Int64 = 0
        func insert(_ db: Database) throws {
            next += 1
            let x = next
            try db.executeHot("INSERT INTO t (x, y) VALUES (?, ?)") {
                $0.bind(x)
                $0.bind("0123456789abcdef")
            }
        }
        try time("the writer's queue: writeWithoutTransaction {}") { writer.writeWithoutTransaction { _ in } }
        try time("writeTransaction, empty") { try writer.writeTransaction { _ in } }
        try time("BEGIN IMMEDIATE + COMMIT through SQLite's C API") {
            try writer.writeWithoutTransaction { db in
                try db.executeHot("BEGIN IMMEDIATE TRANSACTION") { _ in }
                try db.executeHot("COMMIT TRANSACTION") { _ in }
            }
        }
        try time("writeTransaction, one hot INSERT") { try writer.writeTransaction(insert) }
        try time("the same + afterNextTransaction") {
            try writer.writeTransaction { db in
                db.afterNextTransaction(onCommit: { _ in }, onRollback: { _ in })
                try insert(db)
            }
        }
        try time("BEGIN + INSERT + COMMIT, all through the C API") {
            try writer.writeWithoutTransaction { db in
                try db.executeHot("BEGIN IMMEDIATE TRANSACTION") { _ in }
                try insert(db)
                try db.executeHot("COMMIT TRANSACTION") { _ in }
            }
        }

        let uid = Identifier.random()
        let request = try Envelope(
            header: EnvelopeHeader(type: SignIn.type, source: "bench"), payload: SignIn(provider: .kakao, subject: "bench-\(uid)")
        ).encoded()
        let event = try Envelope(
            header: EnvelopeHeader(type: SignedIn.type, source: "auth", sequence: 12_345, uid: uid),
            payload: SignedIn(uid: uid, provider: .kakao, isNewAccount: true, sessions: 1)
        ).encoded()
        var requests = EnvelopeReader()
        requests.register(SignIn.self, for: SignIn.type)
        var events = EnvelopeReader()
        events.register(SignedIn.self, for: SignedIn.type)
        try time("read an auth.signIn request (\(request.count) bytes)") { _ = try requests.read(request) }
        try time("read an auth.signedIn event (\(event.count) bytes)") { _ = try events.read(event) }
        try time("write an auth.signIn.reply") {
            _ = try Envelope(
                header: EnvelopeHeader(type: SignIn.replyType, source: "auth", correlationId: uid),
                payload: SignInResult(uid: uid, sessionToken: uid, provider: .kakao, isNewAccount: true)
            ).encoded()
        }
        try time("write an auth.signedIn event") {
            _ = try Envelope(
                header: EnvelopeHeader(type: SignedIn.type, source: "auth", sequence: 12_345, uid: uid),
                payload: SignedIn(uid: uid, provider: .kakao, isNewAccount: true, sessions: 1)
            ).encoded()
        }

        let width = results.map(\.name.count).max() ?? 0
        print("piece".padding(toLength: width, withPad: " ", startingAt: 0) + "   lowest   median  (µs per call)")
        for (name, rounds) in results {
            let sorted = rounds.sorted()
            let cells = [sorted[0], sorted[sorted.count / 2]].map { String(format: "%8.2f", $0) }
            print(name.padding(toLength: width, withPad: " ", startingAt: 0) + " " + cells.joined(separator: " "))
        }
    }
}
