import Foundation
import NIOPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Where the chaos test does its blocking work (opening SQLite files, listing folders, reading
/// pid files): NIO's shared thread pool, never Swift's cooperative pool.
enum Blocking {
    /// Runs `body` on a thread of the pool; the caller suspends until it is done.
    static func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await NIOThreadPool.singleton.runIfActive(body)
    }
}

/// Facts about processes, read from pid files and `/proc`. Blocking: call through ``Blocking``.
enum Processes {
    /// The pid written in `path`, if the file holds one.
    static func pid(inFile path: String) -> Int32? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        return Int32(String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// The file name of the program `pid` runs (the first word of its command line), or `nil`
    /// when there is no such process or it has exited (a zombie has an empty command line).
    static func programName(of pid: Int32) -> String? {
        #if os(Linux)
        guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline"), !data.isEmpty else { return nil }
        let first = data.split(separator: 0, maxSplits: 1, omittingEmptySubsequences: false).first ?? Data()
        let path = String(decoding: first, as: UTF8.self)
        return path.split(separator: "/").last.map(String.init)
        #else
        return kill(pid, 0) == 0 ? "" : nil
        #endif
    }

    /// The pid in `pidFile` when it is a live process running `program`.
    static func livePID(pidFile: String, program: String) -> Int32? {
        guard let pid = pid(inFile: pidFile), pid > 0, let name = programName(of: pid) else { return nil }
        #if os(Linux)
        return name == program ? pid : nil
        #else
        return pid
        #endif
    }

    /// Runs the program at `path` without arguments and waits for it: its exit status, or `nil`
    /// when it could not be started. (posix_spawn and waitpid: Foundation's `Process` can miss
    /// its child's exit on Linux and wait for ever.)
    static func run(_ path: String) -> Int32? {
        var pid: pid_t = 0
        let argument = strdup(path)
        defer { free(argument) }
        guard posix_spawn(&pid, path, nil, nil, [argument, nil], environ) == 0 else { return nil }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 {
            guard errno == EINTR else { return nil }
        }
        // WIFEXITED and WEXITSTATUS, by hand (the macros are not imported).
        return status & 0x7F == 0 ? (status >> 8) & 0xFF : nil
    }

    /// The live `postgres` process in `pidFile` (a postmaster) and its children (the backends
    /// and helpers), parent first; empty when there is none.
    static func family(pidFile: String) -> [Int32] {
        guard let parent = livePID(pidFile: pidFile, program: "postgres") else { return [] }
        #if os(Linux)
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        let children = entries.compactMap(Int32.init).filter { pid in
            guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/stat"),
                let close = data.lastIndex(of: UInt8(ascii: ")"))
            else { return false }
            // After the command name: state, then the parent's pid.
            let fields = data[(close + 1)...].split(separator: UInt8(ascii: " "))
            return fields.count > 1 && Int32(String(decoding: fields[1], as: UTF8.self)) == parent
        }
        return [parent] + children
        #else
        return [parent]
        #endif
    }
}

/// Counts people as they finish, and lets faults wait for a point in the drive.
final class ProgressGate: Sendable {
    private struct State {
        var completed = 0
        var finished = false
        var nextID = 0
        var waiters: [Int: (threshold: Int, continuation: CheckedContinuation<Bool, Never>)] = [:]
    }

    private let state = Mutex(State())

    var completed: Int { state.withLock { $0.completed } }
    var isFinished: Bool { state.withLock { $0.finished } }

    /// One more person finished. - Returns: how many have.
    @discardableResult
    func complete() -> Int {
        let (count, ready) = state.withLock { state in
            state.completed += 1
            let ready = state.waiters.filter { $0.value.threshold <= state.completed }
            for id in ready.keys { state.waiters[id] = nil }
            return (state.completed, ready.values.map(\.continuation))
        }
        for continuation in ready { continuation.resume(returning: true) }
        return count
    }

    /// The drive is over: every waiter is told the point will not come.
    func finish() {
        let waiting = state.withLock { state in
            state.finished = true
            defer { state.waiters = [:] }
            return state.waiters.values.map(\.continuation)
        }
        for continuation in waiting { continuation.resume(returning: false) }
    }

    /// Waits until `threshold` people have finished.
    ///
    /// - Returns: `true` when they have; `false` when the drive ended first or the task was cancelled.
    func wait(untilCompleted threshold: Int) async -> Bool {
        let id = state.withLock { state in
            state.nextID += 1
            return state.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let immediate: Bool? = state.withLock { state in
                    if state.completed >= threshold { return true }
                    if state.finished || Task.isCancelled { return false }
                    state.waiters[id] = (threshold, continuation)
                    return nil
                }
                if let immediate { continuation.resume(returning: immediate) }
            }
        } onCancel: {
            let waiter = state.withLock { $0.waiters.removeValue(forKey: id) }
            waiter?.continuation.resume(returning: false)
        }
    }
}
