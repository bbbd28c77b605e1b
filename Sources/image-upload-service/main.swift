import ArgumentParser
import ImageUploadService
import Logging
import OnboardingAPI
import ServiceRuntime

@main
struct ImageUploadServiceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "image-upload-service",
        abstract: "Stores profile images under each person's uid: decodes each upload, refuses what is not a whole image within the limits, and stores it re-encoded without metadata, with a square thumbnail.")

    @Option(help: "Request endpoint. Env: ONBOARDING_IMAGE_RPC. Default: \(Defaults.imageRPC)")
    var rpc: String?

    @Option(help: "Images root folder. Env: ONBOARDING_IMAGE_DIR. Default: <data-dir>/images")
    var directory: String?

    @Option(help: "Largest image accepted, in bytes. Env: ONBOARDING_MAX_IMAGE_BYTES. Default: \(Defaults.maxImageBytes)")
    var maxImageBytes: Int?

    @Option(help: "Most pixels (width × height, read from the header before decoding) an image may have. Env: ONBOARDING_MAX_IMAGE_PIXELS. Default: \(Defaults.maxImagePixels)")
    var maxImagePixels: Int?

    @Option(help: "Longest side an image may have, in pixels. Env: ONBOARDING_MAX_IMAGE_SIDE. Default: \(Defaults.maxImageSide)")
    var maxImageSide: Int?

    @Option(help: "How many images are decoded at once, each on a thread of its own. Env: ONBOARDING_IMAGE_DECODE_THREADS. Default: \(Defaults.imageDecodeThreads)")
    var imageDecodeThreads: Int?

    @OptionGroup var common: CommonServiceOptions

    func run() async throws {
        ServiceHost.bootstrapLogging(level: common.level)
        let logger = Logger(label: ServiceName.imageUpload)
        let configuration = ImageUploadService.Configuration(
            rpc: Settings.endpoint(rpc, env: "ONBOARDING_IMAGE_RPC", default: Defaults.imageRPC),
            directory: directory ?? Settings.environment("ONBOARDING_IMAGE_DIR") ?? "\(common.dataDirectory)/images",
            maxImageBytes: try Settings.imageLimit(maxImageBytes),
            imageLimits: ImageLimits(
                maxPixels: try Settings.imagePixelLimit(maxImagePixels), maxSide: try Settings.imageSideLimit(maxImageSide)),
            decodeThreads: try Settings.imageDecodeThreads(imageDecodeThreads),
            serviceToken: try common.resolvedServiceToken())
        try await ServiceHost.run(name: ServiceName.imageUpload, logger: logger) { bus in
            [try ImageUploadService(configuration: configuration, bus: bus, logger: logger)]
        }
    }
}
