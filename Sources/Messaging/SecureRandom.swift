#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Synchronization

/// Bytes from the kernel's cryptographically secure generator, read 4 KiB at a time.
///
/// `SystemRandomNumberGenerator` makes one `getrandom` system call per 8 bytes, and BoringSSL
/// one per call: on the hot path a sign-in took five of them (its uid, its session token, two
/// envelope ids). This reads `/dev/urandom` (the same generator as `getrandom`, never blocking
/// once the system has booted) in blocks and hands the bytes out under a lock, each byte once;
/// handed-out bytes are zeroed in the pool.
///
/// Thread safety: every method may be called from any thread.
public enum SecureRandom {
    private static let blockSize = 4096

    private struct Pool: ~Copyable {
        let descriptor: Int32
        var bytes: [UInt8]
        var next: Int

        init() {
            descriptor = open("/dev/urandom", O_RDONLY | O_CLOEXEC)
            bytes = [UInt8](repeating: 0, count: SecureRandom.blockSize)
            next = SecureRandom.blockSize
        }

        mutating func refill() {
            var filled = 0
            if descriptor >= 0 {
                bytes.withUnsafeMutableBytes { buffer in
                    while filled < buffer.count {
                        let count = read(descriptor, buffer.baseAddress! + filled, buffer.count - filled)
                        if count > 0 {
                            filled += count
                        } else if count < 0 && errno == EINTR {
                            continue
                        } else {
                            break
                        }
                    }
                }
            }
            if filled < bytes.count {
                // No /dev/urandom (a bare chroot) or a short read: the standard library's
                // generator, 8 bytes per call.
                var generator = SystemRandomNumberGenerator()
                var index = filled
                while index < bytes.count {
                    let word = generator.next() as UInt64
                    for shift in 0..<8 where index < bytes.count {
                        bytes[index] = UInt8(truncatingIfNeeded: word >> (8 * UInt64(shift)))
                        index += 1
                    }
                }
            }
            next = 0
        }

        mutating func take(into output: UnsafeMutableRawBufferPointer) {
            var written = 0
            while written < output.count {
                if next == bytes.count { refill() }
                let count = min(output.count - written, bytes.count - next)
                bytes.withUnsafeMutableBytes { pool in
                    (output.baseAddress! + written).copyMemory(from: pool.baseAddress! + next, byteCount: count)
                    (pool.baseAddress! + next).initializeMemory(as: UInt8.self, repeating: 0, count: count)
                }
                written += count
                next += count
            }
        }
    }

    private static let pool = Mutex(Pool())

    /// Fills `buffer` with random bytes.
    public static func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        guard buffer.count > 0 else { return }
        pool.withLock { $0.take(into: buffer) }
    }

    /// Random bytes.
    public static func bytes(count: Int) -> [UInt8] {
        var result = [UInt8](repeating: 0, count: count)
        result.withUnsafeMutableBytes { fill($0) }
        return result
    }

    /// Two random 64-bit words.
    public static func words() -> (UInt64, UInt64) {
        var words: (UInt64, UInt64) = (0, 0)
        withUnsafeMutableBytes(of: &words) { fill($0) }
        return words
    }
}
