import Foundation
import ImageFixtures
import Messaging
import OnboardingAPI
import OnboardingClient
import OnboardingTesting
import Testing

/// Sends `body` (and `attachment`) raw and returns the error the service answers with.
func rawError(
    _ bus: any MessageBus, _ endpoint: Endpoint, body: Data, attachment: Data? = nil
) async throws -> ServiceError? {
    let reply = try await bus.request(OutgoingMessage(body: body, attachment: attachment), to: endpoint, timeout: .seconds(5))
    return reply.serviceError
}

func envelope(
    _ type: String, payload: String = "{}", uid: String? = nil, token: String? = nil, serviceToken: String? = nil
) -> Data {
    var fields = [
        "\"version\":1", "\"id\":\"\(UUID().uuidString.lowercased())\"", "\"type\":\"\(type)\"",
        "\"source\":\"test\"", "\"sequence\":0", "\"time\":\"\(Timestamp.now())\"", "\"payload\":\(payload)",
    ]
    if let uid { fields.append("\"uid\":\"\(uid)\"") }
    if let token { fields.append("\"sessionToken\":\"\(token)\"") }
    if let serviceToken { fields.append("\"serviceToken\":\"\(serviceToken)\"") }
    return Data("{\(fields.joined(separator: ","))}".utf8)
}

/// Bad input at every endpoint: each gets a typed error and no service goes down.
///
/// - Parameter serviceToken: the secret the services share.
///
/// - Parameter serviceRefusal: how a request meant for our own services is refused: `forbidden`
///   over CURVE (the caller's key has no right to it), `unauthenticated` where the service token
///   decides (no keys, or the in-process bus).
func runBadInput(
    bus: any MessageBus, endpoints: SystemEndpoints, serviceToken: String, serviceRefusal: ErrorCode = .unauthenticated
) async throws {
    let app = endpoints.client(bus, name: "bad-input")
    let signedIn = try await app.signIn(provider: .naver, subject: "bad-input-\(UUID().uuidString)")
    let uid = signedIn.uid

    for (_, endpoint) in endpoints.rpcEndpoints {
        #expect(try await rawError(bus, endpoint, body: Data("{not json".utf8))?.code == .invalidMessage)
        #expect(try await rawError(bus, endpoint, body: Data("[]".utf8))?.code == .invalidMessage)
        #expect(try await rawError(bus, endpoint, body: Data())?.code == .invalidMessage)
        #expect(try await rawError(bus, endpoint, body: envelope("no.such.type"))?.code == .unknownType)
        #expect(try await rawError(bus, endpoint, body: Data(envelope("health").map { $0 }).replacingVersion())?.code == .unsupportedVersion)
        #expect(try await rawError(bus, endpoint, body: Data(repeating: 0x20, count: 70 * 1024))?.code == .messageTooLarge)
        #expect(try await rawError(bus, endpoint, body: envelope("health"), attachment: Data([1, 2, 3]))?.code == .unexpectedFrames)
    }

    // Payloads of the wrong shape.
    #expect(try await rawError(bus, endpoints.authRPC, body: envelope("auth.signIn", payload: "{\"provider\":\"myspace\",\"subject\":\"x\"}"))?.code == .invalidMessage)
    #expect(try await rawError(bus, endpoints.authRPC, body: envelope("auth.signIn", payload: "{\"provider\":\"google\"}"))?.code == .invalidMessage)
    #expect(try await rawError(bus, endpoints.profileRPC, body: envelope("profile.checkUsername", payload: "{\"username\":42}"))?.code == .invalidMessage)

    // Wrong or missing session tokens.
    for type in [SignOut.type, Withdraw.type] {
        #expect(try await rawError(bus, endpoints.authRPC, body: envelope(type))?.code == .unauthenticated)
        #expect(try await rawError(bus, endpoints.authRPC, body: envelope(type, token: "forged"))?.code == .unauthenticated)
    }
    for type in [CheckOnboarding.type] {
        #expect(try await rawError(bus, endpoints.orchestratorRPC, body: envelope(type))?.code == .unauthenticated)
        #expect(try await rawError(bus, endpoints.orchestratorRPC, body: envelope(type, uid: uid))?.code == .unauthenticated)
        #expect(try await rawError(bus, endpoints.orchestratorRPC, body: envelope(type, token: "forged"))?.code == .unauthenticated)
    }
    #expect(try await rawError(bus, endpoints.orchestratorRPC, body: envelope(SetUpProfile.type, payload: "{\"username\":\"mina\"}", token: "forged"))?.code == .unauthenticated)
    #expect(try await rawError(bus, endpoints.profileRPC, body: envelope(GetProfile.type, token: "forged"))?.code == .unauthenticated)

    // Requests for our own services only: without the right key (over CURVE) or the service
    // token, or with a forged one, an app (or anyone) cannot act for a person by naming their uid.
    let serviceOnly: [(Endpoint, String, String)] = [
        (endpoints.profileRPC, CreateProfile.type, "{\"username\":\"intruder\"}"),
        (endpoints.profileRPC, UpdateProfile.type, "{\"username\":\"intruder\"}"),
        (endpoints.profileRPC, DeleteProfile.type, "{\"reason\":\"request\"}"),
        (endpoints.profileRPC, GetProfile.type, "{}"),
        (endpoints.profileRPC, EvictCachedProfile.type, "{}"),
        (endpoints.imageRPC, DeleteAllImages.type, "{}"),
        (endpoints.imageRPC, DeleteImage.type, "{\"path\":\"\(uid)/x.png\"}"),
    ]
    for (endpoint, type, payload) in serviceOnly {
        #expect(try await rawError(bus, endpoint, body: envelope(type, payload: payload, uid: uid))?.code == serviceRefusal, "\(type) without the service token")
        #expect(try await rawError(bus, endpoint, body: envelope(type, payload: payload, uid: uid, serviceToken: "forged"))?.code == serviceRefusal, "\(type) with a forged service token")
    }
    #expect(try await rawError(bus, endpoints.imageRPC, body: envelope(UploadImage.type, uid: uid), attachment: pngBytes)?.code == serviceRefusal)

    // Invalid usernames, in the domain's order.
    let cases: [(String, UsernameProblem)] = [("", .empty), ("a", .tooShort), ("abcdefghij", .tooLong), ("mi na", .invalidCharacters)]
    for (name, problem) in cases {
        await expectCode(.invalidUsername, reason: problem.rawValue) { _ = try await app.setUpProfile(username: name) }
    }

    // Fake image bytes: refused by their bytes, whatever the declared type; nothing is left behind.
    await expectCode(.imageRejected, reason: "unsupportedType") {
        _ = try await app.setUpProfile(username: "fake\(Int.random(in: 10...99))", image: Data("GIF89a not really".utf8), contentType: "image/png")
    }
    await expectCode(.imageRejected, reason: "empty") {
        _ = try await app.setUpProfile(username: "empty\(Int.random(in: 10...99))", image: Data(), contentType: "image/png")
    }
    // Bytes that only start like an image, or whose header declares too many pixels: decoded, refused.
    await expectCode(.imageRejected, reason: "invalidImage") {
        _ = try await app.setUpProfile(username: "head\(Int.random(in: 10...99))", image: pngBytes.prefix(8), contentType: "image/png")
    }
    await expectCode(.imageRejected, reason: "tooLarge") {
        let bomb = HostileFile.pngHeader(width: 100_000, height: 100_000)
        _ = try await app.setUpProfile(username: "bomb\(Int.random(in: 10...99))", image: bomb, contentType: "image/png")
    }
    #expect(try await app.profile() == nil)
    #expect(try await rawError(bus, endpoints.imageRPC, body: envelope(UploadImage.type, uid: uid, serviceToken: serviceToken))?.code == .unexpectedFrames)

    // Every service still answers.
    for (name, endpoint) in endpoints.rpcEndpoints {
        let health = try await bus.call(HealthCheck(), to: endpoint, source: "bad-input")
        #expect(health.status == "ok", "\(name) still answers")
    }
}

extension Data {
    /// The same envelope with `"version":2`.
    fileprivate func replacingVersion() -> Data {
        Data(String(decoding: self, as: UTF8.self).replacingOccurrences(of: "\"version\":1", with: "\"version\":2").utf8)
    }
}
