import CZeroMQ
import Foundation
import Messaging

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A CURVE key (Curve25519, 32 bytes) in Z85 text: 40 characters.
public struct CurveKey: Sendable, Hashable, CustomStringConvertible {
    /// The key's 40 characters of Z85.
    public let z85: String

    /// - Throws: ``CurveKeyError/malformed`` unless `z85` is 40 characters of Z85 that decode.
    public init(z85: String) throws(CurveKeyError) {
        guard z85.utf8.count == 40, Self.decode(z85) != nil else { throw .malformed(z85.count) }
        self.z85 = z85
    }

    /// The key from its 32 bytes (as a ZAP request carries a client's key).
    public init?(bytes: Data) {
        guard bytes.count == 32 else { return nil }
        var text = [CChar](repeating: 0, count: 41)
        let encoded = bytes.withUnsafeBytes { raw in
            zmq_z85_encode(&text, raw.bindMemory(to: UInt8.self).baseAddress, 32)
        }
        guard encoded != nil else { return nil }
        z85 = String(nulTerminated: text)
    }

    /// A short name of the key for logs: its first six bytes in hex, enough to tell keys apart.
    public var fingerprint: String {
        guard let bytes = Self.decode(z85) else { return "?" }
        return bytes.prefix(6).map { String(format: "%02x", $0) }.joined()
    }

    /// A public key may be printed; a secret one is printed as `<secret>` by callers.
    public var description: String { z85 }

    static func decode(_ z85: String) -> [UInt8]? {
        var bytes = [UInt8](repeating: 0, count: 32)
        let decoded = z85.withCString { zmq_z85_decode(&bytes, $0) }
        return decoded == nil ? nil : bytes
    }
}

/// A key pair: the public key others are given, the secret one kept by its owner.
public struct CurveKeyPair: Sendable, Hashable {
    public let publicKey: CurveKey
    public let secretKey: CurveKey

    public init(publicKey: CurveKey, secretKey: CurveKey) {
        self.publicKey = publicKey
        self.secretKey = secretKey
    }

    /// A new random key pair (libzmq's `zmq_curve_keypair`, libsodium's random source).
    public static func generate() throws(CurveKeyError) -> CurveKeyPair {
        var publicText = [CChar](repeating: 0, count: 41)
        var secretText = [CChar](repeating: 0, count: 41)
        guard zmq_curve_keypair(&publicText, &secretText) == 0 else {
            throw .unavailable(zmqErrorText(zmq_errno()))
        }
        return CurveKeyPair(
            publicKey: try CurveKey(z85: String(nulTerminated: publicText)),
            secretKey: try CurveKey(z85: String(nulTerminated: secretText)))
    }
}

/// What can be wrong with a key or a key file.
public enum CurveKeyError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Not 40 characters of Z85 (the length it had).
    case malformed(Int)
    /// libzmq was built without CURVE.
    case unavailable(String)
    /// A key file that does not exist.
    case missing(path: String)
    /// A key file that cannot be read.
    case unreadable(path: String, reason: String)
    /// A secret key file that others may read (its mode).
    case tooOpen(path: String, mode: mode_t)
    /// A key file without the key it must hold.
    case noKey(path: String, which: String)
    /// A key file whose key is not valid.
    case badKey(path: String, which: String)
    /// Writing a key file failed.
    case unwritable(path: String, reason: String)

    public var description: String {
        switch self {
        case .malformed(let length):
            "a CURVE key is 40 characters of Z85 (this one has \(length), or is not Z85)"
        case .unavailable(let reason):
            "this libzmq has no CURVE support (\(reason)); install Debian's libzmq3-dev, which has it"
        case .missing(let path):
            "the key file \(path) does not exist"
        case .unreadable(let path, let reason):
            "the key file \(path) cannot be read (\(reason))"
        case .tooOpen(let path, let mode):
            "the secret key file \(path) may be read by others (mode \(String(mode & 0o777, radix: 8))); run chmod 600 \(path)"
        case .noKey(let path, let which):
            "the key file \(path) has no \(which) line"
        case .badKey(let path, let which):
            "the \(which) in \(path) is not a CURVE key (40 characters of Z85)"
        case .unwritable(let path, let reason):
            "cannot write the key file \(path) (\(reason))"
        }
    }
}

/// Key files in ZeroMQ's certificate format (CZMQ's `zcert`, which pyzmq's
/// `zmq.auth.load_certificate` reads): `NAME.key` holds the public key and may be shared;
/// `NAME.key_secret` holds both keys and only its owner may read it (mode 0600).
public enum CurveKeyFile {
    /// The public key file of `name` in `directory`.
    public static func publicPath(_ name: String, in directory: String) -> String { "\(directory)/\(name).key" }
    /// The secret key file of `name` in `directory`.
    public static func secretPath(_ name: String, in directory: String) -> String { "\(directory)/\(name).key_secret" }

    /// The text of a key file: the public key, and the secret one when given.
    static func text(publicKey: CurveKey, secretKey: CurveKey?, name: String, date: Date = Date()) -> String {
        let day = ISO8601DateFormatter.string(from: date, timeZone: .gmt, formatOptions: [.withFullDate])
        var lines = [
            "#   ****  Made on \(day) by onboarding-keys for \(name)  ****",
            secretKey == nil
                ? "#   ZeroMQ CURVE public key: give it to the processes that talk to \(name)."
                : "#   ZeroMQ CURVE secret key of \(name): never copy it anywhere else.",
            "",
            "metadata",
            "curve",
            "    public-key = \"\(publicKey.z85)\"",
        ]
        if let secretKey { lines.append("    secret-key = \"\(secretKey.z85)\"") }
        return lines.joined(separator: "\n") + "\n"
    }

    /// Writes `pair` as `NAME.key` (mode 0644) and `NAME.key_secret` (mode 0600) in `directory`,
    /// which must exist. The secret file is created with its mode, never widened.
    public static func write(_ pair: CurveKeyPair, name: String, in directory: String) throws(CurveKeyError) {
        try writeFile(
            secretPath(name, in: directory), text(publicKey: pair.publicKey, secretKey: pair.secretKey, name: name), mode: 0o600)
        try writeFile(publicPath(name, in: directory), text(publicKey: pair.publicKey, secretKey: nil, name: name), mode: 0o644)
    }

    /// Writes `contents` to a new file at `path` created with `mode`; fails when it exists.
    private static func writeFile(_ path: String, _ contents: String, mode: mode_t) throws(CurveKeyError) {
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode)
        guard fd >= 0 else { throw .unwritable(path: path, reason: String(cString: strerror(errno))) }
        let file = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
        // The umask may have narrowed the mode; a public key must stay readable.
        fchmod(fd, mode)
        do {
            try file.write(contentsOf: Data(contents.utf8))
            try file.synchronize()
        } catch {
            throw .unwritable(path: path, reason: "\(error.localizedDescription)")
        }
    }

    /// The public key in `path` (a `.key` or `.key_secret` file).
    public static func readPublic(_ path: String) throws(CurveKeyError) -> CurveKey {
        try read(path, secret: false).publicKey
    }

    /// The key pair in the secret file `path`, which only its owner may read.
    public static func readPair(_ path: String) throws(CurveKeyError) -> CurveKeyPair {
        let (publicKey, secretKey) = try read(path, secret: true)
        guard let secretKey else { throw .noKey(path: path, which: "secret-key") }
        return CurveKeyPair(publicKey: publicKey, secretKey: secretKey)
    }

    private static func read(_ path: String, secret: Bool) throws(CurveKeyError) -> (publicKey: CurveKey, secretKey: CurveKey?) {
        var status = stat()
        guard stat(path, &status) == 0 else {
            if errno == ENOENT { throw .missing(path: path) }
            throw .unreadable(path: path, reason: String(cString: strerror(errno)))
        }
        if secret, status.st_mode & 0o077 != 0 { throw .tooOpen(path: path, mode: status.st_mode) }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw .unreadable(path: path, reason: access(path, R_OK) == 0 ? "read failed" : String(cString: strerror(errno)))
        }
        var found: [String: String] = [:]
        for line in String(decoding: data, as: UTF8.self).split(whereSeparator: \.isNewline) {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            guard !trimmed.hasPrefix("#"), let equals = trimmed.firstIndex(of: "=") else { continue }
            let key = trimmed[..<equals].trimmingCharacters(in: .whitespaces)
            let value = trimmed[trimmed.index(after: equals)...].trimmingCharacters(in: CharacterSet(charactersIn: " \t\"'"))
            if key == "public-key" || key == "secret-key" { found[key] = value }
        }
        func key(_ which: String) throws(CurveKeyError) -> CurveKey? {
            guard let text = found[which] else { return nil }
            do { return try CurveKey(z85: text) } catch { throw .badKey(path: path, which: which) }
        }
        guard let publicKey = try key("public-key") else { throw .noKey(path: path, which: "public-key") }
        return (publicKey, secret ? try key("secret-key") : nil)
    }
}

extension String {
    /// The text before the first NUL of a C character buffer that libzmq filled.
    init(nulTerminated characters: [CChar]) {
        self.init(decoding: characters.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
