import Messaging

/// Every default endpoint and path of the system, in one place. Each can be changed with a flag
/// or with the environment variable named beside it (see the README's Configuration section).
public enum Defaults {
    /// `ONBOARDING_AUTH_RPC`: auth's request endpoint.
    public static let authRPC: Endpoint = "tcp://127.0.0.1:7101"
    /// `ONBOARDING_AUTH_EVENTS`: auth's event publisher.
    public static let authEvents: Endpoint = "tcp://127.0.0.1:7102"
    /// `ONBOARDING_PROFILE_RPC`: profile's request endpoint.
    public static let profileRPC: Endpoint = "tcp://127.0.0.1:7201"
    /// `ONBOARDING_PROFILE_EVENTS`: profile's event publisher.
    public static let profileEvents: Endpoint = "tcp://127.0.0.1:7202"
    /// `ONBOARDING_IMAGE_RPC`: image-upload's request endpoint.
    public static let imageRPC: Endpoint = "tcp://127.0.0.1:7301"
    /// `ONBOARDING_ORCHESTRATOR_RPC`: the orchestrator's request endpoint.
    public static let orchestratorRPC: Endpoint = "tcp://127.0.0.1:7401"
    /// `ONBOARDING_ROUTES`: the orchestrator's route-intent publisher.
    public static let routes: Endpoint = "tcp://127.0.0.1:7402"
    /// `ONBOARDING_DATA_DIR`: where SQLite databases and images are kept.
    public static let dataDirectory = ".data"
    /// `ONBOARDING_MAX_IMAGE_BYTES`: the largest image accepted.
    public static let maxImageBytes = 5 * 1024 * 1024
    /// `ONBOARDING_MAX_IMAGE_PIXELS`: the most pixels (width × height, read from the header
    /// before anything is decoded) an image may have: 40 megapixels.
    public static let maxImagePixels = 40_000_000
    /// `ONBOARDING_MAX_IMAGE_SIDE`: the longest side an image may have, in pixels.
    public static let maxImageSide = 10_000
    /// `ONBOARDING_IMAGE_DECODE_THREADS`: how many images image-upload decodes at once, each on
    /// a thread of its own.
    public static let imageDecodeThreads = 2
    /// The side of the square thumbnail stored beside every image, in pixels.
    public static let thumbnailSide = 256
    /// `ONBOARDING_EVENT_RETENTION_HOURS`: how long auth and profile keep published events for
    /// subscribers to replay (`events.after`).
    public static let eventRetentionHours = 24
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
