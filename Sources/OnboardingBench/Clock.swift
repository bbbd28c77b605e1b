import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The monotonic clock every time in the benchmark is read from (`CLOCK_MONOTONIC`, nanoseconds).
enum MonotonicClock {
    static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) &* 1_000_000_000 &+ UInt64(time.tv_nsec)
    }

    /// Sleeps until `deadline` (an absolute monotonic time), however often a signal interrupts.
    static func sleep(until deadline: UInt64) {
        var time = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
        while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &time, nil) == EINTR {}
    }

    static func sleep(milliseconds: Int) {
        sleep(until: now() + UInt64(milliseconds) * 1_000_000)
    }

    /// Makes the calling thread's timed sleeps wake within about 1 µs of their deadline instead
    /// of Linux's default slack of 50 µs (`/proc/<tid>/timerslack_ns`, the same setting as
    /// `prctl(PR_SET_TIMERSLACK)`, which Swift cannot call: it is variadic). Best effort.
    static func tightenTimerSlack() {
        // "/proc/thread-self" links to "<pid>/task/<tid>"; /proc/<tid> is the thread's own view.
        guard let link = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/thread-self"),
            let thread = link.split(separator: "/").last
        else { return }
        let path = "/proc/\(thread)/timerslack_ns"
        let descriptor = open(path, O_WRONLY)
        guard descriptor >= 0 else { return }
        defer { close(descriptor) }
        _ = "1".withCString { write(descriptor, $0, 1) }
    }
}
