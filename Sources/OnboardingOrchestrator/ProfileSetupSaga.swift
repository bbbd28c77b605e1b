import Messaging
import OnboardingAPI

/// The steps of setting up a profile, as a value: upload the image (if any), create the
/// profile, and undo the upload when the profile was not created.
///
/// ``OnboardingOrchestrator`` performs each ``Step`` and reports its ``Outcome``; the saga says
/// what comes next, until ``Step/succeed(_:)`` or ``Step/fail(_:settled:)``.
///
/// Both calls carry the set-up's idempotency key, so repeating either does the work once. Before
/// any image is removed, the set-up's creates are abandoned (``Step/abandonCreates``): a create
/// sent earlier may still be on its way (queued at a paused replica, waiting for the database),
/// and once the profile store has answered, none of them can make a profile that points at an
/// image removed after. That answer is the profile as it is: when a call's outcome was unknown
/// (it timed out), a profile with this username means the set-up went through. Either way every
/// image of the person except the one the profile points at is removed (an upload that timed
/// out may have stored one nobody points at), since the set-up is the only thing that uploads.
public struct ProfileSetupSaga: Sendable {
    public enum Step: Sendable, Hashable {
        case uploadImage
        case createProfile(username: String, imagePath: String?)
        /// Before removing anything: stop every create of this set-up (and of earlier ones) that
        /// has not reached the profile store, and look at the profile.
        case abandonCreates
        /// Compensation: remove the person's images but `keep` (the profile's, if any).
        case deleteStrayImages(keep: String?)
        case succeed(Profile)
        /// The set-up failed with `error`. `settled`: nothing it stored is left behind; when
        /// `false`, the set-up stays on record and is settled later (by whoever leads then).
        case fail(ServiceError, settled: Bool)
    }

    public enum Outcome: Sendable, Hashable {
        case uploaded(path: String)
        case uploadFailed(ServiceError)
        case created(Profile)
        case createFailed(ServiceError)
        /// The creates are abandoned; the profile as it is then.
        case abandoned(Profile?)
        case abandonFailed(ServiceError)
        case imagesDeleted
        case imageDeleteFailed(ServiceError)
        /// Before removing images, the set-up was found no longer this try's (a newer try of the
        /// person has begun, or another orchestrator leads and settles it): nothing was removed.
        case takenOver
    }

    public let username: String
    public let hasImage: Bool
    private(set) var imagePath: String?
    private var failure: ServiceError?
    /// Whether a call failed in a way that leaves its outcome unknown (it may have done its work).
    private var outcomeUnknown = false
    /// The profile found after an unknown outcome: the set-up succeeds once strays are removed.
    private var found: Profile?
    /// The format rule the username breaks, found by the one bounded check in `init`.
    private let usernameProblem: UsernameProblem?

    public init(username: String, hasImage: Bool) {
        let checked = UsernameRules.check(username)
        self.username = checked.normalized
        self.usernameProblem = checked.problem
        self.hasImage = hasImage
    }

    /// The first step. A username with a format problem fails here, before anything is uploaded.
    public func start() -> Step {
        if let problem = usernameProblem { return .fail(.username(problem), settled: true) }
        return hasImage ? .uploadImage : .createProfile(username: username, imagePath: nil)
    }

    public mutating func next(after outcome: Outcome) -> Step {
        switch outcome {
        case .uploaded(let path):
            imagePath = path
            return .createProfile(username: username, imagePath: path)
        case .uploadFailed(let error) where Self.outcomeUnknown(error):
            failure = error
            outcomeUnknown = true
            return .abandonCreates
        case .uploadFailed(let error):
            return .fail(error, settled: true)
        case .created(let profile):
            return .succeed(profile)
        case .createFailed(let error) where error.reason == CreateProfile.abandonedReason:
            // Someone else abandoned this try: the orchestrator that leads now (this one lost the
            // lead) or a newer try of the same person. It settles the set-up; removing anything
            // here could take an image from under its newer try. The caller sends it again.
            return .fail(Self.takenOver, settled: false)
        case .createFailed(let error) where Self.outcomeUnknown(error):
            failure = error
            outcomeUnknown = true
            return .abandonCreates
        case .createFailed(let error):
            failure = error
            // A refusal with an image: remove it, once no copy of the create can still land.
            return imagePath == nil ? .fail(error, settled: true) : .abandonCreates
        case .abandoned(let profile?) where profile.username == username && profile.imagePath == imagePath:
            return .succeed(profile)
        case .abandoned(let profile):
            // After an unknown outcome, a profile with this username is this set-up's.
            if outcomeUnknown, let profile, profile.username == username { found = profile }
            return .deleteStrayImages(keep: profile?.imagePath)
        case .abandonFailed:
            // Whether a create may still land is unknown: keep the images rather than risk a
            // profile that points at nothing; the orchestrator settles it later.
            return .fail(reported, settled: false)
        case .imagesDeleted:
            if let found { return .succeed(found) }
            return .fail(reported, settled: true)
        case .imageDeleteFailed:
            // Strays stay on record and are removed later; a profile that exists is still a success.
            if let found { return .succeed(found) }
            return .fail(reported, settled: false)
        case .takenOver:
            // Whoever has the set-up now removes what is stray; a profile that exists is still a success.
            if let found { return .succeed(found) }
            return .fail(Self.takenOver, settled: false)
        }
    }

    /// The answer to a try whose creates someone else abandoned: `storeUnavailable`, so clients
    /// send the set-up again (with the same key), which makes a new try.
    static let takenOver = ServiceError(
        .storeUnavailable,
        "This set-up was taken over and settled by another try (an orchestrator that leads now, or a newer set-up of this person); send it again with the same idempotencyKey.",
        reason: "setUpTakenOver")

    private var reported: ServiceError { failure ?? ServiceError(.internalError, "The profile was not created.") }

    /// Whether a call that failed with `error` may still have done its work.
    static func outcomeUnknown(_ error: ServiceError) -> Bool {
        error.code == .timeout || error.code == .internalError
    }
}
