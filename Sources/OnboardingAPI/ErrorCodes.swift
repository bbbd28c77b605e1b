import Messaging

extension ErrorCode {
    /// The request's values are wrong (an unknown provider, a missing field's value…); the
    /// message says which.
    public static let invalidRequest: ErrorCode = "invalidRequest"
    /// The session token is missing, unknown, or belongs to a signed-out or withdrawn account.
    /// Sign in again.
    public static let unauthenticated: ErrorCode = "unauthenticated"
    /// The caller's key (CURVE) has no right to this request; `reason` names the key. Only our
    /// own programs meet it: see the README's rights table.
    public static let forbidden: ErrorCode = "forbidden"
    /// The username breaks a format rule; `reason` is `empty`, `tooShort`, `tooLong` or
    /// `invalidCharacters`.
    public static let invalidUsername: ErrorCode = "invalidUsername"
    /// Someone else holds the username (letter case ignored); `reason` is `duplicated`.
    public static let usernameTaken: ErrorCode = "usernameTaken"
    /// The person already has a profile; onboarding creates one only once.
    public static let profileExists: ErrorCode = "profileExists"
    /// The person has no profile to change.
    public static let profileNotFound: ErrorCode = "profileNotFound"
    /// The image was refused; `reason` is `empty`, `tooLarge` (too many bytes, or too many
    /// pixels by its header), `unsupportedType` (not PNG, JPEG, WebP or HEIC by its bytes) or
    /// `invalidImage` (of an accepted kind by its first bytes, but it does not decode: truncated,
    /// only a header, or damaged).
    public static let imageRejected: ErrorCode = "imageRejected"
    /// No such image for this person.
    public static let imageNotFound: ErrorCode = "imageNotFound"
    /// The service's own store failed. Nothing was changed; try again.
    public static let storeUnavailable: ErrorCode = "storeUnavailable"
    /// A service this one depends on did not answer; `reason` names it. Try again.
    public static let dependencyUnavailable: ErrorCode = "dependencyUnavailable"
}

extension ServiceError {
    /// The error for a username that breaks a rule.
    public static func username(_ problem: UsernameProblem) -> ServiceError {
        switch problem {
        case .empty:
            ServiceError(.invalidUsername, "Enter a username.", reason: problem.rawValue)
        case .tooShort:
            ServiceError(
                .invalidUsername, "A username has at least \(UsernameRules.minimumLength) characters.",
                reason: problem.rawValue)
        case .tooLong:
            ServiceError(
                .invalidUsername, "A username has at most \(UsernameRules.maximumLength) characters.",
                reason: problem.rawValue)
        case .invalidCharacters:
            ServiceError(
                .invalidUsername, "A username may use only letters A-Z and a-z, digits, Hangul syllables and _.",
                reason: problem.rawValue)
        case .duplicated:
            ServiceError(.usernameTaken, "Someone else already has this username.", reason: problem.rawValue)
        }
    }
}
