import AuthPostgres
@testable import AuthService
import Foundation
import GRDB
import Messaging
import OnboardingAPI
import ServiceRuntime
import TestSupport
import Testing

@Suite("auth", .timeLimit(.minutes(1)))
struct AuthServiceTests {
    let bus = InProcessBus()
    let rpc = Defaults.authRPC
    let events = Defaults.authEvents

    /// Runs auth (dev mode unless told otherwise) on this test's bus for the length of `body`,
    /// with its store on `database` (`nil`: the SQLite file at `databasePath`, or memory).
    @discardableResult
    func withAuth<Result: Sendable>(
        devMode: Bool = true, databasePath: String? = nil, database: (any AuthDatabase)? = nil,
        identities: (any IdentityVerifier)? = nil, bus: InProcessBus? = nil, _ body: () async throws -> Result
    ) async throws -> Result {
        let bus = bus ?? self.bus
        var configuration = AuthService.Configuration(rpc: rpc, events: events, databasePath: databasePath, devMode: devMode)
        configuration.database = database
        let service = try AuthService(configuration: configuration, bus: bus, logger: quietLogger, identities: identities)
        return try await withRunningService(service, on: bus, answeringAt: rpc, body)
    }

    /// ``withAuth(devMode:databasePath:database:identities:bus:_:)`` on a fresh store of `kind`
    /// (SQLite in memory, or a fresh PostgreSQL schema).
    @discardableResult
    func withAuth<Result: Sendable>(
        _ kind: StoreKind, devMode: Bool = true, _ body: () async throws -> Result
    ) async throws -> Result {
        try await withAuthDatabase(kind, inMemory: true) { database in try await withAuth(devMode: devMode, database: database, body) }
    }

    func signIn(_ provider: Provider, _ subject: String, idToken: String? = nil, on bus: InProcessBus? = nil) async throws -> SignInResult {
        try await (bus ?? self.bus).call(SignIn(provider: provider, subject: subject, idToken: idToken), to: rpc, source: "test")
    }

    func signOut(token: String?) async throws -> AccountResult {
        try await bus.call(SignOut(), to: rpc, source: "test", sessionToken: token)
    }

    func withdraw(token: String?) async throws -> AccountResult {
        try await bus.call(Withdraw(), to: rpc, source: "test", sessionToken: token)
    }

    func verify(_ token: String, on bus: InProcessBus? = nil) async throws -> AccountResult {
        try await (bus ?? self.bus).call(VerifySession(sessionToken: token), to: rpc, source: "test")
    }

    @discardableResult
    func expectError(_ code: ErrorCode, _ body: () async throws -> some Any) async -> ServiceError? {
        let error = await #expect(throws: ServiceError.self) { _ = try await body() }
        #expect(error?.code == code, "\(String(describing: error))")
        return error
    }

    // MARK: Accounts

    @Test("signing in again with the same provider account gives the same uid", arguments: StoreKind.available)
    func sameAccountSameUID(store: StoreKind) async throws {
        try await withAuth(store) {
            let first = try await signIn(.google, "alice")
            let second = try await signIn(.google, "alice")
            #expect(first.uid == second.uid)
            #expect(first.isNewAccount)
            #expect(!second.isNewAccount)
            #expect(first.sessionToken != second.sessionToken)
            #expect(UUID(uuidString: first.uid) != nil && first.uid == first.uid.lowercased())
        }
    }

    @Test("the same subject at a different provider is a different person", arguments: StoreKind.available)
    func differentProviderDifferentUID(store: StoreKind) async throws {
        try await withAuth(store) {
            let google = try await signIn(.google, "12345")
            let kakao = try await signIn(.kakao, "12345")
            #expect(google.uid != kakao.uid)
            #expect(kakao.isNewAccount)
            #expect(kakao.provider == .kakao)
        }
    }

    @Test("a subject is trimmed, so surrounding spaces do not make a second account; a line break is a control character")
    func subjectIsTrimmed() async throws {
        try await withAuth {
            let plain = try await signIn(.apple, "bob")
            let padded = try await signIn(.apple, "  bob ")
            #expect(plain.uid == padded.uid)
            let unicodeSpaces = try await signIn(.apple, "\u{A0}bob\u{2003}")
            #expect(plain.uid == unicodeSpaces.uid)
            // The schema's rule, in every mode: no control character anywhere, at the ends too.
            await expectError(.invalidRequest) { try await signIn(.apple, "bob\n") }
        }
    }

    @Test("an empty or overlong subject is refused as an invalid request", arguments: ["", "   ", String(repeating: "x", count: 257)])
    func badSubject(subject: String) async throws {
        try await withAuth {
            await expectError(.invalidRequest) { try await signIn(.naver, subject) }
            try await bus.waitUntilAnswering(rpc, source: "test")
        }
    }

    @Test(
        "a subject with a control character inside is refused, and names it",
        arguments: ["\u{0}", "a\u{0}b", "x\u{0}", "a\tb", "line\nbreak", "del\u{7F}", "a\u{85}b", "c1\u{9F}end"])
    func controlCharacterInSubject(subject: String) async throws {
        try await withAuth {
            let error = await expectError(.invalidRequest) { try await signIn(.kakao, subject) }
            #expect(error?.message.contains("control character U+") == true, "\(String(describing: error))")
            // Nothing half-done: the account a subject without the character names is new.
            let plain = try await signIn(.kakao, "a")
            #expect(plain.isNewAccount)
        }
    }

    @Test("a session token's secret is 32 random bytes in base64url without padding, after the session's id", arguments: StoreKind.available)
    func tokenFormat(store: StoreKind) async throws {
        try await withAuth(store) {
            let token = try await signIn(.google, "alice").sessionToken
            let secret = token.drop { $0 != "." }.dropFirst()
            #expect(token.prefix { $0 != "." }.allSatisfy { $0.isNumber })
            #expect(secret.count == 43)
            #expect(secret.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") })
        }
    }

    @Test("simultaneous first sign-ins of one account make exactly one account", arguments: StoreKind.available)
    func concurrentFirstSignIns(store: StoreKind) async throws {
        try await withAuthDatabase(store) { database in
            try await withAuth(database: database) {
                let results = try await withThrowingTaskGroup(of: SignInResult.self) { group in
                    for _ in 0..<20 {
                        group.addTask { try await signIn(.apple, "simultaneous") }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
                #expect(Set(results.map(\.uid)).count == 1)
                #expect(results.filter(\.isNewAccount).count == 1)
                #expect(Set(results.map(\.sessionToken)).count == 20)
            }
        }
    }

    @Test("the store keeps only a digest of each session token, and the digest still verifies the session")
    func tokensAreStoredAsDigests() async throws {
        try await withTemporaryDirectory { directory in
            let path = "\(directory)/auth.sqlite"
            let session = try await withAuth(databasePath: path) { try await signIn(.kakao, "digest") }
            let stored = try await DatabaseQueue(path: path).read { db in
                try String.fetchAll(db, sql: "SELECT token FROM session")
            }
            #expect(stored.count == 1)
            #expect(!stored.contains(session.sessionToken), "the token itself is never written")
            #expect(stored.allSatisfy { $0.count == 64 && $0.allSatisfy(\.isHexDigit) })
            // Reopened, the service still knows the session by its digest.
            let verified = try await withAuth(databasePath: path) { try await verify(session.sessionToken) }
            #expect(verified.uid == session.uid)
        }
    }

    @Test("a token's digest is its SHA-256 in lowercase hex, as stored by every earlier version")
    func digestFormat() {
        #expect(SessionToken.digest("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(SessionToken.digest("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    }

    @Test("tokens are base64url without padding, as Foundation's base64 with - and _ and no =")
    func tokenAlphabet() {
        for count in 0...40 {
            let bytes = (0..<count).map { _ in UInt8.random(in: 0...255) }
            let foundation = Data(bytes).base64EncodedString()
                .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                .replacingOccurrences(of: "=", with: "")
            #expect(SessionToken.base64URL(bytes) == foundation, "\(bytes)")
        }
        #expect(SessionToken.makeSecret().count == 43)
    }

    @Test("an unknown provider is refused with a message that names the field")
    func unknownProvider() async throws {
        struct LooseSignIn: Codable, Sendable { var provider: String; var subject: String }
        try await withAuth {
            let envelope = Envelope(header: EnvelopeHeader(type: SignIn.type, source: "test"),
                                    payload: LooseSignIn(provider: "myspace", subject: "tom"))
            let reply = try await bus.request(try OutgoingMessage(envelope), to: rpc, timeout: .seconds(3))
            let error = try #require(reply.serviceError)
            #expect(error.code == .invalidMessage)
            #expect(error.message.contains("provider"))
        }
    }

    // MARK: Identity verification

    @Test("with dev mode off and no provider configured, sign-in is refused with the setting to give")
    func devModeOff() async throws {
        try await withAuth(devMode: false) {
            let error = await expectError(.unauthenticated) { try await signIn(.google, "alice", idToken: "eyJ...") }
            #expect(error?.reason == "providerNotConfigured")
            #expect(error?.message.contains("ONBOARDING_GOOGLE_CLIENT_IDS") == true)
            #expect(error?.message.contains("--auth-dev-mode") == true)
            try await bus.waitUntilAnswering(rpc, source: "test")
        }
    }

    @Test("a given identity verifier decides the subject, even with dev mode off")
    func customVerifier() async throws {
        struct TokenIsSubject: IdentityVerifier {
            func verify(_ request: SignIn) async throws -> String {
                guard let idToken = request.idToken else { throw ServiceError(.unauthenticated, "An ID token is required.") }
                return idToken
            }
        }
        try await withAuth(devMode: false, identities: TokenIsSubject()) {
            let claimed = try await signIn(.google, "whatever", idToken: "verified-sub")
            let same = try await signIn(.google, "something else", idToken: "verified-sub")
            #expect(claimed.uid == same.uid)
            await expectError(.unauthenticated) { try await signIn(.google, "verified-sub") }
        }
    }

    // MARK: Sessions

    @Test("a live session token verifies to its uid", arguments: StoreKind.available)
    func verifyLiveSession(store: StoreKind) async throws {
        try await withAuth(store) {
            let session = try await signIn(.kakao, "mina")
            #expect(try await verify(session.sessionToken).uid == session.uid)
            await expectError(.unauthenticated) { try await verify("not-a-token") }
            await expectError(.unauthenticated) { try await verify("") }
        }
    }

    @Test("signing out ends that session only", arguments: StoreKind.available)
    func signOutInvalidatesToken(store: StoreKind) async throws {
        try await withAuth(store) {
            let phone = try await signIn(.google, "alice")
            let tablet = try await signIn(.google, "alice")
            #expect(try await signOut(token: phone.sessionToken).uid == phone.uid)
            await expectError(.unauthenticated) { try await verify(phone.sessionToken) }
            await expectError(.unauthenticated) { try await withdraw(token: phone.sessionToken) }
            #expect(try await verify(tablet.sessionToken).uid == tablet.uid)
        }
    }

    @Test("withdrawing deletes the account and every session; signing in again makes a new uid", arguments: StoreKind.available)
    func withdrawRemovesAccount(store: StoreKind) async throws {
        try await withAuth(store) {
            let phone = try await signIn(.naver, "jun")
            let tablet = try await signIn(.naver, "jun")
            #expect(try await withdraw(token: phone.sessionToken).uid == phone.uid)
            await expectError(.unauthenticated) { try await verify(phone.sessionToken) }
            await expectError(.unauthenticated) { try await verify(tablet.sessionToken) }
            await expectError(.unauthenticated) { try await withdraw(token: tablet.sessionToken) }
            let again = try await signIn(.naver, "jun")
            #expect(again.uid != phone.uid)
            #expect(again.isNewAccount)
        }
    }

    @Test("signing out or withdrawing without a valid token is unauthenticated", arguments: StoreKind.available, [nil, "", "forged-token", "12.forged"])
    func badTokens(store: StoreKind, token: String?) async throws {
        try await withAuth(store) {
            let session = try await signIn(.google, "alice")
            await expectError(.unauthenticated) { try await signOut(token: token) }
            await expectError(.unauthenticated) { try await withdraw(token: token) }
            #expect(try await verify(session.sessionToken).uid == session.uid)
        }
    }

    // MARK: Events

    @Test("sign-in, sign-out and withdrawal are published in order with growing sequence numbers", arguments: StoreKind.available)
    func events(store: StoreKind) async throws {
        try await withAuth(store) {
            let stream = try await bus.subscribe(to: [events], topics: ["auth."], limits: MessageLimits())
            var received = stream.makeAsyncIterator()

            let first = try await signIn(.google, "alice")
            _ = try await signOut(token: first.sessionToken)
            let second = try await signIn(.google, "alice")
            _ = try await withdraw(token: second.sessionToken)

            var messages: [Message] = []
            for _ in 0..<4 {
                messages.append(try #require(await received.next()))
            }
            #expect(messages.map(\.header.type) == [SignedIn.type, SignedOut.type, SignedIn.type, Withdrawn.type])
            #expect(messages.map(\.topic) == [SignedIn.type, SignedOut.type, SignedIn.type, Withdrawn.type])
            let sequences = messages.map(\.header.sequence)
            #expect(zip(sequences, sequences.dropFirst()).allSatisfy { $0 < $1 })
            #expect(messages.allSatisfy { $0.header.source == ServiceName.auth && $0.header.uid == first.uid })
            #expect(try messages[0].payload(as: SignedIn.self) == SignedIn(uid: first.uid, provider: .google, isNewAccount: true, sessions: 1))
            #expect(try messages[1].payload(as: SignedOut.self) == SignedOut(uid: first.uid, sessions: 0))
            #expect(try messages[2].payload(as: SignedIn.self) == SignedIn(uid: first.uid, provider: .google, isNewAccount: false, sessions: 1))
            #expect(try messages[3].payload(as: Withdrawn.self) == Withdrawn(uid: first.uid))
        }
    }

    @Test("a refused request publishes no event", arguments: StoreKind.available)
    func noEventOnRefusal(store: StoreKind) async throws {
        try await withAuth(store) {
            let stream = try await bus.subscribe(to: [events], topics: [""], limits: MessageLimits())
            var received = stream.makeAsyncIterator()
            await expectError(.unauthenticated) { try await signOut(token: "forged-token") }
            await expectError(.invalidRequest) { try await signIn(.google, " ") }
            let marker = try await signIn(.apple, "marker")
            let next = try #require(await received.next())
            #expect(next.header.type == SignedIn.type)
            #expect(next.header.uid == marker.uid)
        }
    }

    // MARK: Persistence

    @Test("accounts and sessions survive a restart on the same database", arguments: StoreKind.available)
    func persistenceAcrossRestart(store: StoreKind) async throws {
        try await withAuthDatabase(store) { database in
            let before = try await withAuth(database: database) { try await signIn(.apple, "persistent") }

            let restarted = InProcessBus()
            try await withAuth(database: database, bus: restarted) {
                #expect(try await verify(before.sessionToken, on: restarted).uid == before.uid)
                let again = try await signIn(.apple, "persistent", on: restarted)
                #expect(again.uid == before.uid)
                #expect(!again.isNewAccount)
            }
        }
    }
}

/// Runs `body` with a fresh store of `kind`: a SQLite file in a temporary folder (or memory),
/// or a fresh schema of the test PostgreSQL database, dropped afterwards.
func withAuthDatabase<Result: Sendable>(
    _ kind: StoreKind, inMemory: Bool = false, _ body: (any AuthDatabase) async throws -> Result
) async throws -> Result {
    switch kind {
    case .sqlite where inMemory:
        return try await body(SQLiteAuthDatabase(path: nil))
    case .sqlite:
        return try await withTemporaryDirectory { directory in try await body(SQLiteAuthDatabase(path: "\(directory)/auth.sqlite")) }
    case .postgres:
        // Tests run many stores at once on a loaded machine: a small pool each, and time.
        return try await TestPostgres.withSchema { location in
            try await body(AuthPostgresDatabase(location: location, maxConnections: 4, timeout: .seconds(15)))
        }
    }
}
