import Messaging

/// The social providers a person can sign in with.
public enum Provider: String, Codable, Sendable, CaseIterable {
    case google, apple, kakao, naver
}

/// `auth.signIn`: turns a provider account into a uid and a new session.
public struct SignIn: APIRequest {
    public typealias Response = SignInResult
    public static let type = "auth.signIn"

    public var provider: Provider
    /// The provider's id for the account. Trusted only in local dev mode, which accepts it
    /// without a token; otherwise the subject comes from the verified token and this is ignored
    /// (send the id the provider gave the app, or an empty string). In every mode it holds no
    /// control character (see ``subjectProblem(_:)``).
    public var subject: String
    /// Google, Apple, Kakao: the OpenID Connect ID token the provider's sign-in gave the app.
    public var idToken: String?
    /// Naver: the OAuth access token the Naver sign-in gave the app (Naver has no ID token).
    public var accessToken: String?
    /// The raw nonce the app made and passed to the provider's sign-in, if it made one: the ID
    /// token must then carry it (Apple: its SHA-256 in lowercase hex, as Apple puts it).
    public var nonce: String?
    /// Apple: the authorization code of the same sign-in. Outside dev mode, with Apple unlinking
    /// configured, auth exchanges it at Apple for the refresh token that unlinks the account at
    /// Apple when the person withdraws; a sign-in without it still works, but is not unlinked.
    public var authorizationCode: String?

    public init(
        provider: Provider, subject: String, idToken: String? = nil, accessToken: String? = nil, nonce: String? = nil,
        authorizationCode: String? = nil
    ) {
        self.provider = provider
        self.subject = subject
        self.idToken = idToken
        self.accessToken = accessToken
        self.nonce = nonce
        self.authorizationCode = authorizationCode
    }
}

extension SignIn {
    /// What is wrong with `subject` in any mode, or `nil`: it must hold no control character
    /// (Unicode category Cc: U+0000–U+001F and U+007F–U+009F; a NUL, a tab, a line break), as
    /// the `pattern` of `auth.signIn.schema.json` says. A provider's id is printable text, and
    /// one that is not would end up in logs and databases as it came.
    ///
    /// - Returns: an `invalidRequest` error naming the first such character.
    public static func subjectProblem(_ subject: String) -> ServiceError? {
        guard let control = subject.unicodeScalars.first(where: { $0.properties.generalCategory == .control }) else {
            return nil
        }
        let code = String(control.value, radix: 16, uppercase: true)
        return ServiceError(
            .invalidRequest,
            "Field 'subject' contains the control character U+\(String(repeating: "0", count: max(0, 4 - code.count)))\(code); send the provider account's id as printable text.")
    }
}

public struct SignInResult: Codable, Sendable, Hashable {
    public var uid: String
    /// Carry this in `sessionToken` of every later user-scoped request.
    public var sessionToken: String
    public var provider: Provider
    public var isNewAccount: Bool

    public init(uid: String, sessionToken: String, provider: Provider, isNewAccount: Bool) {
        self.uid = uid
        self.sessionToken = sessionToken
        self.provider = provider
        self.isNewAccount = isNewAccount
    }
}

/// `auth.signOut`: ends the session named by the envelope's `sessionToken`, or with
/// ``everywhere`` every session of its account.
public struct SignOut: APIRequest {
    public typealias Response = AccountResult
    public static let type = "auth.signOut"
    /// `true`: end every session of the account (sign out on every device). Absent: this one.
    public var everywhere: Bool?
    public init(everywhere: Bool? = nil) { self.everywhere = everywhere }
}

/// `auth.withdraw`: deletes the account of the envelope's `sessionToken`, and with it every
/// session; the orchestrator then deletes the profile and images.
public struct Withdraw: APIRequest {
    public typealias Response = AccountResult
    public static let type = "auth.withdraw"
    public init() {}
}

public struct AccountResult: Codable, Sendable, Hashable {
    public var uid: String
    public init(uid: String) { self.uid = uid }
}

/// `auth.verifySession`: which uid a session token belongs to (for other services).
public struct VerifySession: APIRequest {
    public typealias Response = AccountResult
    public static let type = "auth.verifySession"

    public var sessionToken: String
    public init(sessionToken: String) { self.sessionToken = sessionToken }
}

/// `auth.signedIn`
public struct SignedIn: APIEvent, Hashable {
    public static let type = "auth.signedIn"
    public var uid: String
    public var provider: Provider
    public var isNewAccount: Bool
    /// How many live sessions the person has with this one, counted in the sign-in's own
    /// transaction. Absent from an auth that does not count them.
    public var sessions: Int?

    public init(uid: String, provider: Provider, isNewAccount: Bool, sessions: Int? = nil) {
        self.uid = uid
        self.provider = provider
        self.isNewAccount = isNewAccount
        self.sessions = sessions
    }
}

/// `auth.signedOut`
public struct SignedOut: APIEvent, Hashable {
    public static let type = "auth.signedOut"
    public var uid: String
    /// How many live sessions the person has left, counted in the sign-out's own transaction.
    /// Absent from an auth that does not count them.
    public var sessions: Int?

    public init(uid: String, sessions: Int? = nil) {
        self.uid = uid
        self.sessions = sessions
    }
}

/// `auth.withdrawn`
public struct Withdrawn: APIEvent, Hashable {
    public static let type = "auth.withdrawn"
    public var uid: String
    public init(uid: String) { self.uid = uid }
}

// MARK: - The hot path's payloads, written without `Encodable` (keys in sorted order)

extension SignInResult: WireWritable {
    public func write(to writer: inout WireWriter) {
        writer.member("isNewAccount", isNewAccount)
        writer.member("provider", provider)
        writer.member("sessionToken", sessionToken)
        writer.member("uid", uid)
    }
}

extension SignedIn: WireWritable {
    public func write(to writer: inout WireWriter) {
        writer.member("isNewAccount", isNewAccount)
        writer.member("provider", provider)
        writer.member("sessions", sessions)
        writer.member("uid", uid)
    }
}

extension AccountResult: WireWritable {
    public func write(to writer: inout WireWriter) {
        writer.member("uid", uid)
    }
}

// MARK: - The hot path's payloads, read without `Decodable`

extension SignIn: WireReadable {
    public init(wire object: WireObject) throws {
        self.init(
            provider: try object.value("provider"), subject: try object.string("subject"),
            idToken: try object.optionalString("idToken"), accessToken: try object.optionalString("accessToken"),
            nonce: try object.optionalString("nonce"), authorizationCode: try object.optionalString("authorizationCode"))
    }
}

extension SignInResult: WireReadable {
    public init(wire object: WireObject) throws {
        self.init(
            uid: try object.string("uid"), sessionToken: try object.string("sessionToken"),
            provider: try object.value("provider"), isNewAccount: try object.bool("isNewAccount"))
    }
}

extension SignedIn: WireReadable {
    public init(wire object: WireObject) throws {
        self.init(
            uid: try object.string("uid"), provider: try object.value("provider"), isNewAccount: try object.bool("isNewAccount"),
            sessions: try object.optionalInteger("sessions"))
    }
}

extension VerifySession: WireReadable {
    public init(wire object: WireObject) throws {
        self.init(sessionToken: try object.string("sessionToken"))
    }
}

extension AccountResult: WireReadable {
    public init(wire object: WireObject) throws {
        self.init(uid: try object.string("uid"))
    }
}
