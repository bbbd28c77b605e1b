import ImageUploadService
import OnboardingAPI
import OnboardingSettings
import ServiceHosting
import ServiceLifecycle

@main
enum ImageUploadServiceMain: HostedProgram {
    static let program = Program.imageUpload
    static let name = ServiceName.imageUpload
    static let abstract = """
        Stores profile images under each person's uid: decodes each upload, refuses what is not a whole image \
        within the limits, and stores it re-encoded without metadata, with a square thumbnail.
        """

    static func services(_ host: Host) async throws -> [any Service] {
        [try ImageUploadService(configuration: .init(host.settings), bus: host.bus, logger: host.logger)]
    }
}
