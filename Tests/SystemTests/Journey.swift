import Foundation
import ImageFixtures
import Messaging
import OnboardingAPI
import OnboardingClient
import OnboardingTesting
import Synchronization
import Testing

/// Collects the route intents a tap sees, and lets a test wait for one.
///
/// Waiting is event-driven: a waiter (predicate and continuation) is kept until the task that
/// consumes the intents appends a matching one, or until its deadline passes.
final class IntentRecorder: Sendable {
    private final class Log: Sendable {
        private struct Waiter {
            var predicate: @Sendable (RouteIntent) -> Bool
            var continuation: CheckedContinuation<RouteIntent?, Never>
            var timer: Task<Void, Never>
        }

        private struct State {
            var intents: [RouteIntent] = []
            var nextID = 0
            var waiters: [Int: Waiter] = [:]
        }

        private let state = Mutex(State())

        var all: [RouteIntent] { state.withLock { $0.intents } }

        /// Appends `intent` and resumes every waiter it matches.
        func append(_ intent: RouteIntent) {
            let matched = state.withLock { state -> [Waiter] in
                state.intents.append(intent)
                let matched = state.waiters.filter { $0.value.predicate(intent) }
                for id in matched.keys { state.waiters[id] = nil }
                return Array(matched.values)
            }
            for waiter in matched {
                waiter.timer.cancel()
                waiter.continuation.resume(returning: intent)
            }
        }

        /// The first intent matching `predicate`, waiting up to `timeout` for one; nil if none came.
        func first(timeout: Duration, where predicate: @escaping @Sendable (RouteIntent) -> Bool) async -> RouteIntent? {
            await withCheckedContinuation { continuation in
                let found = state.withLock { state -> RouteIntent? in
                    if let match = state.intents.first(where: predicate) { return match }
                    state.nextID += 1
                    let id = state.nextID
                    // Races the consumer: whichever removes the waiter first resumes it.
                    let timer = Task { [self] in
                        try? await Task.sleep(for: timeout)
                        self.state.withLock { $0.waiters.removeValue(forKey: id) }?.continuation.resume(returning: nil)
                    }
                    state.waiters[id] = Waiter(predicate: predicate, continuation: continuation, timer: timer)
                    return nil
                }
                if let found { continuation.resume(returning: found) }
            }
        }
    }

    private let received = Log()
    private let task: Task<Void, Never>

    init(_ intents: RouteIntents) {
        let received = self.received
        task = Task {
            for await intent in intents { received.append(intent.intent) }
        }
    }

    deinit { task.cancel() }

    var all: [RouteIntent] { received.all }

    func intents(for uid: String) -> [RouteIntent] { all.filter { $0.uid == uid } }

    /// Waits until an intent matching `predicate` has arrived, up to `timeout`.
    @discardableResult
    func next(
        timeout: Duration = .seconds(30), sourceLocation: SourceLocation = #_sourceLocation,
        where predicate: @escaping @Sendable (RouteIntent) -> Bool
    ) async -> RouteIntent? {
        if let match = await received.first(timeout: timeout, where: predicate) { return match }
        Issue.record("no matching route intent within \(timeout); saw \(all)", sourceLocation: sourceLocation)
        return nil
    }

    /// Waits until the `count`th intent matching `predicate` has arrived (counting those that
    /// came before the call), up to `timeout`.
    @discardableResult
    func next(
        _ count: Int, timeout: Duration = .seconds(30), sourceLocation: SourceLocation = #_sourceLocation,
        where predicate: @escaping @Sendable (RouteIntent) -> Bool
    ) async -> RouteIntent? {
        // Every intent is shown to the predicate once, in arrival order.
        let matched = Mutex(0)
        return await next(timeout: timeout, sourceLocation: sourceLocation) { intent in
            predicate(intent) && matched.withLock { $0 += 1; return $0 >= count }
        }
    }

    /// Waits until intents reach this recorder along the whole path a sign-in takes: pub/sub
    /// delivers only after a subscription has taken effect (this tap's to the routes, and the
    /// orchestrator's to auth events), so warm-up people sign in until one's sign-in intent arrives.
    func warmUp(with client: OnboardingClient) async throws {
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: .seconds(10))
        while clock.now < deadline {
            let uid = try await client.signIn(provider: .google, subject: "warm-up-\(UUID().uuidString)").uid
            let arrived = await received.first(timeout: .milliseconds(100)) { $0.uid == uid && $0.reason == .signedIn }
            if arrived != nil { return }
        }
        Issue.record("the route topic never delivered a warm-up person's sign-in intent")
    }
}

/// A small, whole PNG (image-upload decodes every image), made by libvips.
let pngBytes = TestImage.halves(.png, width: 48, height: 32)

/// The whole journey of `shared/domain.md`, driven as an app would drive it.
///
/// - Parameter imagesRoot: where image-upload keeps images, to check that withdrawal removed them.
func runJourney(bus: any MessageBus, endpoints: SystemEndpoints, imagesRoot: URL) async throws {
    let tap = IntentRecorder(try await endpoints.client(bus, name: "tap").routeIntents(for: nil))
    try await tap.warmUp(with: endpoints.client(bus, name: "warm-up"))

    let app = endpoints.client(bus, name: "app")
    let subject = "minji-\(UUID().uuidString.prefix(8))"
    let username = "mj\(Int.random(in: 1000...9999))"

    // Signing in for the first time: asked to set up a profile.
    let first = try await app.signIn(provider: .kakao, subject: subject)
    #expect(first.isNewAccount)
    let uid = first.uid
    await tap.next { $0.uid == uid && $0.intent == .presentProfileSetup && $0.reason == .signedIn }

    // "Check me now" answers the same decision directly.
    let status = try await app.checkNow()
    #expect(status == OnboardingStatus(uid: uid, hasProfile: false, intent: .presentProfileSetup))
    #expect(try await app.profile() == nil)

    // Choosing a username and setting up the profile with an image.
    #expect(try await app.checkUsername(username).available)
    let profile = try await app.setUpProfile(username: username, image: pngBytes, contentType: "image/png")
    #expect(profile.uid == uid)
    #expect(profile.username == username)
    let imagePath = try #require(profile.imagePath)
    #expect(FileManager.default.fileExists(atPath: imagesRoot.appendingPathComponent(imagePath).path))
    await tap.next { $0.uid == uid && $0.intent == .dismiss }
    #expect(try await app.profile() == profile)
    #expect(try await app.checkUsername(username.uppercased()).reason == .duplicated)

    // A second set-up is refused; the uploaded image of the refused attempt is removed.
    await #expect(throws: ServiceError.self) {
        _ = try await app.setUpProfile(username: "other\(Int.random(in: 10...99))", image: pngBytes)
    }
    // What stays is the profile's image and its thumbnail, both decoded and re-encoded.
    let images = try FileManager.default.contentsOfDirectory(atPath: imagesRoot.appendingPathComponent(uid).path).sorted()
    let imageName = URL(fileURLWithPath: imagePath).lastPathComponent
    #expect(images == [imageName, imageName.replacingOccurrences(of: ".png", with: ".thumb.png")].sorted())
    // Only their owner can read them.
    #expect(permissionBits(imagesRoot.path) == 0o700)
    #expect(permissionBits(imagesRoot.appendingPathComponent(uid).path) == 0o700)
    #expect(permissionBits(imagesRoot.appendingPathComponent(imagePath).path) == 0o600)
    let stored = try Data(contentsOf: imagesRoot.appendingPathComponent(imagePath))
    #expect(stored != pngBytes)
    #expect(TestImage.decode(stored).map { ($0.width, $0.height) } ?? (0, 0) == (48, 32))

    // Signing out ends the session; the profile stays.
    let token = try #require(app.session?.sessionToken)
    try await app.signOut()
    let stale = OnboardingClient(bus: bus, configuration: app.configuration, session: .init(uid: uid, sessionToken: token, provider: .kakao))
    await expectCode(.unauthenticated) { _ = try await stale.checkNow() }

    // Signing in again: same person, a profile exists, nothing to show.
    let again = try await app.signIn(provider: .kakao, subject: subject)
    #expect(again.uid == uid)
    #expect(!again.isNewAccount)
    #expect(try await app.checkNow() == OnboardingStatus(uid: uid, hasProfile: true, intent: nil))
    #expect(tap.intents(for: uid).filter { $0.intent == .presentProfileSetup }.count == 2)

    // Withdrawing deletes the account, profile, username and images.
    try await app.withdraw()
    let clock = ContinuousClock()
    let deadline = clock.now.advanced(by: .seconds(10))
    var freed = false
    while clock.now < deadline, !freed {
        // The folder holds nothing but the withdrawal's mark, which refuses late uploads.
        let left = (try? FileManager.default.contentsOfDirectory(atPath: imagesRoot.appendingPathComponent(uid).path)) ?? []
        freed = try await app.checkUsername(username).available && left.allSatisfy { $0 == ".withdrawn" }
        if !freed { try await Task.sleep(for: .milliseconds(10)) }
    }
    #expect(freed, "the username and images of a withdrawn person are removed")

    // The same provider account now starts over as a new person.
    let fresh = try await app.signIn(provider: .kakao, subject: subject)
    #expect(fresh.uid != uid)
    #expect(fresh.isNewAccount)
    await tap.next { $0.uid == fresh.uid && $0.intent == .presentProfileSetup }
    #expect(!tap.all.contains { $0.uid == uid && $0.reason == .profileDeleted }, "a withdrawal asks for no set-up")
}

/// Expects `body` to fail with a ``ServiceError`` of `code`.
func expectCode(
    _ code: ErrorCode, reason: String? = nil, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () async throws -> Void
) async {
    do {
        try await body()
        Issue.record("expected \(code), but it succeeded", sourceLocation: sourceLocation)
    } catch let error as ServiceError {
        #expect(error.code == code, "\(error)", sourceLocation: sourceLocation)
        if let reason { #expect(error.reason == reason, "\(error)", sourceLocation: sourceLocation) }
    } catch {
        Issue.record("expected \(code), got \(error)", sourceLocation: sourceLocation)
    }
}

/// The permission bits of `path` (a symbolic link itself, not what it points to), or `nil`.
func permissionBits(_ path: String) -> Int? {
    guard let attributes = try? FileManager.default.attributesOfItem(atPath: path),
        let permissions = attributes[.posixPermissions] as? Int
    else { return nil }
    return permissions & 0o777
}
