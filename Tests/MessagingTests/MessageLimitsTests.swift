import Messaging
import Testing

@Suite("message limits")
struct MessageLimitsTests {
    @Test("the transport cap is the larger limit plus 1 MiB")
    func ordinaryCap() {
        #expect(MessageLimits(maxEnvelopeBytes: 1000, maxAttachmentBytes: 0).transportCap == 1000 + 1024 * 1024)
        #expect(MessageLimits(maxEnvelopeBytes: 1000, maxAttachmentBytes: 5000).transportCap == 5000 + 1024 * 1024)
    }

    @Test("the transport cap saturates instead of overflowing", arguments: [Int.max, Int.max - 1, Int.max - 1024 * 1024 + 1])
    func saturatingCap(limit: Int) {
        #expect(MessageLimits(maxEnvelopeBytes: limit).transportCap == Int(Int64.max))
        #expect(MessageLimits(maxAttachmentBytes: limit).transportCap == Int(Int64.max))
    }

    @Test("negative limits give the slack alone")
    func negativeLimits() {
        #expect(MessageLimits(maxEnvelopeBytes: -5, maxAttachmentBytes: .min).transportCap == 1024 * 1024)
    }
}
