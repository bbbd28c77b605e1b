import Foundation
import Testing
import TestSupport

/// `ONBOARDING_EXIT_WITH_PARENT=<pid>`: a service whose starter has gone stops by itself, so a
/// test run that crashes leaves nothing behind that holds its ports or its output pipes.
@Suite("A service stops when the process that started it has gone", .timeLimit(.minutes(1)))
struct ParentWatchTests {
    @Test("auth started by a shell that exits at once stops by itself, and says why")
    func orphanStops() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parent-watch-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let base = 18_000 + Int.random(in: 0..<900) * 2
        _ = try testBusConfiguration(directory: directory, servers: [:])
        let input = Pipe()
        let output = Pipe()
        let log = Pipe()
        // The shell starts auth in the background, naming itself as the parent to outlive,
        // prints auth's pid, and exits when its input ends.
        _ = try ChildProcess(
            URL(fileURLWithPath: "/bin/sh"),
            arguments: [
                "-c", "ONBOARDING_EXIT_WITH_PARENT=$$ \"$0\" --auth-dev-mode & echo $!; read line",
                RunningSystem.binDirectory.appendingPathComponent("auth-service").path,
            ],
            environment: ProcessInfo.processInfo.environment.merging([
                "ONBOARDING_DATA_DIR": directory.path, "ONBOARDING_AUTH_RPC": "tcp://127.0.0.1:\(base)",
                "ONBOARDING_AUTH_EVENTS": "tcp://127.0.0.1:\(base + 1)", "ONBOARDING_LOG_LEVEL": "warning",
            ]) { $1 },
            standardInput: .pipe(input), standardOutput: .pipe(output), standardError: .pipe(log))
        // Auth is started once the shell has printed its pid; then the shell is let go.
        let started = await Task.detached { output.fileHandleForReading.availableData }.value
        #expect(Int32(String(decoding: started, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) != nil)
        try input.fileHandleForWriting.close()
        // The log pipe ends when the last holder, auth, has exited.
        let logged = try await Task.detached { try log.fileHandleForReading.readToEnd() ?? Data() }.value
        let text = String(decoding: logged, as: UTF8.self)
        #expect(text.contains("has gone; stopping"), "\(text)")
    }
}
