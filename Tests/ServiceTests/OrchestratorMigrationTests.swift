import Foundation
import GRDB
import OnboardingAPI
@testable import OnboardingOrchestrator
import ServiceRuntime
import Testing

@Suite("The orchestrator's store across versions")
struct OrchestratorMigrationTests {
    @Test("people stored by the previous version are read back the same after person loses its row id")
    func personWithoutRowID() throws {
        let writer = try ServiceDatabase.open(path: nil)
        try OrchestratorStore.migrator().migrate(writer, upTo: "orchestrator-v2-derived")
        try writer.write { db in
            try db.execute(
                sql: """
                    INSERT INTO person (uid, profile, pendingCheck, withdrawn, cleanup, intentId, intent, reason,
                                        intentSequence, intentTime, profileAsOf, owesDismiss, sessions)
                    VALUES ('a', 'absent', NULL, 0, '', 'i-1', 'presentProfileSetup', 'signedIn', 7, '2026-11-23T00:00:00.000Z', 3, 1, 2),
                           ('b', 'unknown', 'checkRequested', 0, '', NULL, NULL, NULL, NULL, NULL, 0, 0, 1),
                           ('c', 'present', NULL, 1, 'deleteProfile', NULL, NULL, NULL, NULL, NULL, 9, 0, 0)
                    """)
        }
        try OrchestratorStore.migrator().migrate(writer)
        try writer.write { db in
            let schema = try String.fetchOne(db, sql: "SELECT sql FROM sqlite_master WHERE name = 'person'") ?? ""
            #expect(schema.contains("WITHOUT ROWID"))
            let a = try #require(try OrchestratorStore.person("a", in: db))
            #expect(a.profile == .absent)
            #expect(a.profileAsOf == 3)
            #expect(a.sessions == 2)
            #expect(a.owesDismiss)
            #expect(a.intent == RouteIntent(intentId: "i-1", uid: "a", intent: .presentProfileSetup, reason: .signedIn))
            let state = try OrchestratorStore.routeState(of: "a", in: db)
            #expect(state.sequence == 7)
            #expect(state.time == "2026-11-23T00:00:00.000Z")
            let working = try OrchestratorStore.peopleWithWork(in: db).map(\.0).sorted()
            #expect(working == ["b", "c"])
            #expect(try OrchestratorStore.person("b", in: db)?.pendingCheck == .checkRequested)
            #expect(try OrchestratorStore.person("c", in: db)?.withdrawn == true)
            #expect(try OrchestratorStore.person("nobody", in: db) == nil)
            let indexes = try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'person' AND sql IS NOT NULL ORDER BY name")
            #expect(indexes == ["person_cleanup", "person_pending"])
        }
    }
}
