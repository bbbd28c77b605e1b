import Foundation
import HTTPTypes
import Messaging
import NIOCore
import OnboardingAPI
import OnboardingClient
@testable import OnboardingGateway
import Testing

@Suite("The gateway's parts, without sockets")
struct GatewayUnitTests {
    @Test(
        "each code has its documented status",
        arguments: [
            ("invalidRequest", 400), ("unauthenticated", 401), ("notFound", 404), ("profileExists", 409),
            ("usernameTaken", 409), ("messageTooLarge", 413), ("unsupportedMediaType", 415), ("invalidUsername", 422),
            ("imageRejected", 422), ("rateLimited", 429), ("overloaded", 503), ("dependencyUnavailable", 503),
            ("noResponder", 503), ("timeout", 504), ("internalError", 500), ("somethingNew", 502),
        ])
    func statuses(code: String, status: Int) {
        #expect(ProblemMapping.status(for: ServiceError(ErrorCode(rawValue: code), "x")).code == status)
    }

    @Test("an image refused as tooLarge is 413 like every body too large")
    func imageTooLarge() {
        #expect(ProblemMapping.status(for: ServiceError(.imageRejected, "x", reason: "tooLarge")) == .contentTooLarge)
    }

    @Test("a problem carries code, reason, its status, and Retry-After where waiting helps")
    func problemBody() throws {
        let problem = ProblemError(ServiceError(.overloaded, "Busy."))
        #expect(problem.headers[.retryAfter] == "1")
        let response = problem.response()
        #expect(response.status == .serviceUnavailable)
        #expect(response.headers[.contentType] == "application/problem+json")
        #expect(problem.problem == Problem(
            type: "urn:onboarding:problem:overloaded", title: "The system is busy; try again shortly.", status: 503,
            detail: "Busy.", code: "overloaded", reason: nil))
        #expect(ProblemError(.unauthenticated, "x").headers[.wwwAuthenticate] == "Bearer realm=\"onboarding\"")
    }

    @Test("a token bucket: a burst, then refusals that say how long to wait")
    func rateLimiter() {
        let limiter = RateLimiter(rule: .init(burst: 3, perSecond: 0.5))
        for _ in 0..<3 { #expect(limiter.take(for: "a") == .allowed) }
        #expect(limiter.take(for: "a") == .limited(retryAfter: 2))
        #expect(limiter.take(for: "b") == .allowed)
    }

    @Test("the rate limiter's memory stays bounded")
    func rateLimiterBound() {
        let limiter = RateLimiter(rule: .init(burst: 1, perSecond: 0.001), maxClients: 10)
        for client in 0..<100 { #expect(limiter.take(for: "client-\(client)") == .allowed) }
    }

    @Test("forwarded addresses are believed only from trusted proxies, read from the right")
    func clientAddress() throws {
        let proxy = try SocketAddress(ipAddress: "10.0.0.2", port: 4000)
        let stranger = try SocketAddress(ipAddress: "203.0.113.9", port: 4000)
        var headers = HTTPFields()
        headers[HTTPField.Name("X-Forwarded-For")!] = "1.2.3.4, 198.51.100.7"
        let none = ClientAddress(trustedProxies: [])
        #expect(none.resolve(peer: proxy, headers: headers) == "10.0.0.2")
        let trusting = ClientAddress(trustedProxies: ["10.0.0.2"])
        #expect(trusting.resolve(peer: proxy, headers: headers) == "198.51.100.7")
        #expect(trusting.resolve(peer: stranger, headers: headers) == "203.0.113.9")
        #expect(trusting.resolve(peer: proxy, headers: [:]) == "10.0.0.2")
    }

    @Test("the set-up form: a username and an optional image; an empty file part from a browser is no image")
    func setUpForm() throws {
        var form = MultipartForm()
        form.field("username", "민지")
        form.file("image", filename: "", type: "application/octet-stream", Data())
        let parsed = try SetUpForm.parse(contentType: form.contentType, body: ByteBuffer(bytes: form.finished))
        #expect(parsed.username == "민지" && parsed.image == nil)

        var withImage = MultipartForm()
        withImage.file("image", filename: "me.png", type: "image/png", Data([1, 2, 3]))
        withImage.field("username", "minji")
        let image = try SetUpForm.parse(contentType: withImage.contentType, body: ByteBuffer(bytes: withImage.finished))
        #expect(image.image == Data([1, 2, 3]) && image.imageContentType == "image/png")
    }

    @Test(
        "the set-up form refuses what it does not take",
        arguments: [
            ("text/plain", "unsupportedMediaType"), ("multipart/form-data", "invalidRequest"),
        ])
    func setUpFormRefusals(contentType: String, code: String) {
        #expect(throws: ProblemError.self) {
            try SetUpForm.parse(contentType: contentType, body: ByteBuffer(string: "x"))
        }
        do {
            _ = try SetUpForm.parse(contentType: contentType, body: ByteBuffer(string: "x"))
        } catch let error as ProblemError {
            #expect(error.error.code.rawValue == code)
        } catch {}
    }

    @Test(
        "the set-up form reader refuses malformed bodies with invalidRequest, never a crash",
        arguments: [
            "--B\r\na\u{F9}\u{F1}--B--\r\n",                       // a header of non-ASCII bytes (crashed MultipartKit 4.7.1)
            "--B\r\nContent-Disposition: form-data; name=\"username\"\r\n\r\nminji",  // no closing delimiter
            "--B\r\nno colon here\r\n\r\nx\r\n--B--",
            "--B",
            "--Bxx",
            "preamble without the boundary",
            "--B\r\n" + String(repeating: "X-Long: y\r\n", count: 1000) + "\r\nx\r\n--B--",
        ])
    func malformedForms(body: String) {
        do {
            _ = try SetUpForm.parse(contentType: "multipart/form-data; boundary=B", body: ByteBuffer(string: body))
            Issue.record("accepted \(body.prefix(60))")
        } catch let error as ProblemError {
            #expect(error.error.code == .invalidRequest)
        } catch {
            Issue.record("\(error)")
        }
    }

    @Test("the set-up form reader: a preamble, a part without headers, and quoted boundaries")
    func formShapes() throws {
        let body = "ignored preamble\r\n--B\r\n\r\nheaderless\r\n--B\r\nContent-Disposition: form-data; name=\"username\"\r\n\r\nmin\r\nji\r\n--B--\r\nepilogue"
        let parts = try MultipartFormReader(boundary: "B").parts(of: Array(body.utf8))
        #expect(parts.count == 2)
        #expect(parts[0].headers.isEmpty && String(buffer: parts[0].body) == "headerless")
        #expect(parts[1].disposition("name") == "username" && String(buffer: parts[1].body) == "min\r\nji")
        #expect(SetUpForm.boundary(in: "multipart/form-data; boundary=\"a b\"") == "a b")
    }

    @Test("the set-up form: unknown, repeated and missing fields are refused")
    func setUpFormFields() throws {
        var extra = MultipartForm()
        extra.field("username", "minji")
        extra.field("admin", "1")
        var twice = MultipartForm()
        twice.field("username", "a")
        twice.field("username", "b")
        let empty = MultipartForm()
        for form in [extra, twice, empty] {
            #expect(throws: ProblemError.self) {
                try SetUpForm.parse(contentType: form.contentType, body: ByteBuffer(bytes: form.finished))
            }
        }
    }

    @Test("the event-stream text: an intent's id is its sequence; a heartbeat moves the id with no data")
    func eventText() {
        let intent = RouteIntent(intentId: "i1", uid: "u1", intent: .dismiss, reason: .profileCreated)
        let text = ServerSentEvents.intent(ReceivedIntent(intent: intent, time: "2026-11-23T00:00:00.000Z", sequence: 42))
        #expect(text.hasPrefix("id: 42\nevent: intent\ndata: {"))
        #expect(text.hasSuffix("}\n\n"))
        #expect(!text.dropLast(2).contains("\n\n"))
        #expect(ServerSentEvents.heartbeat(through: 50) == "id: 50\n: heartbeat\n\n")
        #expect(ServerSentEvents.position(51) == "id: 51\n: caught up\n\n")
        var parser = EventStreamReader.Parser()
        let events = parser.feed(Array((ServerSentEvents.opening() + text + ServerSentEvents.heartbeat(through: 50)).utf8))
        #expect(events.count == 2)
        #expect(events[0].state?.intent == intent && events[0].sequence == 42)
        #expect(events[1].data == nil && events[1].sequence == 50)
    }
}
