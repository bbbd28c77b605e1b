import Messaging
import OnboardingAPI
import Tracing

/// The services' events as the machine's inputs, committed together with the cursor of the
/// feed they came from.
extension Engine {
    /// Reads the events the engine handles in one pass, payload included.
    static let eventReader: EnvelopeReader = {
        var reader = EnvelopeReader()
        reader.register(SignedIn.self, for: SignedIn.type)
        reader.register(SignedOut.self, for: SignedOut.type)
        reader.register(Withdrawn.self, for: Withdrawn.type)
        reader.register(ProfileCreated.self, for: ProfileCreated.type)
        reader.register(ProfileUpdated.self, for: ProfileUpdated.type)
        reader.register(ProfileDeleted.self, for: ProfileDeleted.type)
        return reader
    }()

    /// An ``EventFeed`` handler: the events' inputs and the feed's new cursor commit together.
    func handle(_ events: [Message], from publisher: String, through sequence: UInt64) async throws {
        let (inputs, spans) = inputs(from: events)
        try await withCheckedThrowingContinuation { continuation in
            enqueue(Submission(inputs: inputs, cursor: (publisher, sequence), committed: continuation, spans: spans))
        }
    }

    /// The hot path's ``EventFeed`` handler on SQLite, on the bus's own thread: live events that
    /// follow the cursor commit with it at once, and their intents are published after the commit.
    func handleOnLoop(_ events: [Message], from publisher: String, through sequence: UInt64, in sqlite: SQLiteOrchestratorStorage)
        throws
    {
        let (inputs, spans) = inputs(from: events)
        try commitNow([Submission(inputs: inputs, cursor: (publisher, sequence), spans: spans)], in: sqlite)
    }

    /// The events' inputs, and the spans of those that continue a trace.
    private func inputs(from events: [Message]) -> ([OnboardingStateMachine.Input], [any Tracing.Span]) {
        var inputs: [OnboardingStateMachine.Input] = []
        var spans: [any Tracing.Span] = []
        inputs.reserveCapacity(events.count)
        for event in events {
            do {
                switch event.header.type {
                case SignedIn.type:
                    let signedIn = try event.payload(as: SignedIn.self)
                    figures.signedIn(signedIn.uid, at: event.header.time)
                    if let span = traces.received(event, about: signedIn.uid) { spans.append(span) }
                    inputs.append(.signedIn(uid: signedIn.uid, isNewAccount: signedIn.isNewAccount, sessions: signedIn.sessions))
                case SignedOut.type:
                    let signedOut = try event.payload(as: SignedOut.self)
                    inputs.append(.signedOut(uid: signedOut.uid, sessions: signedOut.sessions))
                case Withdrawn.type: inputs.append(.withdrawn(uid: try event.payload(as: Withdrawn.self).uid))
                // Profile events are ordered by their own sequence, not by when they arrive.
                case ProfileCreated.type:
                    let uid = try event.payload(as: ProfileCreated.self).profile.uid
                    inputs.append(.profileCreated(uid: uid, asOf: event.header.sequence))
                case ProfileUpdated.type:
                    let uid = try event.payload(as: ProfileUpdated.self).profile.uid
                    inputs.append(.profileUpdated(uid: uid, asOf: event.header.sequence))
                case ProfileDeleted.type:
                    let deleted = try event.payload(as: ProfileDeleted.self)
                    inputs.append(.profileDeleted(uid: deleted.uid, reason: deleted.reason, asOf: event.header.sequence))
                default: break
                }
            } catch {
                logger.warning("ignored an unreadable \(event.header.type) event from \(event.header.source): \(error)")
            }
        }
        return (inputs, spans)
    }
}
