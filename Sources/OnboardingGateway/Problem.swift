import Foundation
import HTTPTypes
import Hummingbird
import Messaging
import OnboardingAPI

/// An error response body: RFC 9457 "Problem Details for HTTP APIs" (`application/problem+json`),
/// carrying the bus's stable `code` and `reason` unchanged.
///
/// `type` is `urn:onboarding:problem:<code>`, `title` a fixed sentence per code, `detail` the
/// service's own message for people (it may change; match on `code` and `reason`).
public struct Problem: Codable, Sendable, Hashable {
    public var type: String
    public var title: String
    public var status: Int
    public var detail: String
    /// The bus's error code (`usernameTaken`, `unauthenticated`, …) or one of the gateway's own
    /// (``ErrorCode/notFound``, ``ErrorCode/rateLimited``, …).
    public var code: String
    /// A finer reason where the code has several (`duplicated`, `tooShort`, `tooLarge`, …).
    public var reason: String?

    public init(type: String, title: String, status: Int, detail: String, code: String, reason: String?) {
        self.type = type
        self.title = title
        self.status = status
        self.detail = detail
        self.code = code
        self.reason = reason
    }

    /// The media type of a problem body.
    public static let mediaType = "application/problem+json"
}

extension ErrorCode {
    // The gateway's own codes: about HTTP itself, never sent on the bus.
    /// No route matches the request's path.
    public static let notFound: ErrorCode = "notFound"
    /// The path exists but not with this method.
    public static let methodNotAllowed: ErrorCode = "methodNotAllowed"
    /// The request body is not of a media type this route takes.
    public static let unsupportedMediaType: ErrorCode = "unsupportedMediaType"
    /// Too many requests of this kind from this client address; wait `Retry-After` seconds.
    public static let rateLimited: ErrorCode = "rateLimited"
}

/// How each error code becomes an HTTP status. The README and `proto/openapi.json` list the same
/// table; `GatewayTests` keeps them in agreement.
public enum ProblemMapping {
    /// Every code the gateway can answer with, and its status.
    public static let statuses: [(ErrorCode, HTTPResponse.Status)] = [
        (.invalidRequest, .badRequest),
        (.invalidMessage, .badRequest),
        (.unexpectedFrames, .badRequest),
        (.unsupportedVersion, .badRequest),
        (.unauthenticated, .unauthorized),
        (.notFound, .notFound),
        (.profileNotFound, .notFound),
        (.imageNotFound, .notFound),
        (.unknownType, .notFound),
        (.methodNotAllowed, .methodNotAllowed),
        (.profileExists, .conflict),
        (.usernameTaken, .conflict),
        (.messageTooLarge, .contentTooLarge),
        (.unsupportedMediaType, .unsupportedMediaType),
        (.invalidUsername, .unprocessableContent),
        (.imageRejected, .unprocessableContent),
        (.rateLimited, .tooManyRequests),
        (.internalError, .internalServerError),
        (.overloaded, .serviceUnavailable),
        (.shuttingDown, .serviceUnavailable),
        (.storeUnavailable, .serviceUnavailable),
        (.dependencyUnavailable, .serviceUnavailable),
        (.noResponder, .serviceUnavailable),
        (.closed, .serviceUnavailable),
        (.timeout, .gatewayTimeout),
    ]

    private static let table: [ErrorCode: HTTPResponse.Status] = Dictionary(uniqueKeysWithValues: statuses)

    /// The status for `error`: by its code, except that an image refused as `tooLarge` is 413
    /// like every other body that is too large. An unknown code is a failure: 502.
    public static func status(for error: ServiceError) -> HTTPResponse.Status {
        if error.code == .imageRejected, error.reason == "tooLarge" { return .contentTooLarge }
        return table[error.code] ?? .badGateway
    }

    /// Whether a client may send the same request again after `Retry-After` seconds.
    static func retryAfter(for error: ServiceError) -> Int? {
        switch error.code {
        case .overloaded, .shuttingDown, .noResponder, .dependencyUnavailable, .storeUnavailable, .closed: 1
        default: nil
        }
    }

    static func title(for code: ErrorCode) -> String {
        switch code {
        case .invalidRequest: "The request's values are wrong."
        case .invalidMessage: "The request could not be read."
        case .unauthenticated: "Sign in first: the session is missing, unknown or ended."
        case .notFound: "There is nothing at this path."
        case .methodNotAllowed: "This path does not take this method."
        case .profileNotFound: "The person has no profile."
        case .imageNotFound: "No such image."
        case .profileExists: "The person already has a profile."
        case .usernameTaken: "Someone else already has this username."
        case .messageTooLarge: "The request is too large."
        case .unsupportedMediaType: "The request body is not of a type this route takes."
        case .invalidUsername: "The username breaks a format rule."
        case .imageRejected: "The image was refused."
        case .rateLimited: "Too many requests from this address; wait and try again."
        case .overloaded: "The system is busy; try again shortly."
        case .shuttingDown: "A service is restarting; try again in a moment."
        case .storeUnavailable: "A store failed; nothing was changed. Try again."
        case .dependencyUnavailable, .noResponder, .closed: "A service did not answer; try again."
        case .timeout: "A service did not answer in time; it may or may not have acted."
        case .internalError: "A fault inside the system; it has been logged."
        default: "The request failed."
        }
    }
}

/// A failed HTTP request, answered as `application/problem+json`.
public struct ProblemError: HTTPResponseError, Sendable {
    public var error: ServiceError
    public var status: HTTPResponse.Status
    /// Extra headers: `Retry-After`, `WWW-Authenticate`, `Allow`.
    public var headers: HTTPFields

    public init(_ error: ServiceError, headers: HTTPFields = [:]) {
        self.error = error
        self.status = ProblemMapping.status(for: error)
        self.headers = headers
        if error.code == .unauthenticated, self.headers[.wwwAuthenticate] == nil {
            self.headers[.wwwAuthenticate] = "Bearer realm=\"onboarding\""
        }
        if self.headers[.retryAfter] == nil, let seconds = ProblemMapping.retryAfter(for: error) {
            self.headers[.retryAfter] = String(seconds)
        }
    }

    public init(_ code: ErrorCode, _ message: String, reason: String? = nil, headers: HTTPFields = [:]) {
        self.init(ServiceError(code, message, reason: reason), headers: headers)
    }

    public var problem: Problem {
        Problem(
            type: "urn:onboarding:problem:\(error.code.rawValue)", title: ProblemMapping.title(for: error.code),
            status: status.code, detail: error.message, code: error.code.rawValue, reason: error.reason)
    }

    public func response(from request: Request, context: some RequestContext) throws -> Response {
        response()
    }

    /// The response, with its problem body.
    public func response() -> Response {
        var fields = headers
        fields[.contentType] = Problem.mediaType
        fields[.cacheControl] = "no-store"
        let body = (try? JSONEncoder.gateway.encode(problem)) ?? Data("{}".utf8)
        return Response(status: status, headers: fields, body: ResponseBody(byteBuffer: ByteBuffer(bytes: body)))
    }

    /// Any error as a problem: a ``ServiceError`` keeps its code; anything else is `internalError`.
    public static func from(_ error: any Error) -> ProblemError {
        switch error {
        case let problem as ProblemError: problem
        case let error as ServiceError: ProblemError(error)
        case let error as HTTPError:
            switch error.status {
            case .notFound: ProblemError(.notFound, "There is nothing at this path; GET /openapi.json lists every route.")
            case .methodNotAllowed: ProblemError(.methodNotAllowed, "This path does not take this method; GET /openapi.json lists what it takes.")
            case .contentTooLarge: ProblemError(.messageTooLarge, error.body ?? "The request body is too large.")
            case .unsupportedMediaType: ProblemError(.unsupportedMediaType, error.body ?? "Unsupported media type.")
            case .badRequest: ProblemError(.invalidRequest, error.body ?? "The request could not be read.")
            case .unauthorized: ProblemError(.unauthenticated, error.body ?? "Sign in first.")
            default:
                error.status.code < 500
                    ? ProblemError(.invalidRequest, error.body ?? "The request was refused (\(error.status.code)).")
                    : ProblemError(.internalError, "A fault inside the gateway; it has been logged.")
            }
        default: ProblemError(.internalError, "A fault inside the gateway; it has been logged.")
        }
    }
}

extension JSONEncoder {
    /// Sorted keys, no escaped slashes: stable bodies for people and tests.
    static var gateway: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }
}
