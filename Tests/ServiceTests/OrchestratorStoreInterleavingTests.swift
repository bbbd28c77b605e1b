import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import PropertyBased
import ServiceRuntime
import Testing

@testable import OnboardingOrchestrator

/// The orchestrator's commit over random inputs for a few people, cut into transactions at
/// random: a person's row (written once per transaction) must always name the intent last put in
/// the route outbox for them, with that row's route sequence; and a "check me now" that carries
/// its profile answer (asked ahead) does not ask profile again.
@Suite("The orchestrator's store over random batches")
struct OrchestratorStoreInterleavingTests {
    static let people = ["p0", "p1", "p2"]
    /// Step kinds: 0 sign in, 1 sign out, 2 profile created, 3 profile deleted, 4 withdrawn,
    /// 5 "check me now" with the profile answer asked ahead, 6 commit what is batched; the rest
    /// of the code picks the person.
    static let kinds = 7
    static let steps = Gen.int(in: 0...(kinds * people.count - 1)).array(of: 1...80)

    @Test("a person's row names the intent last put in the route outbox for them, with its sequence; an answer asked ahead is used")
    func rowMatchesRouteOutbox() async throws {
        await propertyCheck(count: 150, input: Self.steps) { steps in
            let problems = try await Self.run(steps)
            #expect(problems.isEmpty, "\(problems) after steps \(steps)")
        }
    }

    static func run(_ steps: [Int]) async throws -> [String] {
        let bus = InProcessBus()
        let publisher = try await bus.publisher(at: Endpoint("inproc://routes"))
        defer { publisher.close() }
        let database = try OrchestratorStore.openDatabase(path: nil)
        let (_, work) = AsyncStream.makeStream(of: Work.self)
        var logger = Logger(label: "store-interleaving")
        logger.logLevel = .critical
        let storage = SQLiteOrchestratorStorage(
            database: database, outbox: Outbox(source: ServiceName.orchestrator, publisher: publisher), logger: logger)
        let engine = try Engine(
            configuration: OnboardingOrchestrator.Configuration(), bus: bus, storage: storage, logger: logger, work: work)

        var sessions: [String: Int] = [:]
        var withdrawn: Set<String> = []
        var profileSequence: UInt64 = 0
        var hasProfile: Set<String> = []
        var waiter: OnboardingStateMachine.WaiterID = 0
        var batch: [Engine.Submission] = []
        var problems: [String] = []

        func commit() throws {
            guard !batch.isEmpty else { return }
            let submissions = batch
            batch = []
            let actions = try engine.decide(submissions, in: storage)
            // People whose only inputs in this transaction are checks that carry their answer
            // (another input, a returning sign-in say, may start a check of its own).
            let others = Set(submissions.filter(\.profiles.isEmpty).flatMap { $0.inputs.map(\.uid) })
            let answeredAhead = Set(submissions.flatMap(\.profiles.keys)).subtracting(others)
            for case .checkProfile(let uid, _) in actions where answeredAhead.contains(uid) {
                problems.append("\(uid): profile asked again although its answer came with the check")
            }
            problems += try database.read(Self.check)
        }

        for code in steps {
            let uid = people[(code / kinds) % people.count]
            let input: OnboardingStateMachine.Input
            switch code % kinds {
            case 0:
                guard !withdrawn.contains(uid) else { continue }
                let isNew = sessions[uid] == nil
                sessions[uid, default: 0] += 1
                input = .signedIn(uid: uid, isNewAccount: isNew, sessions: sessions[uid])
            case 1:
                guard let count = sessions[uid], count > 0, !withdrawn.contains(uid) else { continue }
                sessions[uid] = count - 1
                input = .signedOut(uid: uid, sessions: count - 1)
            case 2:
                profileSequence += 1
                hasProfile.insert(uid)
                input = .profileCreated(uid: uid, asOf: profileSequence)
            case 3:
                profileSequence += 1
                hasProfile.remove(uid)
                input = .profileDeleted(uid: uid, reason: .request, asOf: profileSequence)
            case 4:
                guard sessions[uid] != nil, withdrawn.insert(uid).inserted else { continue }
                input = .withdrawn(uid: uid)
            case 5:
                guard !withdrawn.contains(uid) else { continue }
                waiter += 1
                let profile = hasProfile.contains(uid)
                    ? Profile(uid: uid, username: "name", imagePath: nil, createdAt: "t", updatedAt: "t") : nil
                var submission = Engine.Submission(inputs: [.checkRequested(uid: uid, waiter: waiter)])
                submission.profiles[uid] = ProfileResult(profile: profile, asOfSequence: profileSequence)
                batch.append(submission)
                continue
            default:
                try commit()
                continue
            }
            batch.append(Engine.Submission(inputs: [input]))
        }
        try commit()
        return problems
    }

    /// What is wrong between the person rows and the route outbox.
    static func check(_ db: Database) throws -> [String] {
        var problems: [String] = []
        for row in try Row.fetchAll(db, sql: "SELECT uid, intentId, intent, intentSequence FROM person") {
            let uid: String = row["uid"]
            guard let intentId: String = row["intentId"] else { continue }
            guard
                let last = try Row.fetchOne(
                    db, sql: "SELECT sequence, envelope FROM outbox WHERE uid = ? ORDER BY sequence DESC LIMIT 1", arguments: [uid])
            else {
                problems.append("\(uid): intent \(intentId) in force, none in the route outbox")
                continue
            }
            let envelope = try WireFormat.decoder().decode(Envelope<RouteIntent>.self, from: last["envelope"] as Data)
            if envelope.payload.intentId != intentId || envelope.payload.intent.rawValue != (row["intent"] as String?) {
                problems.append("\(uid): row says \(intentId), the outbox's last is \(envelope.payload.intentId)")
            }
            if (row["intentSequence"] as Int64?) != (last["sequence"] as Int64) {
                problems.append("\(uid): row's route sequence \(String(describing: row["intentSequence"] as Int64?)), the outbox's \(last["sequence"] as Int64)")
            }
        }
        return problems
    }
}
