import Foundation
import FuzzKit
@testable import Messaging
import OnboardingAPI
import Testing

/// The hot path's decoder against Foundation's: it may leave a message to Foundation, but what
/// it decodes itself must be exactly what Foundation decodes, and it must never accept what
/// Foundation refuses.
@Suite("The hot path's decoder")
struct WireDecoderTests {
    @Test("every proto example is decoded by the fast path, to what Foundation decodes", arguments: Proto.exampleTypes)
    func examples(type: String) throws {
        let entry = try #require(WireCatalog.byType[type])
        let data = try Proto.exampleData(type)
        let (fast, foundation) = try entry.bothDecodings(data)
        #expect(fast == foundation)
    }

    @Test("mutated envelopes: the fast path accepts only what Foundation accepts, with the same value")
    func mutations() throws {
        var random = FuzzRandom(seed: 11_23)
        let seeds = try [SignIn.type, SignedIn.type, RouteIntent.type, "profile.get.reply"].map { type in
            (try #require(WireCatalog.byType[type]), try Proto.exampleData(type))
        }
        var fastAccepted = 0
        for round in 0..<3_000 {
            let (entry, seed) = seeds[round % seeds.count]
            var bytes = [UInt8](seed)
            if random.chance(0.5) {
                _ = FuzzValues.mutate(&bytes, &random)
            } else {
                var document = try FuzzJSON.parse(seed)
                if case .object(var members) = document, !members.isEmpty {
                    let index = random.int(0..<members.count)
                    switch random.int(0..<4) {
                    case 0: members[index].value = FuzzValues.value(&random)
                    case 1: members.remove(at: index)
                    case 2: members.append(members[index])
                    default:
                        if case .object(var inner) = members[index].value, !inner.isEmpty {
                            inner[random.int(0..<inner.count)].value = FuzzValues.value(&random)
                            members[index].value = .object(inner)
                        }
                    }
                    document = .object(members)
                }
                bytes = document.bytes
            }
            let data = Data(bytes)
            let verdict = entry.compareDecoders(data)
            switch verdict {
            case .bothDecoded(let fast, let foundation):
                #expect(fast == foundation, "\(String(decoding: data, as: UTF8.self))")
                fastAccepted += 1
            case .fastAcceptedWhatFoundationRefused:
                Issue.record("the fast path accepted \(String(decoding: data, as: UTF8.self))")
            case .leftToFoundation:
                break
            }
        }
        #expect(fastAccepted > 100, "the mutations should leave many messages valid")
    }
}
