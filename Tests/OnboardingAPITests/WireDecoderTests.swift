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
    func mutations() async throws {
        var random = FuzzRandom(seed: 11_23)
        let seeds = try [
            SignIn.type, SignedIn.type, RouteIntent.type, "profile.get.reply", SignIn.replyType, VerifySession.type,
            VerifySession.replyType, CheckOnboarding.type,
        ].map { type in
            (try #require(WireCatalog.byType[type]), try Proto.exampleData(type))
        }
        var fastAccepted = 0
        for round in 0..<3_000 {
            await letOtherTestsRun(every: 100, at: round)
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

    @Test("mutated envelopes: the hot path's one-pass reader reads what Foundation reads, and refuses what it refuses")
    func readerMutations() throws {
        var reader = EnvelopeReader()
        reader.register(SignIn.self, for: SignIn.type)
        reader.register(SignedIn.self, for: SignedIn.type)
        reader.register(CheckOnboarding.self, for: CheckOnboarding.type)
        reader.register(GetProfile.self, for: GetProfile.type)
        var random = FuzzRandom(seed: 11_24)
        let seeds = try [SignIn.type, SignedIn.type, CheckOnboarding.type, GetProfile.type, RouteIntent.type].map {
            try Proto.exampleData($0)
        }
        var read = 0
        for round in 0..<3_000 {
            var bytes = [UInt8](seeds[round % seeds.count])
            if round % 7 != 0 { _ = FuzzValues.mutate(&bytes, &random) }
            let data = Data(bytes)
            let foundation = try? WireFormat.decoder().decode(EnvelopeHeader.self, from: data)
            guard let fast = try? reader.read(data) else { continue }
            read += 1
            let text = String(decoding: data, as: UTF8.self)
            #expect(fast.header == foundation, "\(text)")
            let payload: AnyHashable? =
                switch fast.header.type {
                case SignIn.type: try? WireFormat.decoder().decode(Envelope<SignIn>.self, from: data).payload.fields
                case SignedIn.type: try? WireFormat.decoder().decode(Envelope<SignedIn>.self, from: data).payload
                case CheckOnboarding.type:
                    (try? WireFormat.decoder().decode(Envelope<CheckOnboarding>.self, from: data)).map { _ in "checkOnboarding" }
                case GetProfile.type: (try? WireFormat.decoder().decode(Envelope<GetProfile>.self, from: data)).map { _ in "getProfile" }
                default: nil
                }
            switch fast.payload {
            case let signIn as SignIn: #expect(payload == AnyHashable(signIn.fields), "\(text)")
            case let signedIn as SignedIn: #expect(payload == AnyHashable(signedIn), "\(text)")
            case is CheckOnboarding: #expect(payload == AnyHashable("checkOnboarding"), "\(text)")
            case is GetProfile: #expect(payload == AnyHashable("getProfile"), "\(text)")
            case nil: #expect(payload == nil, "an unregistered type has no payload: \(text)")
            default: Issue.record("unexpected payload \(String(describing: fast.payload))")
            }
        }
        #expect(read > 300, "the mutations should leave many messages readable")
    }
}

extension SignIn {
    /// Its fields, to compare (it is not `Hashable` itself).
    fileprivate var fields: [String?] { [provider.rawValue, subject, idToken, accessToken, nonce, authorizationCode] }
}
