import Messaging
import OnboardingAPI

/// The steps of setting up a profile, as a value: upload the image (if any), create the
/// profile, and undo the upload when the profile was not created.
///
/// ``OnboardingOrchestrator`` performs each ``Step`` and reports its ``Outcome``; the saga says
/// what comes next, until ``Step/succeed(_:)`` or ``Step/fail(_:)``.
public struct ProfileSetupSaga: Sendable {
    public enum Step: Sendable, Hashable {
        case uploadImage
        case createProfile(username: String, imagePath: String?)
        /// The create call's outcome is unknown (it timed out): look before undoing anything.
        case lookUpProfile
        /// Compensation: remove an image whose profile was never created, then fail with `error`.
        case deleteImage(path: String)
        case succeed(Profile)
        case fail(ServiceError)
    }

    public enum Outcome: Sendable, Hashable {
        case uploaded(path: String)
        case uploadFailed(ServiceError)
        case created(Profile)
        case createFailed(ServiceError)
        case lookedUp(Profile?)
        case lookUpFailed(ServiceError)
        case imageDeleted
        case imageDeleteFailed(ServiceError)
    }

    public let username: String
    public let hasImage: Bool
    private(set) var imagePath: String?
    private var failure: ServiceError?

    public init(username: String, hasImage: Bool) {
        self.username = UsernameRules.normalized(username)
        self.hasImage = hasImage
    }

    /// The first step. A username with a format problem fails here, before anything is uploaded.
    public func start() -> Step {
        if let problem = UsernameRules.formatProblem(username) { return .fail(.username(problem)) }
        return hasImage ? .uploadImage : .createProfile(username: username, imagePath: nil)
    }

    public mutating func next(after outcome: Outcome) -> Step {
        switch outcome {
        case .uploaded(let path):
            imagePath = path
            return .createProfile(username: username, imagePath: path)
        case .uploadFailed(let error):
            return .fail(error)
        case .created(let profile):
            return .succeed(profile)
        case .createFailed(let error) where error.code == .timeout:
            failure = error
            return .lookUpProfile
        case .createFailed(let error):
            return compensate(error)
        case .lookedUp(let profile?) where profile.username == username && profile.imagePath == imagePath:
            return .succeed(profile)
        case .lookedUp:
            return compensate(failure ?? ServiceError(.internalError, "The profile was not created."))
        case .lookUpFailed:
            // Whether the profile exists is unknown: keep the image rather than risk a profile
            // that points at nothing.
            return .fail(failure ?? ServiceError(.internalError, "The profile was not created."))
        case .imageDeleted, .imageDeleteFailed:
            return .fail(failure ?? ServiceError(.internalError, "The profile was not created."))
        }
    }

    private mutating func compensate(_ error: ServiceError) -> Step {
        failure = error
        if let imagePath { return .deleteImage(path: imagePath) }
        return .fail(error)
    }
}
