import ArgumentParser
import ImageUploadService
import Logging
import OnboardingAPI
import ServiceRuntime

@main
struct ImageUploadServiceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "image-upload-service",
        abstract: "Stores profile images under each person's uid, accepting only real images within the size limit.")

    @Option(help: "Request endpoint. Env: ONBOARDING_IMAGE_RPC. Default: \(Defaults.imageRPC)")
    var rpc: String?

    @Option(help: "Images root folder. Env: ONBOARDING_IMAGE_DIR. Default: <data-dir>/images")
    var directory: String?

    @Option(help: "Largest image accepted, in bytes. Env: ONBOARDING_MAX_IMAGE_BYTES. Default: \(Defaults.maxImageBytes)")
    var maxImageBytes: Int?

    @OptionGroup var common: CommonServiceOptions

    func run() async throws {
        ServiceHost.bootstrapLogging(level: common.level)
        let logger = Logger(label: ServiceName.imageUpload)
        let configuration = ImageUploadService.Configuration(
            rpc: Settings.endpoint(rpc, env: "ONBOARDING_IMAGE_RPC", default: Defaults.imageRPC),
            directory: directory ?? Settings.environment("ONBOARDING_IMAGE_DIR") ?? "\(common.dataDirectory)/images",
            maxImageBytes: try Settings.imageLimit(maxImageBytes),
            serviceToken: try common.resolvedServiceToken())
        try await ServiceHost.run(name: ServiceName.imageUpload, logger: logger) { bus in
            [try ImageUploadService(configuration: configuration, bus: bus, logger: logger)]
        }
    }
}
