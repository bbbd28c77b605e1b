import AsyncHTTPClient
import Foundation
import NIOCore

/// An HTTP answer, as much of it as verifying needs.
public struct HTTPAnswer: Sendable, Hashable {
    public var status: Int
    /// Header values by lowercased name (the first of repeated headers).
    public var headers: [String: String]
    public var body: Data

    public init(status: Int, headers: [String: String] = [:], body: Data = Data()) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}

/// The one HTTP call auth makes to providers: a `GET`, optionally with a bearer token.
///
/// Thread safety: implementations are `Sendable` and called from many tasks at once.
public protocol IdentityHTTPClient: Sendable {
    /// - Throws: when no answer came (connection refused, timeout, a body over 1 MiB). Any status
    ///   is an answer.
    func get(_ url: String, bearer: String?, timeout: TimeInterval) async throws -> HTTPAnswer

    /// A `POST` of an `application/x-www-form-urlencoded` body with `headers`.
    ///
    /// - Throws: when no answer came. Any status is an answer.
    func post(_ url: String, headers: [String: String], form: String, timeout: TimeInterval) async throws -> HTTPAnswer
}

/// ``IdentityHTTPClient`` over async-http-client's shared client (its own event loops; never
/// blocks the caller's thread).
public struct AsyncHTTPIdentityClient: IdentityHTTPClient {
    /// The largest body read (1 MiB): key sets and profiles are a few KiB.
    public static let maximumBodyBytes = 1 << 20

    private let client: HTTPClient

    public init(client: HTTPClient = .shared) { self.client = client }

    public func get(_ url: String, bearer: String?, timeout: TimeInterval) async throws -> HTTPAnswer {
        var request = HTTPClientRequest(url: url)
        request.method = .GET
        request.headers.add(name: "Accept", value: "application/json")
        if let bearer { request.headers.add(name: "Authorization", value: "Bearer \(bearer)") }
        return try await execute(request, timeout: timeout)
    }

    public func post(_ url: String, headers: [String: String], form: String, timeout: TimeInterval) async throws -> HTTPAnswer {
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "Accept", value: "application/json")
        request.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        request.body = .bytes(ByteBuffer(string: form))
        return try await execute(request, timeout: timeout)
    }

    private func execute(_ request: HTTPClientRequest, timeout: TimeInterval) async throws -> HTTPAnswer {
        let response = try await client.execute(request, timeout: .milliseconds(Int64(timeout * 1000)))
        let body = try await response.body.collect(upTo: Self.maximumBodyBytes)
        var headers: [String: String] = [:]
        for (name, value) in response.headers where headers[name.lowercased()] == nil {
            headers[name.lowercased()] = value
        }
        return HTTPAnswer(
            status: Int(response.status.code), headers: headers,
            body: Data(body.getBytes(at: body.readerIndex, length: body.readableBytes) ?? []))
    }
}
