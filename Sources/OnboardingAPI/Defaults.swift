import Messaging
import OnboardingSettings

/// The defaults code needs as values. Those that are settings come from the setting's one
/// declaration (`Setting+Catalog.swift`); the rest are fixed.
public enum Defaults {
    public static let authRPC = Endpoint(Setting.authRPC.defaultText)
    public static let authEvents = Endpoint(Setting.authEvents.defaultText)
    public static let profileRPC = Endpoint(Setting.profileRPC.defaultText)
    public static let profileEvents = Endpoint(Setting.profileEvents.defaultText)
    public static let imageRPC = Endpoint(Setting.imageRPC.defaultText)
    public static let orchestratorRPC = Endpoint(Setting.orchestratorRPC.defaultText)
    public static let routes = Endpoint(Setting.routes.defaultText)
    public static let dataDirectory = Setting.dataDir.defaultText
    public static let maxImageBytes = Int(Setting.maxImageBytes.defaultText)!
    public static let maxImagePixels = Int(Setting.maxImagePixels.defaultText)!
    public static let maxImageSide = Int(Setting.maxImageSide.defaultText)!
    public static let imageDecodeThreads = Int(Setting.imageDecodeThreads.defaultText)!
    public static let eventRetentionHours = Int(Setting.eventRetentionHours.defaultText)!
    /// The side of the square thumbnail stored beside every image, in pixels.
    public static let thumbnailSide = 256
    /// How long a call waits for its reply before it fails with `timeout`.
    public static let requestTimeout: Duration = .seconds(3)
    /// How long a call that is safe to repeat keeps trying, over all its attempts, before it
    /// fails with the last attempt's error (see `MessageBus.callRetrying`).
    public static let retryDeadline: Duration = .seconds(10)
}

/// The names services sign their messages with (the envelope's `source`).
public enum ServiceName {
    public static let auth = "auth"
    public static let profile = "profile"
    public static let imageUpload = "image-upload"
    public static let orchestrator = "onboarding-orchestrator"
}
