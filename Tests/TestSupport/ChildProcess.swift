import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A program the tests start, with `posix_spawn`, instead of Foundation's `Process`.
///
/// Foundation's `Process.run()` on Linux (Swift 6.3) can crash the whole test process: it lists
/// `/proc/self/fd` to close inherited descriptors and copies each entry's full 256-byte name,
/// reading past glibc's buffer (swift-corelibs-foundation #5472). With a thousand descriptors
/// open, as when the suites run side by side, a CI run crashed that way and every test then
/// running failed its time limit. Here the child closes every descriptor from 3 up
/// (`posix_spawn_file_actions_addclosefrom_np`), in its own process group, as `Process` does.
///
/// Thread safety: the exit status is behind a lock; any thread may ask.
public final class ChildProcess: @unchecked Sendable {
    /// Where one of the child's standard streams goes.
    public enum Stream {
        case inherit
        case null
        /// The child's end of `pipe` (reading for input, writing for output); the parent's copy
        /// of that end is closed once the child has started.
        case pipe(Pipe)
    }

    public let processIdentifier: pid_t
    /// The program's file name, for messages.
    public let name: String
    private let lock = NSLock()
    private var status: Int32?

    /// Starts `executable` with `arguments`, in `environment` (this process's when `nil`).
    public init(
        _ executable: URL, arguments: [String] = [], environment: [String: String]? = nil,
        standardInput: Stream = .inherit, standardOutput: Stream = .inherit, standardError: Stream = .inherit
    ) throws {
        name = executable.lastPathComponent
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        func wire(_ stream: Stream, to fd: Int32, input: Bool) {
            switch stream {
            case .inherit: break
            case .null: posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", input ? O_RDONLY : O_WRONLY, 0)
            case .pipe(let pipe):
                let end = input ? pipe.fileHandleForReading.fileDescriptor : pipe.fileHandleForWriting.fileDescriptor
                posix_spawn_file_actions_adddup2(&actions, end, fd)
            }
        }
        wire(standardInput, to: 0, input: true)
        wire(standardOutput, to: 1, input: false)
        wire(standardError, to: 2, input: false)
        guard Self.closeFrom(&actions, 3) == 0 else { throw POSIXError(.EINVAL) }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP))

        func cStrings(_ strings: [String]) -> [UnsafeMutablePointer<CChar>?] { strings.map { strdup($0) } + [nil] }
        let argv = cStrings([executable.path] + arguments)
        let envp = cStrings((environment ?? ProcessInfo.processInfo.environment).map { "\($0.key)=\($0.value)" })
        defer {
            for pointer in argv + envp { free(pointer) }
        }
        var pid = pid_t()
        let result = posix_spawn(&pid, executable.path, &actions, &attributes, argv, envp)
        guard result == 0 else { throw POSIXError(POSIXErrorCode(rawValue: result) ?? .EIO) }
        processIdentifier = pid
        // The child has its own copies now.
        if case .pipe(let pipe) = standardInput { try? pipe.fileHandleForReading.close() }
        if case .pipe(let pipe) = standardOutput { try? pipe.fileHandleForWriting.close() }
        if case .pipe(let pipe) = standardError { try? pipe.fileHandleForWriting.close() }
    }

    /// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34 and later), which Swift's Glibc
    /// module does not declare.
    private static let closeFrom: @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32 = {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else {
            fatalError("glibc 2.34 or later is needed (posix_spawn_file_actions_addclosefrom_np)")
        }
        return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
    }()

    /// Whether the child has not exited yet (it is reaped when it has).
    public var isRunning: Bool {
        lock.lock()
        defer { lock.unlock() }
        return reap(blocking: false) == nil
    }

    /// The exit code, or the signal that ended it (as `Process` gives them); -1 while it runs.
    public var terminationStatus: Int32 {
        lock.lock()
        defer { lock.unlock() }
        return reap(blocking: false) ?? -1
    }

    /// Sends SIGTERM.
    public func terminate() {
        kill(processIdentifier, SIGTERM)
    }

    /// Waits for the child to exit (blocking the calling thread) and gives its status.
    @discardableResult
    public func waitUntilExit() -> Int32 {
        lock.lock()
        defer { lock.unlock() }
        return reap(blocking: true) ?? -1
    }

    /// The status once the child has exited, reaping it the first time; call with the lock held.
    private func reap(blocking: Bool) -> Int32? {
        if let status { return status }
        var raw: Int32 = 0
        var result: pid_t
        repeat {
            result = waitpid(processIdentifier, &raw, blocking ? 0 : WNOHANG)
        } while result == -1 && errno == EINTR
        guard result == processIdentifier else { return nil }
        let signal = raw & 0x7f
        status = signal == 0 ? (raw >> 8) & 0xff : signal
        return status
    }
}
