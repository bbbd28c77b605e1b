import Crypto
import Foundation
import Hummingbird
import Logging
import NIOCore
import OnboardingAPI
import Synchronization

/// Google, Apple, Kakao and Naver as one small HTTP server on loopback, for tests and for trying
/// auth's production mode on a laptop. Never reachable from anywhere but this machine.
///
/// It serves, per provider (`google`, `apple`, `kakao`, `naver`):
/// - `GET /<provider>/jwks`: the key set (RS256 keys it made), with `Cache-Control: max-age`;
///   503 while made unavailable (``setKeySetAvailable(_:_:)``);
/// - `GET /naver/v1/nid/me`: Naver's profile API. A bearer token of the form
///   `fake-naver-<id>` (``naverAccessToken(for:)``) answers `response.id` = `<id>`; any other, or
///   one revoked with ``revokeNaverToken(_:)``, the 401 `024` Naver sends;
/// - the revoke and unlink endpoints (`POST /apple/auth/revoke`, `POST /kakao/v1/user/unlink`,
///   `POST /naver/oauth2.0/token`, `POST /google/revoke`): 200, or the failures set with
///   ``failNext(_:times:status:)``;
/// - `POST /apple/auth/token`: Apple's exchange of an authorization code
///   (`grant_type=authorization_code`) for tokens; the refresh token is
///   ``appleRefreshToken(forCode:)``. A code is good once (a second use is 400 `invalid_grant`,
///   as at Apple); failures set with ``failNext(_:times:status:)`` apply too;
///
/// and records every request (``requests(path:)``, ``waitForRequests(path:count:)``). Tokens come from ``mintIDToken(_:subject:audience:nonce:issuedAt:lifetime:issuer:)``.
///
/// Thread safety: every method may be called from any task while the server runs.
public final class FakeIdentityProvider: Sendable {
    /// A request the fake answered.
    public struct RecordedRequest: Sendable, Hashable {
        public var method: String
        public var path: String
        public var authorization: String?
        public var body: String
    }

    /// The audience tokens are minted for unless told otherwise: `fake-<provider>-client`.
    public static func defaultClientID(_ provider: Provider) -> String { "fake-\(provider.rawValue)-client" }

    /// The real issuer of each OpenID Connect provider, which minted tokens carry.
    public static func issuer(_ provider: Provider) -> String {
        switch provider {
        case .google: "https://accounts.google.com"
        case .apple: "https://appleid.apple.com"
        case .kakao: "https://kauth.kakao.com"
        case .naver: "https://nid.naver.com"
        }
    }

    public static let oidcProviders: [Provider] = [.google, .apple, .kakao]
    public static let revokePaths = ["/apple/auth/revoke", "/kakao/v1/user/unlink", "/naver/oauth2.0/token", "/google/revoke"]
    public static let appleTokenPath = "/apple/auth/token"

    private struct State {
        /// Published keys per provider; the last one signs.
        var keys: [Provider: [FakeSigningKey]]
        var unavailable: Set<Provider> = []
        var maxAge = 3600
        var requests: [RecordedRequest] = []
        var revokedNaverTokens: Set<String> = []
        var failures: [String: (times: Int, status: Int)] = [:]
        var rotations = 0
        var usedAppleCodes: Set<String> = []
        var waiters: [(path: String, count: Int, continuation: CheckedContinuation<[RecordedRequest], Never>)] = []
    }
    private let state: Mutex<State>

    private init(keys: [Provider: [FakeSigningKey]]) {
        state = Mutex(State(keys: keys))
    }

    /// A fake with one key per OpenID Connect provider. Every fake of a process starts with the
    /// same keys, made once: a 2048-bit RSA key takes a good part of a second of one core in a
    /// debug build, and a test run makes dozens of fakes at once. ``rotateKey(_:keepingOld:)``
    /// makes new ones.
    public static func make() async throws -> FakeIdentityProvider {
        FakeIdentityProvider(keys: try await firstKeys.value)
    }

    private static let firstKeys = Task { () throws -> [Provider: [FakeSigningKey]] in
        var keys: [Provider: [FakeSigningKey]] = [:]
        for provider in oidcProviders {
            keys[provider] = [try await FakeSigningKey.generate(id: "\(provider.rawValue)-key-1")]
        }
        return keys
    }

    /// A fake whose keys live in `file` (JSON: provider → the signing key's id and PEM), made
    /// there first if it does not exist, so that `onboarding-fake-provider token` in another
    /// process signs with the keys `serve` publishes. The file is written 0600.
    public static func make(keyFile: URL) async throws -> FakeIdentityProvider {
        if let data = try? Data(contentsOf: keyFile) {
            let stored = try JSONDecoder().decode([String: StoredKey].self, from: data)
            var keys: [Provider: [FakeSigningKey]] = [:]
            for (name, key) in stored {
                guard let provider = Provider(rawValue: name) else { continue }
                keys[provider] = [try await FakeSigningKey.load(id: key.id, privateKeyPEM: key.pem)]
            }
            return FakeIdentityProvider(keys: keys)
        }
        let fake = try await make()
        var stored: [String: StoredKey] = [:]
        for provider in oidcProviders {
            guard let key = fake.signingKey(provider) else { continue }
            stored[provider.rawValue] = StoredKey(id: key.id, pem: key.privateKeyPEM)
        }
        try FileManager.default.createDirectory(at: keyFile.deletingLastPathComponent(), withIntermediateDirectories: true)
        try JSONEncoder().encode(stored).write(to: keyFile)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: keyFile.path)
        return fake
    }

    private struct StoredKey: Codable {
        var id: String
        var pem: String
    }

    // MARK: Keys and tokens

    /// The key that signs `provider`'s tokens now.
    public func signingKey(_ provider: Provider) -> FakeSigningKey? { state.withLock { $0.keys[provider]?.last } }

    /// Makes a new signing key for `provider` and publishes it; the old ones stay published when
    /// `keepingOld`, else are withdrawn. Returns the new key's id.
    @discardableResult
    public func rotateKey(_ provider: Provider, keepingOld: Bool = false) async throws -> String {
        let number = state.withLock { state -> Int in
            state.rotations += 1
            return state.rotations + 1
        }
        let key = try await FakeSigningKey.generate(id: "\(provider.rawValue)-key-\(number)")
        state.withLock { state in
            state.keys[provider] = (keepingOld ? state.keys[provider] ?? [] : []) + [key]
        }
        return key.id
    }

    /// A signed ID token with the claims a real provider sets. Apple's `nonce` is SHA-256 (hex)
    /// of `nonce`, as Apple does; the others carry it as given.
    public func mintIDToken(
        _ provider: Provider, subject: String, audience: String? = nil, nonce: String? = nil,
        issuedAt: Date = Date(), lifetime: TimeInterval = 3600, issuer: String? = nil
    ) throws -> String {
        guard let key = signingKey(provider) else { throw FakeProviderError("\(provider.rawValue) issues no ID tokens") }
        return try FakeJWT.sign(
            payload: Self.claims(
                provider, subject: subject, audience: audience, nonce: nonce, issuedAt: issuedAt, lifetime: lifetime,
                issuer: issuer),
            with: key)
    }

    /// The claims of a token, for tests that build a broken one by hand.
    public static func claims(
        _ provider: Provider, subject: String, audience: String? = nil, nonce: String? = nil,
        issuedAt: Date = Date(), lifetime: TimeInterval = 3600, issuer: String? = nil
    ) -> [String: Any] {
        var claims: [String: Any] = [
            "iss": issuer ?? Self.issuer(provider), "sub": subject, "aud": audience ?? defaultClientID(provider),
            "iat": Int(issuedAt.timeIntervalSince1970), "exp": Int(issuedAt.addingTimeInterval(lifetime).timeIntervalSince1970),
        ]
        if let nonce { claims["nonce"] = provider == .apple ? FakeJWT.sha256Hex(nonce) : nonce }
        return claims
    }

    /// A Naver access token this fake's profile API answers with `id`.
    public func naverAccessToken(for id: String) -> String { "fake-naver-\(id)" }
    public static func naverAccessToken(for id: String) -> String { "fake-naver-\(id)" }

    /// A new P-256 private key in PEM, as in the `.p8` file Apple gives developers: what the
    /// Apple unlink settings of a test, or of a laptop trying it, need.
    public static func makeAppleDeveloperKeyPEM() -> String { P256.Signing.PrivateKey().pemRepresentation }

    /// The refresh token Apple's token endpoint gives for an authorization code.
    public static func appleRefreshToken(forCode code: String) -> String { "fake-apple-refresh-\(code)" }

    /// From now on the profile API refuses `token` (401, `024`).
    public func revokeNaverToken(_ token: String) { state.withLock { _ = $0.revokedNaverTokens.insert(token) } }

    // MARK: Faults

    /// While `false`, `GET /<provider>/jwks` answers 503.
    public func setKeySetAvailable(_ provider: Provider, _ available: Bool) {
        state.withLock { state in
            if available { state.unavailable.remove(provider) } else { state.unavailable.insert(provider) }
        }
    }

    /// The key sets' `Cache-Control: max-age` (3600 s).
    public func setKeySetMaxAge(_ seconds: Int) { state.withLock { $0.maxAge = seconds } }

    /// The next `times` requests to `path` answer `status` (for the revoke endpoints and Naver's
    /// profile API).
    public func failNext(_ path: String, times: Int, status: Int = 500) {
        state.withLock { $0.failures[path] = (times, status) }
    }

    /// The requests answered so far, to `path` only when given.
    public func requests(path: String? = nil) -> [RecordedRequest] {
        state.withLock { state in state.requests.filter { path == nil || $0.path == path } }
    }

    /// Waits until `count` requests to `path` have come (at once if they have), and returns them.
    /// Bound the wait with the test's time limit.
    public func waitForRequests(path: String, count: Int = 1) async -> [RecordedRequest] {
        await withCheckedContinuation { continuation in
            let seen = state.withLock { state -> [RecordedRequest]? in
                let seen = state.requests.filter { $0.path == path }
                if seen.count >= count { return seen }
                state.waiters.append((path, count, continuation))
                return nil
            }
            if let seen { continuation.resume(returning: seen) }
        }
    }

    // MARK: Serving

    /// Serves on `host`:`port` (0: any free port) until cancelled; `onReady` gets the port.
    public func run(
        host: String = "127.0.0.1", port: Int = 0, logger: Logger = FakeIdentityProvider.quietLogger,
        onReady: @escaping @Sendable (Int) async -> Void = { _ in }
    ) async throws {
        let app = Application(
            router: makeRouter(),
            configuration: .init(address: .hostname(host, port: port), serverName: nil),
            onServerRunning: { channel in await onReady(channel.localAddress?.port ?? port) },
            logger: logger)
        try await app.run()
    }

    /// Runs the fake while `body` runs; `body` gets its base URL (`http://127.0.0.1:<port>`).
    public func withRunning<T>(_ body: (String) async throws -> T) async throws -> T {
        let (ports, continuation) = AsyncStream<Int>.makeStream()
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                defer { continuation.finish() }
                try await self.run { port in continuation.yield(port) }
            }
            var iterator = ports.makeAsyncIterator()
            guard let port = await iterator.next() else {
                try await group.waitForAll()
                throw FakeProviderError("the fake provider stopped before it listened")
            }
            defer { group.cancelAll() }
            return try await body("http://127.0.0.1:\(port)")
        }
    }

    /// The URL of `provider`'s key set, under `base`.
    public static func jwksURL(_ provider: Provider, base: String) -> String { "\(base)/\(provider.rawValue)/jwks" }
    public static func naverProfileURL(base: String) -> String { "\(base)/naver/v1/nid/me" }

    public static let quietLogger: Logger = {
        var logger = Logger(label: "fake-identity-provider")
        logger.logLevel = .critical
        return logger
    }()

    private func record(_ request: Request, body: String) -> (times: Int, status: Int)? {
        let (failure, ready) = state.withLock { state in
            state.requests.append(
                RecordedRequest(
                    method: request.method.rawValue, path: request.uri.path,
                    authorization: request.headers[.authorization], body: body))
            let seen = state.requests.filter { $0.path == request.uri.path }
            let ready = state.waiters.filter { $0.path == request.uri.path && seen.count >= $0.count }
            state.waiters.removeAll { $0.path == request.uri.path && seen.count >= $0.count }
            guard var failure = state.failures[request.uri.path], failure.times > 0 else {
                return (nil as (times: Int, status: Int)?, ready.map { ($0.continuation, seen) })
            }
            failure.times -= 1
            state.failures[request.uri.path] = failure
            return (failure, ready.map { ($0.continuation, seen) })
        }
        for (continuation, seen) in ready { continuation.resume(returning: seen) }
        return failure
    }

    private func makeRouter() -> Router<BasicRequestContext> {
        let router = Router()
        // One route per provider: the router prefers a fixed path segment ("google" of
        // "/google/revoke") over a parameter, so "/:provider/jwks" would not be reached.
        for provider in Self.oidcProviders {
            router.get(RouterPath("/\(provider.rawValue)/jwks")) { request, _ -> Response in
                self.keySet(provider, request)
            }
        }
        router.get("/naver/v1/nid/me") { request, _ -> Response in
            if let failure = self.record(request, body: "") {
                return Self.json(["resultcode": "500", "message": "fake failure"], status: .init(code: failure.status))
            }
            let authorization = request.headers[.authorization] ?? ""
            let token = authorization.hasPrefix("Bearer ") ? String(authorization.dropFirst(7)) : ""
            let revoked = self.state.withLock { $0.revokedNaverTokens.contains(token) }
            guard token.hasPrefix("fake-naver-"), token.count > 11, !revoked else {
                return Self.json(["resultcode": "024", "message": "Authentication failed / 인증에 실패했습니다."], status: .unauthorized)
            }
            let id = String(token.dropFirst(11))
            return Self.json(["resultcode": "00", "message": "success", "response": ["id": id]])
        }
        for path in Self.revokePaths {
            router.post(RouterPath(path)) { request, _ -> Response in
                let body = try await request.body.collect(upTo: 1 << 16)
                if let failure = self.record(request, body: String(buffer: body)) {
                    return Self.json(["error": "fake failure"], status: .init(code: failure.status))
                }
                return Self.json([:])
            }
        }
        router.post(RouterPath(Self.appleTokenPath)) { request, _ -> Response in
            let body = String(buffer: try await request.body.collect(upTo: 1 << 16))
            if let failure = self.record(request, body: body) {
                return Self.json(["error": "fake failure"], status: .init(code: failure.status))
            }
            return self.exchangeAppleCode(form: body)
        }
        return router
    }

    private func exchangeAppleCode(form: String) -> Response {
        var fields: [String: String] = [:]
        for pair in form.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map { String($0).removingPercentEncoding ?? String($0) }
            if parts.count == 2 { fields[parts[0]] = parts[1] }
        }
        guard fields["grant_type"] == "authorization_code", let code = fields["code"], !code.isEmpty,
            fields["client_secret"]?.split(separator: ".").count == 3, fields["client_id"]?.isEmpty == false
        else {
            return Self.json(["error": "invalid_request"], status: .badRequest)
        }
        let fresh = state.withLock { $0.usedAppleCodes.insert(code).inserted }
        guard fresh else { return Self.json(["error": "invalid_grant"], status: .badRequest) }
        return Self.json([
            "access_token": "fake-apple-access-\(code)", "token_type": "Bearer", "expires_in": 3600,
            "refresh_token": Self.appleRefreshToken(forCode: code),
        ])
    }

    private func keySet(_ provider: Provider, _ request: Request) -> Response {
        _ = record(request, body: "")
        let (keys, down, maxAge) = state.withLock { ($0.keys[provider] ?? [], $0.unavailable.contains(provider), $0.maxAge) }
        if down { return Self.json(["error": "unavailable"], status: .serviceUnavailable) }
        var response = Self.json(["keys": keys.map(\.publicJWK)])
        response.headers[.cacheControl] = "public, max-age=\(maxAge)"
        return response
    }

    private static func json(_ object: [String: Any], status: HTTPResponse.Status = .ok) -> Response {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
        return Response(
            status: status, headers: [.contentType: "application/json"],
            body: ResponseBody(byteBuffer: ByteBuffer(bytes: data)))
    }
}

/// The fake provider could not do what it was asked.
public struct FakeProviderError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

extension FakeJWT {
    /// SHA-256 of the UTF-8 bytes, lowercase hex (Apple's `nonce` claim).
    public static func sha256Hex(_ text: String) -> String {
        SHA256Hex.of(text)
    }
}
