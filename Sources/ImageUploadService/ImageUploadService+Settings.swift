import OnboardingAPI
import OnboardingSettings
import ServiceRuntime

extension ImageUploadService.Configuration {
    /// image-upload's configuration from the settings it was started with.
    ///
    /// - Throws: ``SettingError`` naming a setting that cannot work.
    public init(_ settings: Settings) throws {
        self.init(
            rpc: try settings.bindEndpoint(.rpcBind, of: .imageRPC),
            directory: settings.path(.imageDir, derived: settings.dataDirectory + "/images"),
            maxImageBytes: try settings.integer(.maxImageBytes),
            imageLimits: ImageLimits(
                maxPixels: try settings.integer(.maxImagePixels), maxSide: try settings.integer(.maxImageSide)),
            decodeThreads: try settings.integer(.imageDecodeThreads),
            serviceToken: try settings.serviceToken(create: true))
    }
}
