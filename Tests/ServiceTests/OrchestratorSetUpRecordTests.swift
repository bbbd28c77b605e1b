import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime
import Testing

@testable import OnboardingOrchestrator
import TestSupport

/// The records of set-ups under way, on both stores: what a try may close, and when it may still
/// remove its person's images.
@Suite("The orchestrator's set-up records")
struct OrchestratorSetUpRecordTests {
    @Test(
        "a try is current while it is its person's newest on record; it closes only its own record; settling closes a person's records through one try",
        arguments: StoreKind.available)
    func records(kind: StoreKind) async throws {
        try await withOrchestratorDatabase(kind) { database in
            let bus = InProcessBus()
            let publisher = try await bus.publisher(at: Endpoint("inproc://set-up-records"))
            defer { publisher.close() }
            let logger = Logger(label: "set-up-records") { _ in SwiftLogNoOpLogHandler() }
            let context = OrchestratorStorageContext(publisher: publisher, retention: Outbox.Retention(), logger: logger)
            try await database.withStorage(context) { storage in
                func begun(_ uid: String, _ key: String) async throws -> SetUpRecord {
                    var record = SetUpRecord(uid: uid, idempotencyKey: key, username: "name-\(key)")
                    record.attempt = try await storage.beginSetup(record)
                    return record
                }
                func onRecord() async throws -> Set<SetUpRecord> { Set(try await storage.unfinishedSetups()) }

                let first = try await begun("u", "k1")
                #expect(try await storage.isCurrentSetup(first))
                // The same set-up sent again: a new try, numbered higher, in the same record.
                let again = try await begun("u", "k1")
                #expect(again.attempt > first.attempt)
                #expect(!(try await storage.isCurrentSetup(first)), "an older try of the same set-up")
                #expect(try await storage.isCurrentSetup(again))
                try await storage.endSetup(first)
                #expect(try await onRecord() == [again], "the older try's end leaves the newer try's record")

                // Another set-up of the same person (a new key), and someone else's.
                let other = try await begun("u", "k2")
                let someoneElse = try await begun("v", "k1")
                #expect(!(try await storage.isCurrentSetup(again)), "the person has a newer try")
                #expect(try await storage.isCurrentSetup(other))
                #expect(try await storage.isCurrentSetup(someoneElse))
                #expect(try await onRecord() == [again, other, someoneElse])

                try await storage.endSetups(of: "u", through: again.attempt)
                #expect(try await onRecord() == [other, someoneElse], "only up to the attempt given")
                try await storage.endSetups(of: "u", through: other.attempt)
                #expect(try await onRecord() == [someoneElse], "only that person's")
                #expect(!(try await storage.isCurrentSetup(other)), "a closed record is no try's")
                try await storage.endSetup(someoneElse)
                #expect(try await onRecord().isEmpty)
            }
        }
    }
}
