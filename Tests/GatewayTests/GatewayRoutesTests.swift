import Foundation
import NIOHTTP1
import ImageFixtures
import OnboardingAPI
import OnboardingGateway
import Testing

@Suite("The gateway's HTTP routes over the whole system in one process", .serialized)
struct GatewayRoutesTests {
    @Test("sign in, check, check a name, set up with an image, read the profile, sign out, withdraw")
    func journey() async throws {
        try await GatewaySystem().run { _, gateway in
            let http = GatewayHTTP(gateway)
            let name = "gw\(Int.random(in: 1000...9999))"
            let subject = "journey-\(UUID().uuidString)"
            let me = try await http.signIn(subject)
            #expect(me.isNewAccount)

            let check = try await http.send(.POST, "/v1/me/check", token: me.sessionToken)
            #expect(check.status == 200)
            let status = try check.decode(OnboardingStatus.self)
            #expect(status.uid == me.uid && !status.hasProfile && status.intent == .presentProfileSetup)

            let intent = try await http.send(.GET, "/v1/me/intent", token: me.sessionToken).decode(RouteState.self)
            #expect(intent.intent?.intent == .presentProfileSetup)
            #expect(intent.sequence != nil)

            let empty = try await http.send(.GET, "/v1/me/profile", token: me.sessionToken)
            #expect(empty.status == 200)
            #expect(try empty.decode(ProfileResult.self).profile == nil)

            let free = try await http.send(.GET, "/v1/usernames/\(name)")
            #expect(try free.decode(UsernameAvailability.self) == UsernameAvailability(username: name, available: true, reason: nil))

            let image = TestImage.halves(.png, width: 64, height: 48)
            let key = UUID().uuidString
            let created = try await http.setUp(token: me.sessionToken, username: name, image: image, key: key)
            #expect(created.status == 201, "\(created.text)")
            let profile = try #require(try created.decode(ProfileResult.self).profile)
            #expect(profile.username == name)
            #expect(profile.imagePath?.hasPrefix(me.uid + "/") == true)

            // The same set-up again with the same key: the same profile, not profileExists.
            let again = try await http.setUp(token: me.sessionToken, username: name, image: image, key: key)
            #expect(again.status == 201)
            #expect(try again.decode(ProfileResult.self).profile == profile)

            let read = try await http.send(.GET, "/v1/me/profile", token: me.sessionToken).decode(ProfileResult.self)
            #expect(read.profile == profile)

            let taken = try await http.send(.GET, "/v1/usernames/\(name.uppercased())").decode(UsernameAvailability.self)
            #expect(!taken.available && taken.reason == .duplicated)

            let signOut = try await http.send(.DELETE, "/v1/session", token: me.sessionToken)
            #expect(signOut.status == 204)
            let afterSignOut = try await http.send(.GET, "/v1/me/profile", token: me.sessionToken)
            #expect(afterSignOut.status == 401)
            #expect(afterSignOut.problem?.code == "unauthenticated")

            let back = try await http.signIn(subject)
            #expect(back.uid == me.uid && !back.isNewAccount)
            let withdrawn = try await http.send(.DELETE, "/v1/me", token: back.sessionToken)
            #expect(withdrawn.status == 202)
            #expect(try withdrawn.decode(AccountResult.self).uid == back.uid)
            #expect(try await http.send(.POST, "/v1/me/check", token: back.sessionToken).status == 401)
        }
    }

    @Test("a Hangul username in the path is checked as the person typed it")
    func hangulUsername() async throws {
        try await GatewaySystem().run { _, gateway in
            let http = GatewayHTTP(gateway)
            let encoded = "민지".addingPercentEncoding(withAllowedCharacters: .urlPathAllowed)!
            let reply = try await http.send(.GET, "/v1/usernames/\(encoded)").decode(UsernameAvailability.self)
            #expect(reply == UsernameAvailability(username: "민지", available: true, reason: nil))
            let short = try await http.send(.GET, "/v1/usernames/a").decode(UsernameAvailability.self)
            #expect(!short.available && short.reason == .tooShort)
        }
    }

    @Test("errors are problem+json with the bus's code, the reason, and the documented status")
    func problems() async throws {
        try await GatewaySystem().run { _, gateway in
            let http = GatewayHTTP(gateway)
            let me = try await http.signIn("problems-\(UUID().uuidString)")

            let noToken = try await http.send(.POST, "/v1/me/check")
            #expect(noToken.status == 401)
            #expect(noToken.headers.first(name: "www-authenticate")?.hasPrefix("Bearer") == true)
            #expect(noToken.problem?.code == "unauthenticated")
            #expect(noToken.problem?.status == 401)
            #expect(noToken.problem?.type == "urn:onboarding:problem:unauthenticated")

            let wrongToken = try await http.send(.GET, "/v1/me/intent", token: "not-a-session")
            #expect(wrongToken.status == 401 && wrongToken.problem?.code == "unauthenticated")

            let badProvider = try await http.json(.POST, "/v1/session", ["provider": "myspace", "subject": "x"])
            #expect(badProvider.status == 400 && badProvider.problem?.code == "invalidRequest")
            #expect(badProvider.problem?.detail.contains("provider") == true)

            let extraField = try await http.json(.POST, "/v1/session", ["provider": "kakao", "subject": "x", "admin": true])
            #expect(extraField.status == 400 && extraField.problem?.detail.contains("admin") == true)

            let notJSON = try await http.send(.POST, "/v1/session", body: Data("{".utf8), contentType: "application/json")
            #expect(notJSON.status == 400 && notJSON.problem?.code == "invalidRequest")

            let form = try await http.send(.POST, "/v1/session", body: Data("provider=kakao".utf8), contentType: "application/x-www-form-urlencoded")
            #expect(form.status == 415 && form.problem?.code == "unsupportedMediaType")

            let jsonSetUp = try await http.json(.POST, "/v1/me/profile", token: me.sessionToken, ["username": "minji"])
            #expect(jsonSetUp.status == 415)

            let badName = try await http.setUp(token: me.sessionToken, username: "a b")
            #expect(badName.status == 422)
            #expect(badName.problem?.code == "invalidUsername" && badName.problem?.reason == "invalidCharacters")

            let notImage = try await http.setUp(token: me.sessionToken, username: "fine\(Int.random(in: 100...999))", image: Data("hello".utf8))
            #expect(notImage.status == 422)
            #expect(notImage.problem?.code == "imageRejected" && notImage.problem?.reason == "unsupportedType")

            let badKey = try await http.setUp(token: me.sessionToken, username: "okname", key: "has spaces")
            #expect(badKey.status == 400 && badKey.problem?.detail.contains("Idempotency-Key") == true)

            let wrongMethod = try await http.send(.PUT, "/v1/me/profile", token: me.sessionToken)
            #expect(wrongMethod.status == 405 && wrongMethod.problem?.code == "methodNotAllowed")
            #expect(wrongMethod.headers.first(name: "allow") == "GET, POST")

            let missing = try await http.send(.GET, "/v1/nothing-here")
            #expect(missing.status == 404 && missing.problem?.code == "notFound")

            let badID = try await http.send(.GET, "/v1/me/intents", token: me.sessionToken, headers: [("Last-Event-ID", "yesterday")])
            #expect(badID.status == 400 && badID.problem?.detail.contains("Last-Event-ID") == true)
        }
    }

    @Test("a repeated sign-out within 24 hours of the session's end is 204 as the first; later, or a token never a session, 401")
    func repeatedSignOut() async throws {
        let time = MovableTime()
        var system = try GatewaySystem()
        system.authClock = { time.now }
        try await system.run { _, gateway in
            let http = GatewayHTTP(gateway)
            let me = try await http.signIn("repeat-\(UUID().uuidString)")
            #expect(try await http.send(.DELETE, "/v1/session", token: me.sessionToken).status == 204)
            // The reply was lost; the app sends it again, much later the same day.
            time.advance(23 * 3600)
            let repeated = try await http.send(.DELETE, "/v1/session", token: me.sessionToken)
            #expect(repeated.status == 204, "\(repeated.text)")
            #expect(try OpenAPIDocumentTests.declaredStatuses("delete", "/v1/session").contains(204))
            #expect(try await http.send(.GET, "/v1/me/profile", token: me.sessionToken).status == 401, "still signed out")
            // Past auth's memory of ended sessions: 401, as for a token that never was one.
            time.advance(2 * 3600)
            let late = try await http.send(.DELETE, "/v1/session", token: me.sessionToken)
            #expect(late.status == 401 && late.problem?.code == "unauthenticated")
            let never = try await http.send(.DELETE, "/v1/session", token: "17.never-a-session")
            #expect(never.status == 401 && never.problem?.code == "unauthenticated")
        }
    }

    @Test("a username in the path that is not percent-encoded UTF-8 is the 400 its route declares")
    func usernameNotUTF8() async throws {
        try await GatewaySystem().run { _, gateway in
            // Sent byte for byte: an HTTP client library may decode and re-encode the path.
            let reply = try await RawConnection.get("/v1/usernames/%FF%FE", port: gateway.port)
            let problem = try JSONDecoder().decode(Problem.self, from: reply.body)
            #expect(reply.status == 400 && problem.code == "invalidRequest", "\(reply.status) \(String(decoding: reply.body, as: UTF8.self))")
            #expect(problem.detail.contains("UTF-8"))
            #expect(try OpenAPIDocumentTests.declaredStatuses("get", "/v1/usernames/{username}").contains(reply.status))
        }
    }

    @Test("a sign-in subject with a control character anywhere is a 400 naming it; printable ones sign in")
    func subjectControlCharacters() async throws {
        try await GatewaySystem().run { _, gateway in
            let http = GatewayHTTP(gateway)
            for subject in ["nul\u{0}inside", "trailing-newline\n", "\tleading-tab", "c1\u{85}control"] {
                let reply = try await http.json(.POST, "/v1/session", ["provider": "kakao", "subject": subject])
                #expect(reply.status == 400 && reply.problem?.code == "invalidRequest", "\(subject.debugDescription): \(reply.text)")
                #expect(reply.problem?.detail.contains("control character U+") == true, "\(reply.text)")
            }
            #expect(try OpenAPIDocumentTests.declaredStatuses("post", "/v1/session").contains(400))
            let spaced = try await http.signIn(" 민지 with spaces \(UUID().uuidString) ")
            #expect(spaced.isNewAccount)
        }
    }

    @Test("a name someone holds is 409 usernameTaken (duplicated); a second set-up is 409 profileExists")
    func conflicts() async throws {
        try await GatewaySystem().run { _, gateway in
            let http = GatewayHTTP(gateway)
            let name = "cf\(Int.random(in: 1000...9999))"
            let first = try await http.signIn("first-\(UUID().uuidString)")
            let second = try await http.signIn("second-\(UUID().uuidString)")
            #expect(try await http.setUp(token: first.sessionToken, username: name).status == 201)
            let taken = try await http.setUp(token: second.sessionToken, username: name.uppercased())
            #expect(taken.status == 409 && taken.problem?.code == "usernameTaken" && taken.problem?.reason == "duplicated")
            let twice = try await http.setUp(token: first.sessionToken, username: "other\(Int.random(in: 100...999))")
            #expect(twice.status == 409 && twice.problem?.code == "profileExists")
        }
    }

    @Test("bodies are bounded while they are read: 413 before the services see them")
    func bodyBounds() async throws {
        try await GatewaySystem().run(configure: { $0.maxImageBytes = 100_000 }) { _, gateway in
            let http = GatewayHTTP(gateway)
            let me = try await http.signIn("bounds-\(UUID().uuidString)")
            let huge = Data(repeating: 0x41, count: RequestLimits.smallBody + 1)
            let bigSignIn = try await http.send(.POST, "/v1/session", body: huge, contentType: "application/json")
            #expect(bigSignIn.status == 413 && bigSignIn.problem?.code == "messageTooLarge")

            let bigImage = Data(repeating: 0x89, count: 100_000 + RequestLimits.formOverhead + 1)
            let bigSetUp = try await http.setUp(token: me.sessionToken, username: "bigimg", image: bigImage)
            #expect(bigSetUp.status == 413 && bigSetUp.problem?.code == "messageTooLarge")

            // A form cut short before its closing boundary is refused, not taken without its image.
            var form = MultipartForm()
            form.field("username", "cutshort")
            form.file("image", filename: "me.png", type: "image/png", TestImage.halves(.png, width: 8, height: 8))
            let cut = try await http.send(.POST, "/v1/me/profile", token: me.sessionToken, body: form.body, contentType: form.contentType)
            #expect(cut.status == 400 && cut.problem?.detail.contains("closing boundary") == true)
        }
    }

    @Test("sign-ins and username checks are rate-limited per client address: 429 with Retry-After")
    func rateLimits() async throws {
        try await GatewaySystem().run(configure: {
            $0.signInLimit = .init(burst: 2, perSecond: 0.01)
            $0.usernameCheckLimit = .init(burst: 3, perSecond: 0.01)
        }) { _, gateway in
            let http = GatewayHTTP(gateway)
            _ = try await http.signIn("limited-1-\(UUID().uuidString)")
            _ = try await http.signIn("limited-2-\(UUID().uuidString)")
            let third = try await http.json(.POST, "/v1/session", ["provider": "kakao", "subject": "limited-3"])
            #expect(third.status == 429 && third.problem?.code == "rateLimited")
            let retryAfter = try #require(third.headers.first(name: "retry-after").flatMap(Int.init))
            #expect(retryAfter >= 1)
            for _ in 0..<3 { #expect(try await http.send(.GET, "/v1/usernames/abc").status == 200) }
            let limited = try await http.send(.GET, "/v1/usernames/abc")
            #expect(limited.status == 429 && limited.headers.first(name: "retry-after") != nil)
        }
    }

    @Test("every route in the route list answers (never 404 notFound)")
    func everyRouteAnswers() async throws {
        try await GatewaySystem().run { _, gateway in
            let http = GatewayHTTP(gateway)
            for (method, path) in OnboardingGateway.routeList where path != "/v1/me/intents" {
                let reply = try await http.send(
                    HTTPMethod(rawValue: method), path.replacingOccurrences(of: "{username}", with: "someone"), token: "x")
                #expect(reply.status != 404, "\(method) \(path)")
            }
        }
    }

    @Test("health names the gateway, its dependencies and its streams")
    func health() async throws {
        try await GatewaySystem().run { _, gateway in
            let reply = try await GatewayHTTP(gateway).send(.GET, "/v1/health")
            #expect(reply.status == 200)
            let health = try reply.decode(GatewayHealth.self)
            #expect(health.service == "onboarding-gateway" && health.status == "ok")
            #expect(health.dependencies.map(\.status) == ["ok", "ok", "ok"])
            #expect(health.streams.following)
        }
    }

    @Test("the services down: 503 with Retry-After, never a guess")
    func servicesDown() async throws {
        let system = try GatewaySystem()
        try await system.runServices(orchestrator: true) { system in
            var configuration = system.gatewayConfiguration()
            configuration.profileRPC = "inproc://nobody-here"
            configuration.callTimeout = .milliseconds(200)
            configuration.callDeadline = .milliseconds(600)
            let gateway = try await RunningGateway.start(configuration, bus: system.bus)
            let reply = try await GatewayHTTP(gateway).send(.GET, "/v1/usernames/abc")
            #expect(reply.status == 503 && reply.problem?.code == "noResponder")
            #expect(reply.headers.first(name: "retry-after") == "1")
            await gateway.stop()
        }
    }
}
