import Foundation
import JWTKit
import OnboardingAPI

// Unlinking an account at its provider after a withdrawal (issue 9, item 5): the requests each
// provider takes and how to read its answers. Auth's durable queue (`UnlinkWorker` in
// AuthService) sends them.

/// The credentials and endpoints for unlinking at each provider. A provider left `nil` is
/// skipped: its unlink jobs are dropped, with one log line per provider per process.
public struct UnlinkSettings: Sendable, Hashable {
    /// Sign in with Apple: `POST /auth/revoke` with a refresh token, authenticated by a
    /// `client_secret` that is an ES256 JWT signed with the developer's key.
    public struct Apple: Sendable, Hashable {
        public var teamID: String
        public var keyID: String
        /// The developer's P-256 private key (the `.p8` file's PEM).
        public var privateKeyPEM: String
        public var clientID: String
        public var revokeURL: String
        /// Where a sign-in's authorization code is exchanged for the refresh token that revoking
        /// needs (`POST /auth/token`, `grant_type=authorization_code`).
        public var tokenURL: String

        public init(
            teamID: String, keyID: String, privateKeyPEM: String, clientID: String,
            revokeURL: String = "https://appleid.apple.com/auth/revoke",
            tokenURL: String = "https://appleid.apple.com/auth/token"
        ) {
            self.teamID = teamID
            self.keyID = keyID
            self.privateKeyPEM = privateKeyPEM
            self.clientID = clientID
            self.revokeURL = revokeURL
            self.tokenURL = tokenURL
        }
    }

    /// Kakao: `POST /v1/user/unlink` with the app's admin key, naming the user by id.
    public struct Kakao: Sendable, Hashable {
        public var adminKey: String
        public var unlinkURL: String

        public init(adminKey: String, unlinkURL: String = "https://kapi.kakao.com/v1/user/unlink") {
            self.adminKey = adminKey
            self.unlinkURL = unlinkURL
        }
    }

    /// Naver: `POST /oauth2.0/token` with `grant_type=delete` and an access token.
    public struct Naver: Sendable, Hashable {
        public var clientID: String
        public var clientSecret: String
        public var tokenURL: String

        public init(clientID: String, clientSecret: String, tokenURL: String = "https://nid.naver.com/oauth2.0/token") {
            self.clientID = clientID
            self.clientSecret = clientSecret
            self.tokenURL = tokenURL
        }
    }

    /// Google: `POST /revoke` with an OAuth token (no app credentials needed).
    public struct Google: Sendable, Hashable {
        public var revokeURL: String
        public init(revokeURL: String = "https://oauth2.googleapis.com/revoke") { self.revokeURL = revokeURL }
    }

    public var apple: Apple?
    public var kakao: Kakao?
    public var naver: Naver?
    public var google: Google?

    public init(apple: Apple? = nil, kakao: Kakao? = nil, naver: Naver? = nil, google: Google? = nil) {
        self.apple = apple
        self.kakao = kakao
        self.naver = naver
        self.google = google
    }

    /// Whether `provider` has what unlinking there takes.
    public func isConfigured(_ provider: Provider) -> Bool {
        switch provider {
        case .apple: apple != nil
        case .kakao: kakao != nil
        case .naver: naver != nil
        case .google: google != nil
        }
    }
}

/// One unlink call: a form `POST`.
public struct UnlinkRequest: Sendable, Hashable {
    public var provider: Provider
    public var url: String
    public var headers: [String: String]
    /// The form fields, in order (`application/x-www-form-urlencoded`).
    public var form: [FormField]

    public struct FormField: Sendable, Hashable {
        public var name: String
        public var value: String
        public init(_ name: String, _ value: String) {
            self.name = name
            self.value = value
        }
    }

    /// The form, URL-encoded.
    public var body: String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        func encode(_ text: String) -> String { text.addingPercentEncoding(withAllowedCharacters: allowed) ?? "" }
        return form.map { "\(encode($0.name))=\(encode($0.value))" }.joined(separator: "&")
    }

    /// Apple: revoke the refresh token that the sign-in's authorization code was exchanged for.
    public static func apple(refreshToken: String, clientSecret: String, settings: UnlinkSettings.Apple) -> UnlinkRequest {
        UnlinkRequest(
            provider: .apple, url: settings.revokeURL, headers: [:],
            form: [
                .init("client_id", settings.clientID), .init("client_secret", clientSecret), .init("token", refreshToken),
                .init("token_type_hint", "refresh_token"),
            ])
    }

    /// Kakao: unlink the user with Kakao's id `subject` (the ID token's `sub`).
    public static func kakao(subject: String, settings: UnlinkSettings.Kakao) -> UnlinkRequest {
        UnlinkRequest(
            provider: .kakao, url: settings.unlinkURL, headers: ["Authorization": "KakaoAK \(settings.adminKey)"],
            form: [.init("target_id_type", "user_id"), .init("target_id", subject)])
    }

    /// Naver: delete the grant the access token belongs to.
    public static func naver(accessToken: String, settings: UnlinkSettings.Naver) -> UnlinkRequest {
        UnlinkRequest(
            provider: .naver, url: settings.tokenURL, headers: [:],
            form: [
                .init("grant_type", "delete"), .init("client_id", settings.clientID),
                .init("client_secret", settings.clientSecret), .init("access_token", accessToken),
                .init("service_provider", "NAVER"),
            ])
    }

    /// Google: revoke an OAuth token (access or refresh) of the app.
    public static func google(token: String, settings: UnlinkSettings.Google) -> UnlinkRequest {
        UnlinkRequest(provider: .google, url: settings.revokeURL, headers: [:], form: [.init("token", token)])
    }
}

/// What an unlink answer means for the durable work that sends it.
public enum UnlinkOutcome: Sendable, Hashable {
    /// Unlinked (or there was nothing left to unlink): the work is done.
    case done
    /// The provider could not do it now (5xx, 429, no answer): try again after a backoff.
    case retryLater(String)
    /// The provider refuses it for good (bad credentials, a malformed request): stop, and log.
    case refused(String)

    /// Reads a provider's answer to an ``UnlinkRequest``: a pure decision.
    ///
    /// - 2xx is done, except a Naver body with `error` (Naver answers its errors with 200).
    /// - Kakao `-101` (the user is not linked to the app) and Google `invalid_token` (already
    ///   revoked or expired) are done: nothing is left to unlink.
    /// - 408, 429 and 5xx are worth retrying; any other 4xx is refused.
    public static func classify(_ provider: Provider, status: Int, body: Data) -> UnlinkOutcome {
        let json = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any]
        let error = (json?["error"] as? String) ?? (json?["msg"] as? String) ?? ""
        let code = error.isEmpty ? "" : " \(error)"
        switch status {
        case 200..<300:
            if provider == .naver, !error.isEmpty {
                return .refused("Naver refused the token delete: \(error) \(json?["error_description"] as? String ?? "")")
            }
            return .done
        case 400..<500 where provider == .kakao && (json?["code"] as? Int) == -101:
            return .done
        case 400 where provider == .google && error == "invalid_token":
            return .done
        case 408, 429, 500..<600:
            return .retryLater("\(provider.rawValue) answered HTTP \(status)\(code)")
        default:
            return .refused("\(provider.rawValue) refused the unlink with HTTP \(status)\(code)")
        }
    }
}

/// The delay before the next attempt of a durable unlink: 30 s, doubling, at most 6 hours.
public struct UnlinkBackoff: Sendable, Hashable {
    public var initial: TimeInterval = 30
    public var maximum: TimeInterval = 6 * 3600

    public init(initial: TimeInterval = 30, maximum: TimeInterval = 6 * 3600) {
        self.initial = initial
        self.maximum = maximum
    }

    /// The delay after `failures` failed attempts (1: after the first).
    public func delay(afterFailures failures: Int) -> TimeInterval {
        guard failures > 0 else { return 0 }
        return min(maximum, initial * pow(2, Double(min(failures - 1, 30))))
    }
}

/// Apple's `client_secret`: an ES256 JWT the developer signs with their key (jwt-kit signs it).
public enum AppleClientSecret {
    struct Claims: JWTPayload {
        var iss: IssuerClaim
        var iat: IssuedAtClaim
        var exp: ExpirationClaim
        var aud: AudienceClaim
        var sub: SubjectClaim

        func verify(using algorithm: some JWTAlgorithm) async throws {}
    }

    /// A client secret valid for `lifetime` (at most Apple's six months; 5 minutes by default).
    ///
    /// - Throws: when the key is not a P-256 private key in PEM.
    public static func make(_ settings: UnlinkSettings.Apple, now: Date = Date(), lifetime: TimeInterval = 300) async throws
        -> String
    {
        let key = try ES256PrivateKey(pem: settings.privateKeyPEM)
        let keys = JWTKeyCollection()
        await keys.add(ecdsa: key, kid: JWKIdentifier(string: settings.keyID))
        return try await keys.sign(
            Claims(
                iss: IssuerClaim(value: settings.teamID), iat: IssuedAtClaim(value: now),
                exp: ExpirationClaim(value: now.addingTimeInterval(min(lifetime, 180 * 86_400))),
                aud: AudienceClaim(value: ["https://appleid.apple.com"]), sub: SubjectClaim(value: settings.clientID)),
            kid: JWKIdentifier(string: settings.keyID))
    }
}

/// Sends ``UnlinkRequest``s and reads the answers; no answer at all is ``UnlinkOutcome/retryLater(_:)``.
///
/// Thread safety: `Sendable`; call from any task.
public struct ProviderUnlinker: Sendable {
    private let http: any IdentityHTTPClient
    private let timeout: TimeInterval

    public init(http: any IdentityHTTPClient = AsyncHTTPIdentityClient(), timeout: TimeInterval = 10) {
        self.http = http
        self.timeout = timeout
    }

    public func send(_ request: UnlinkRequest) async -> UnlinkOutcome {
        do {
            let answer = try await http.post(request.url, headers: request.headers, form: request.body, timeout: timeout)
            return UnlinkOutcome.classify(request.provider, status: answer.status, body: answer.body)
        } catch {
            return .retryLater("\(request.provider.rawValue) did not answer (\(error))")
        }
    }
}
