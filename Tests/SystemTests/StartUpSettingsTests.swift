import Foundation
import Testing
import TestSupport

/// What a person sees when starting a service executable with settings: `--help`,
/// `--print-config`, and one line for a value that cannot work.
@Suite("Service executables read their settings", .timeLimit(.minutes(1)))
struct StartUpSettingsTests {
    /// Runs `program` with `arguments` and `environment` (added to a clean one) to the end.
    static func run(_ program: String, _ arguments: [String], environment: [String: String] = [:]) async throws
        -> (status: Int32, output: String, errors: String)
    {
        let output = Pipe()
        let errors = Pipe()
        let process = try ChildProcess(
            RunningSystem.binDirectory.appendingPathComponent(program), arguments: arguments,
            environment: ["PATH": "/usr/bin:/bin"].merging(environment) { $1 }, standardOutput: .pipe(output),
            standardError: .pipe(errors))
        let (out, err) = try await Task.detached {
            (try output.fileHandleForReading.readToEnd() ?? Data(), try errors.fileHandleForReading.readToEnd() ?? Data())
        }.value
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: out, as: UTF8.self), String(decoding: err, as: UTF8.self))
    }

    @Test("a value that cannot work stops the service before it starts, with one line naming it")
    func badValue() async throws {
        let result = try await Self.run("image-upload-service", [], environment: ["ONBOARDING_MAX_IMAGE_BYTES": "5MB"])
        #expect(result.status == 2)
        #expect(
            result.errors == "image-upload-service: ONBOARDING_MAX_IMAGE_BYTES (--max-image-bytes) is \"5MB\" (from the environment): give a whole number from 1 to 1073741824.\n")
    }

    @Test("a flag that is another program's is refused, naming who reads it")
    func otherProgramsFlag() async throws {
        let result = try await Self.run("profile-service", ["--google-client-ids", "x"])
        #expect(result.status == 2)
        #expect(result.errors.contains("is not a setting of profile-service (it is read by auth-service)"), "\(result.errors)")
    }

    @Test("--print-config shows each setting in force and where it came from, never a secret")
    func printConfig() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("settings-\(UUID().uuidString).json")
        try #"{"profile": {"cacheCapacity": 77}}"#.write(to: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: file) }
        let result = try await Self.run(
            "profile-service", ["--print-config", "--config", file.path, "--profile-rpc", "tcp://127.0.0.1:9201"],
            environment: ["ONBOARDING_SERVICE_TOKEN": "sekrit", "ONBOARDING_DATA_DIR": "/srv/onboarding"])
        #expect(result.status == 0, "\(result.errors)")
        let lines = result.output.split(separator: "\n").map(String.init)
        #expect(lines.contains { $0.hasPrefix("ONBOARDING_PROFILE_RPC") && $0.hasSuffix("tcp://127.0.0.1:9201  (flag)") })
        #expect(lines.contains { $0.hasPrefix("ONBOARDING_PROFILE_CACHE_CAPACITY") && $0.hasSuffix("77  (file \(file.path))") })
        #expect(lines.contains { $0.hasPrefix("ONBOARDING_SERVICE_TOKEN") && $0.hasSuffix("<secret>  (environment)") })
        #expect(lines.contains { $0.hasPrefix("ONBOARDING_PROFILE_DATABASE") && $0.hasSuffix("/srv/onboarding/profile.sqlite  (default)") })
        #expect(!result.output.contains("sekrit"))
    }

    @Test("--help lists the program's settings with their variables", arguments: [
        "auth-service", "profile-service", "image-upload-service", "onboarding-orchestrator", "onboarding-gateway",
    ])
    func help(program: String) async throws {
        let result = try await Self.run(program, ["--help"])
        #expect(result.status == 0)
        #expect(result.output.contains("--print-config") && result.output.contains("--config <file>"), "\(result.output)")
        #expect(result.output.contains("ONBOARDING_LOG_LEVEL") && result.output.contains("--data-dir"), "\(result.output)")
    }
}
