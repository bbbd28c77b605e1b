import Foundation
import Messaging
import OnboardingAPI
@testable import OnboardingOrchestrator
import Synchronization
import Testing

/// `CheckJoin`, which joins the two answers a "check me now" on the bus's thread may wait for
/// (auth's verdict on the session, and profile's answer asked ahead) and hands them on exactly
/// once: when the last needed one arrives, in either order; at once for a refused session; at
/// once for a verified session when no profile answer was asked for.
@Suite("CheckJoin: the session and the profile asked ahead, handed on once", .timeLimit(.minutes(1)))
struct CheckJoinTests {
    static let refused = ServiceError(.init(rawValue: "invalidSession"), "The session is not valid.")
    static let profileFailed = ServiceError(.timeout, "No reply from profile.")
    static let found = ProfileResult(profile: nil, asOfSequence: 42)

    @Test("session first, then profile: handed on when the profile answers, with both")
    func sessionFirst() throws {
        let join = CheckJoin(expectingProfile: true)
        #expect(join.verified(.success("u1")) == nil, "waits for the profile")
        let ready = try #require(join.profiled(.success(Self.found)))
        #expect(ready.session == .success("u1"))
        #expect(ready.profile == .success(Self.found))
    }

    @Test("profile first, then session: handed on when the session is verified, with both")
    func profileFirst() throws {
        let join = CheckJoin(expectingProfile: true)
        #expect(join.profiled(.success(Self.found)) == nil, "waits for the session")
        let ready = try #require(join.verified(.success("u1")))
        #expect(ready.session == .success("u1"))
        #expect(ready.profile == .success(Self.found))
    }

    @Test("a failed profile answer is handed on as it is, in either order")
    func failedProfile() throws {
        let sessionFirst = CheckJoin(expectingProfile: true)
        #expect(sessionFirst.verified(.success("u1")) == nil)
        let afterProfile = try #require(sessionFirst.profiled(.failure(Self.profileFailed)))
        #expect(afterProfile.profile == .failure(Self.profileFailed))

        let profileFirst = CheckJoin(expectingProfile: true)
        #expect(profileFirst.profiled(.failure(Self.profileFailed)) == nil)
        let afterSession = try #require(profileFirst.verified(.success("u1")))
        #expect(afterSession.session == .success("u1"))
        #expect(afterSession.profile == .failure(Self.profileFailed))
    }

    @Test("a refused session is handed on at once, without waiting for the profile, and the profile's late answer is dropped")
    func refusedSessionDoesNotWait() throws {
        let join = CheckJoin(expectingProfile: true)
        let ready = try #require(join.verified(.failure(Self.refused)))
        #expect(ready.session == .failure(Self.refused))
        #expect(ready.profile == nil)
        #expect(join.profiled(.success(Self.found)) == nil, "already handed on")
    }

    @Test("a refused session after the profile answered is handed on with that answer")
    func refusedSessionAfterProfile() throws {
        let join = CheckJoin(expectingProfile: true)
        #expect(join.profiled(.success(Self.found)) == nil)
        let ready = try #require(join.verified(.failure(Self.refused)))
        #expect(ready.session == .failure(Self.refused))
        #expect(ready.profile == .success(Self.found))
    }

    @Test("with no profile asked for, a verified or refused session is handed on at once")
    func noProfileExpected() throws {
        let verified = CheckJoin(expectingProfile: false)
        let ready = try #require(verified.verified(.success("u1")))
        #expect(ready.session == .success("u1"))
        #expect(ready.profile == nil)

        let refused = CheckJoin(expectingProfile: false)
        let refusal = try #require(refused.verified(.failure(Self.refused)))
        #expect(refusal.session == .failure(Self.refused))
    }

    @Test("answers repeated after the hand-on hand on nothing more")
    func nothingAfterDone() throws {
        let join = CheckJoin(expectingProfile: true)
        #expect(join.verified(.success("u1")) == nil)
        _ = try #require(join.profiled(.success(Self.found)))
        #expect(join.profiled(.success(Self.found)) == nil)
        #expect(join.verified(.success("u2")) == nil)
        #expect(join.verified(.failure(Self.refused)) == nil)

        let single = CheckJoin(expectingProfile: false)
        _ = try #require(single.verified(.success("u1")))
        #expect(single.verified(.success("u1")) == nil)
        #expect(single.profiled(.success(Self.found)) == nil)
    }

    /// Every combination: profile asked or not; session verified or refused; profile answer
    /// found, failed, or (only when not asked) never sent; and either order.
    @Test("in every order and outcome, exactly one call hands on, and it is the first call after which nothing else is needed")
    func everyCombination() throws {
        let sessions: [Result<String, ServiceError>] = [.success("u1"), .failure(Self.refused)]
        let profiles: [Result<ProfileResult, ServiceError>?] = [.success(Self.found), .failure(Self.profileFailed), nil]
        for expecting in [true, false] {
            for session in sessions {
                for profile in profiles {
                    // A profile answer comes only when one was asked for.
                    if expecting != (profile != nil) { continue }
                    for profileFirst in [true, false] {
                        let join = CheckJoin(expectingProfile: expecting)
                        var calls: [(name: String, ready: CheckJoin.Ready?)] = []
                        func callProfile() { if let profile { calls.append(("profile", join.profiled(profile))) } }
                        if profileFirst { callProfile() }
                        calls.append(("session", join.verified(session)))
                        if !profileFirst { callProfile() }

                        let context = "expecting \(expecting), session \(session), profile \(String(describing: profile)), profile first \(profileFirst)"
                        let handedOn = calls.filter { $0.ready != nil }
                        try #require(handedOn.count == 1, "\(context)")
                        let ready = try #require(handedOn[0].ready)
                        #expect(ready.session == session, "\(context)")
                        // The session completes it when it comes last or is refused; otherwise the profile.
                        let refused = if case .failure = session { true } else { false }
                        let completer = !expecting || profileFirst || refused ? "session" : "profile"
                        #expect(handedOn[0].name == completer, "\(context)")
                        let profileKnown = profileFirst || completer == "profile"
                        #expect(ready.profile == (profileKnown ? profile : nil), "\(context)")
                    }
                }
            }
        }
    }

    @Test("the two answers racing on different threads are handed on exactly once, with both")
    func racingAnswers() async throws {
        for round in 0..<500 {
            let join = CheckJoin(expectingProfile: true)
            let uid = "u\(round)"
            let results = await withTaskGroup(of: CheckJoin.Ready?.self) { group in
                group.addTask { join.verified(.success(uid)) }
                group.addTask { join.profiled(.success(Self.found)) }
                var results: [CheckJoin.Ready] = []
                for await ready in group { if let ready { results.append(ready) } }
                return results
            }
            try #require(results.count == 1, "round \(round)")
            #expect(results[0].session == .success(uid))
            #expect(results[0].profile == .success(Self.found))
        }
    }

    @Test("a refused session racing the profile is handed on exactly once")
    func racingRefusal() async throws {
        for round in 0..<500 {
            let join = CheckJoin(expectingProfile: true)
            let results = await withTaskGroup(of: CheckJoin.Ready?.self) { group in
                group.addTask { join.verified(.failure(Self.refused)) }
                group.addTask { join.profiled(.success(Self.found)) }
                var results: [CheckJoin.Ready] = []
                for await ready in group { if let ready { results.append(ready) } }
                return results
            }
            try #require(results.count == 1, "round \(round)")
            #expect(results[0].session == .failure(Self.refused))
            // Whether the profile's answer made it in depends on who ran first; it is never another.
            #expect(results[0].profile == nil || results[0].profile == .success(Self.found))
        }
    }
}
