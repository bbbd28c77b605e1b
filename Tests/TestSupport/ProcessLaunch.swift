import Foundation

/// Starts processes one at a time across the whole test run.
///
/// Foundation's `Process.run()` on Linux crashed the test process (a bad pointer in `memcpy`,
/// inside `run()`) when two suites started executables at the same moment; every test then
/// running failed its time limit while the crash was reported. Starting is quick; waiting for
/// the processes is not serialized.
public enum ProcessLaunch {
    private static let lock = NSLock()

    public static func run(_ process: Process) throws {
        lock.lock()
        defer { lock.unlock() }
        try process.run()
    }
}
