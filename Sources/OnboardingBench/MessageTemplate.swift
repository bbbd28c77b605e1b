import Foundation

/// A request envelope built before the run, with fixed-width slots where each request's number
/// goes (its id, its subject, its username). At send time the sender writes the number into the
/// slots in place and hands the bytes to libzmq: no encoding, no allocation.
struct MessageTemplate: Sendable, Equatable {
    struct Slot: Sendable, Equatable {
        var offset: Int
        var width: Int
        var radix: UInt64
        /// Instead of digits: W3C trace flags, `01` (sampled) for this percentage of numbers
        /// (those whose last two decimal digits are below it), `00` for the rest.
        var sampledPercent: UInt64? = nil
    }

    var bytes: [UInt8]
    var slots: [Slot]

    /// Writes `number` into every slot: lowercase digits in the slot's radix, zero-padded, the
    /// lowest `width` digits when it has more.
    mutating func fill(_ number: UInt64) {
        bytes.withUnsafeMutableBufferPointer { bytes in
            for slot in slots {
                if let percent = slot.sampledPercent {
                    bytes[slot.offset] = UInt8(ascii: "0")
                    bytes[slot.offset + 1] = number % 100 < percent ? UInt8(ascii: "1") : UInt8(ascii: "0")
                    continue
                }
                var value = number
                var index = slot.offset + slot.width - 1
                while index >= slot.offset {
                    bytes[index] = Self.digits[Int(value % slot.radix)]
                    value /= slot.radix
                    index -= 1
                }
            }
        }
    }

    static let digits = Array("0123456789abcdefghijklmnopqrstuvwxyz".utf8)

    /// The text with `number` filled in (for tests and for printing one example).
    func text(for number: UInt64) -> String {
        var copy = self
        copy.fill(number)
        return String(decoding: copy.bytes, as: UTF8.self)
    }
}

/// Appends literal JSON text and slots.
struct TemplateBuilder {
    private(set) var bytes: [UInt8] = []
    private(set) var slots: [MessageTemplate.Slot] = []

    mutating func text(_ text: String) {
        bytes += text.utf8
    }

    mutating func raw(_ raw: [UInt8]) {
        bytes += raw
    }

    /// A JSON string's content, escaped.
    mutating func string(_ value: String) {
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": text("\\\"")
            case "\\": text("\\\\")
            case _ where scalar.value < 0x20: text(String(format: "\\u%04x", scalar.value))
            default: bytes += String(scalar).utf8
            }
        }
    }

    mutating func slot(width: Int, radix: UInt64) {
        slots.append(MessageTemplate.Slot(offset: bytes.count, width: width, radix: radix))
        bytes += repeatElement(UInt8(ascii: "0"), count: width)
    }

    /// Two characters of W3C trace flags: sampled for `percent` of the numbers.
    mutating func traceFlags(sampledPercent percent: UInt64) {
        slots.append(MessageTemplate.Slot(offset: bytes.count, width: 2, radix: 16, sampledPercent: percent))
        bytes += Array("00".utf8)
    }

    var template: MessageTemplate { MessageTemplate(bytes: bytes, slots: slots) }
}

/// The requests the benchmark sends, as templates (see `proto/README.md` for the envelope).
///
/// Every request's `id` is a UUID of the run's own: `<run tag>-0000-4000-8000-<number, 12 hex>`,
/// so ids are unique across runs and requests. Sign-in subjects are `bench-<run tag>-<number>`
/// (a new account each time); usernames are `<3 characters of the run tag><number, 6 base-36
/// digits>`, 9 characters of `[0-9a-z]`, unique ignoring case.
struct RequestFactory: Sendable {
    static let source = "onboarding-bench"

    /// 8 lowercase hex digits, random per run.
    let runTag: String
    /// `time` of every envelope: when the run was prepared (RFC 3339, UTC, milliseconds).
    let time: String
    /// The share of requests, in percent, whose W3C trace context says sampled; `nil`: no
    /// request carries trace context. Each that does has a trace of its own (`traceparent`:
    /// the run tag and the number in the trace id, the number in the span id), as a gateway
    /// sampling that share would send: the rest carry their context unsampled.
    let tracedPercent: UInt64?

    init(
        runTag: String = RequestFactory.makeRunTag(), time: String = RequestFactory.timestamp(Date()), tracedPercent: UInt64? = nil
    ) {
        self.runTag = runTag
        self.time = time
        self.tracedPercent = tracedPercent
    }

    static func makeRunTag() -> String {
        String(UInt32.random(in: 0...UInt32.max), radix: 16).leftPadded(to: 8)
    }

    static func timestamp(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        formatter.timeZone = TimeZone(identifier: "UTC")
        return formatter.string(from: date)
    }

    /// The run tag's first three characters in base 36, for usernames.
    var usernamePrefix: String {
        let value = UInt64(runTag, radix: 16) ?? 0
        return String(value % (36 * 36 * 36), radix: 36).leftPadded(to: 3)
    }

    private func head(_ builder: inout TemplateBuilder, type: String) {
        builder.text("{\"version\":1,\"id\":\"")
        builder.text("\(runTag)-0000-4000-8000-")
        builder.slot(width: 12, radix: 16)
        builder.text("\",\"type\":\"")
        builder.string(type)
        builder.text("\",\"source\":\"\(Self.source)\",\"sequence\":0,\"time\":\"\(time)\"")
        if let tracedPercent {
            builder.text(",\"traceparent\":\"00-\(runTag)0000000000000000")
            builder.slot(width: 8, radix: 16)
            builder.text("-00f067aa")
            builder.slot(width: 8, radix: 16)
            builder.text("-")
            builder.traceFlags(sampledPercent: tracedPercent)
            builder.text("\"")
        }
    }

    /// `auth.signIn` in dev mode (no ID token): a new account for every number.
    func signIn(provider: String = "kakao") -> MessageTemplate {
        var builder = TemplateBuilder()
        head(&builder, type: "auth.signIn")
        builder.text(",\"payload\":{\"provider\":\"")
        builder.string(provider)
        builder.text("\",\"subject\":\"bench-\(runTag)-")
        builder.slot(width: 12, radix: 16)
        builder.text("\"}}")
        return builder.template
    }

    /// `onboarding.check` with `sessionToken` (its JSON text, as it came in the sign-in reply),
    /// naming the person's `uid` as `OnboardingClient` does (a hint that saves a round trip).
    func check(sessionToken: [UInt8], uid: String) -> MessageTemplate {
        var builder = TemplateBuilder()
        head(&builder, type: "onboarding.check")
        builder.text(",\"uid\":\"")
        builder.string(uid)
        builder.text("\",\"sessionToken\":\"")
        builder.raw(sessionToken)
        builder.text("\",\"payload\":{}}")
        return builder.template
    }

    /// `onboarding.setUpProfile` without an image, with the number's username.
    func setUp(sessionToken: [UInt8]) -> MessageTemplate {
        var builder = TemplateBuilder()
        head(&builder, type: "onboarding.setUpProfile")
        builder.text(",\"sessionToken\":\"")
        builder.raw(sessionToken)
        builder.text("\",\"payload\":{\"username\":\"\(usernamePrefix)")
        builder.slot(width: 6, radix: 36)
        builder.text("\"}}")
        return builder.template
    }

    /// `health`, open on every service: the first round trip on a new connection.
    func health() -> MessageTemplate {
        var builder = TemplateBuilder()
        head(&builder, type: "health")
        builder.text(",\"payload\":{}}")
        return builder.template
    }
}
