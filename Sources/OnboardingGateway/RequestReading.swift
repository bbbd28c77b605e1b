import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import OnboardingAPI

/// The bounds on what a request may send.
public enum RequestLimits {
    /// A JSON body (sign-in): far more than any valid one needs.
    public static let smallBody = 64 * 1024
    /// What a set-up may carry beyond its image: the username field and the multipart framing.
    public static let formOverhead = 64 * 1024
}

extension HTTPField.Name {
    static let idempotencyKey = HTTPField.Name("Idempotency-Key")!
    static let lastEventID = HTTPField.Name("Last-Event-ID")!
}

extension Request {
    /// The body, read up to `limit` bytes: a larger `Content-Length` is refused before anything
    /// is read, and a body without one is refused as soon as it passes the limit.
    ///
    /// - Throws: ``ProblemError`` `messageTooLarge` (413).
    func boundedBody(limit: Int) async throws -> ByteBuffer {
        let tooLarge = ProblemError(
            .messageTooLarge, "The request body may be at most \(limit) bytes.")
        if let length = headers[.contentLength].flatMap(Int.init), length > limit { throw tooLarge }
        var collected = ByteBuffer()
        for try await part in body {
            guard collected.readableBytes + part.readableBytes <= limit else { throw tooLarge }
            var part = part
            collected.writeBuffer(&part)
        }
        return collected
    }

    /// The session token of `Authorization: Bearer <token>`.
    ///
    /// - Throws: ``ProblemError`` `unauthenticated` (401) when there is none.
    func bearerToken() throws -> String {
        guard let value = headers[.authorization] else {
            throw ProblemError(
                .unauthenticated, "Send Authorization: Bearer <sessionToken>, the token POST /v1/session returned.")
        }
        let parts = value.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else {
            throw ProblemError(.unauthenticated, "The Authorization header must be 'Bearer <sessionToken>'.")
        }
        let token = parts[1].trimmingCharacters(in: .whitespaces)
        guard !token.isEmpty, token.utf8.count <= 512 else {
            throw ProblemError(.unauthenticated, "The Authorization header must be 'Bearer <sessionToken>'.")
        }
        return token
    }

    /// The media type of the body (without parameters), lowercased.
    var mediaType: String? {
        headers[.contentType].map {
            $0.split(separator: ";", maxSplits: 1)[0].trimmingCharacters(in: .whitespaces).lowercased()
        }
    }

    /// Checks that the body is JSON.
    func requireJSON() throws {
        guard let type = mediaType, type == "application/json" || type.hasSuffix("+json") else {
            throw ProblemError(.unsupportedMediaType, "Send the body as application/json.")
        }
    }
}

/// Decodes JSON bodies strictly: an object with only the fields the type has (payloads are
/// closed, as on the bus), every problem named in a 400 problem.
enum StrictJSON {
    static func decode<T: Decodable>(_ type: T.Type, from buffer: ByteBuffer, allowedFields: Set<String>) throws -> T {
        let data = Data(buffer.readableBytesView)
        guard let object = (try? JSONSerialization.jsonObject(with: data, options: [])) as? [String: Any] else {
            throw ProblemError(.invalidRequest, "The body must be one JSON object.")
        }
        let unknown = Set(object.keys).subtracting(allowedFields).sorted()
        if !unknown.isEmpty {
            throw ProblemError(
                .invalidRequest,
                "Unknown field\(unknown.count == 1 ? "" : "s") \(unknown.joined(separator: ", ")); this body takes only \(allowedFields.sorted().joined(separator: ", ")).")
        }
        do {
            return try JSONDecoder().decode(T.self, from: data)
        } catch let DecodingError.keyNotFound(key, _) {
            throw ProblemError(.invalidRequest, "The field \(key.stringValue) is required.")
        } catch let DecodingError.typeMismatch(_, context), let DecodingError.valueNotFound(_, context) {
            throw ProblemError(.invalidRequest, "The field \(context.codingPath.map(\.stringValue).joined(separator: ".")) has the wrong type.")
        } catch let DecodingError.dataCorrupted(context) {
            let field = context.codingPath.map(\.stringValue).joined(separator: ".")
            throw ProblemError(.invalidRequest, field.isEmpty ? "The body is not valid JSON." : "The field \(field) has a value it does not take.")
        } catch {
            throw ProblemError(.invalidRequest, "The body could not be read: \(error)")
        }
    }
}

/// The set-up form: `username`, and an optional `image` file.
struct SetUpForm: Sendable {
    var username: String
    var image: Data?
    var imageContentType: String?

    /// Parses a `multipart/form-data` body.
    ///
    /// - Throws: ``ProblemError`` `unsupportedMediaType` for another type, `invalidRequest` for
    ///   a malformed body, a missing or repeated `username`, a repeated `image`, or any other field.
    static func parse(contentType: String?, body: ByteBuffer) throws -> SetUpForm {
        guard let contentType,
            contentType.split(separator: ";")[0].trimmingCharacters(in: .whitespaces).lowercased() == "multipart/form-data"
        else {
            throw ProblemError(
                .unsupportedMediaType, "Send the set-up as multipart/form-data with a username field and an optional image file.")
        }
        guard let boundary = Self.boundary(in: contentType) else {
            throw ProblemError(.invalidRequest, "The multipart/form-data Content-Type has no boundary parameter.")
        }
        let parts = try MultipartFormReader(boundary: boundary).parts(of: Array(body.readableBytesView))
        var username: String?
        var image: FormPart?
        for part in parts {
            switch part.disposition("name") {
            case "username":
                guard username == nil else { throw ProblemError(.invalidRequest, "Send the username field once.") }
                username = String(decoding: part.body.readableBytesView, as: UTF8.self)
            case "image":
                guard image == nil else { throw ProblemError(.invalidRequest, "Send at most one image.") }
                image = part
            case let name?:
                throw ProblemError(.invalidRequest, "Unknown field \(name); the set-up takes only username and image.")
            case nil:
                throw ProblemError(.invalidRequest, "Every part needs a Content-Disposition: form-data; name=\"…\" header.")
            }
        }
        guard let username else {
            throw ProblemError(.invalidRequest, "The username field is required.")
        }
        // A browser sends an empty, nameless file part when no file was chosen: that is no image.
        if let part = image, part.body.readableBytes == 0,
            (part.disposition("filename") ?? "").isEmpty
        {
            image = nil
        }
        return SetUpForm(
            username: username, image: image.map { Data($0.body.readableBytesView) },
            imageContentType: image?.header("content-type"))
    }

    static func boundary(in contentType: String) -> String? {
        for parameter in contentType.split(separator: ";").dropFirst() {
            let pair = parameter.split(separator: "=", maxSplits: 1)
            guard pair.count == 2, pair[0].trimmingCharacters(in: .whitespaces).lowercased() == "boundary" else { continue }
            var value = pair[1].trimmingCharacters(in: .whitespaces)
            if value.hasPrefix("\""), value.hasSuffix("\""), value.count >= 2 { value = String(value.dropFirst().dropLast()) }
            return value.isEmpty || value.utf8.count > 200 ? nil : value
        }
        return nil
    }
}

/// Splits a `multipart/form-data` body (RFC 7578, RFC 2046) into its parts.
///
/// Written for untrusted input: every malformed body is an ``ProblemError`` `invalidRequest`,
/// never a crash; header sections are bounded (8 KiB a part) and must be ASCII.
struct MultipartFormReader {
    let boundary: String

    static let maxHeaderBytes = 8 * 1024

    func parts(of body: [UInt8]) throws -> [FormPart] {
        let malformed = ProblemError(.invalidRequest, "The multipart/form-data body could not be read.")
        let delimiter = Array("--\(boundary)".utf8)
        let crlf: [UInt8] = [13, 10]
        // The first delimiter: at the very start, or after a preamble and a CRLF.
        var position: Int
        if body.starts(with: delimiter) {
            position = delimiter.count
        } else if let found = Self.find(crlf + delimiter, in: body, from: 0) {
            position = found + 2 + delimiter.count
        } else {
            throw ProblemError(.invalidRequest, "The multipart/form-data body has no part with the boundary its Content-Type names.")
        }
        var parts: [FormPart] = []
        while true {
            // After a delimiter: "--" closes the body; otherwise (optional spaces and) CRLF.
            if body[position...].starts(with: [45, 45]) { return parts }
            while position < body.count, body[position] == 32 || body[position] == 9 { position += 1 }
            guard body[position...].starts(with: crlf) else { throw malformed }
            position += 2
            var part = FormPart()
            // Headers, up to an empty line (right away when the part has none).
            guard let blank = Self.find(crlf + crlf, in: body, from: position - 2, within: Self.maxHeaderBytes + 4) else {
                throw ProblemError(.invalidRequest, "A part's headers are missing their blank line, or longer than 8 KiB.")
            }
            if blank > position - 2 {
                for line in body[position..<blank].split(separator: 10, omittingEmptySubsequences: true) {
                    let text = line.last == 13 ? line.dropLast() : line[...]
                    guard text.allSatisfy({ $0 == 9 || (32...126).contains($0) }),
                        let colon = text.firstIndex(of: 58), colon > text.startIndex
                    else {
                        throw ProblemError(.invalidRequest, "A part's header is not 'Name: value' in ASCII.")
                    }
                    let name = String(decoding: text[..<colon], as: UTF8.self).trimmingCharacters(in: .whitespaces).lowercased()
                    let value = String(decoding: text[text.index(after: colon)...], as: UTF8.self).trimmingCharacters(in: .whitespaces)
                    part.headers.append((name, value))
                }
            }
            position = blank + 4
            // The content, up to CRLF and the next delimiter.
            guard let end = Self.find(crlf + delimiter, in: body, from: position) else {
                throw ProblemError(
                    .invalidRequest, "The multipart/form-data body ends before its closing boundary; send it whole.")
            }
            part.body = ByteBuffer(bytes: body[position..<end])
            parts.append(part)
            position = end + 2 + delimiter.count
        }
    }

    /// Where `needle` first occurs in `haystack` at or after `start` (and, given `within`,
    /// starting no more than that many bytes after it).
    static func find(_ needle: [UInt8], in haystack: [UInt8], from start: Int, within: Int? = nil) -> Int? {
        guard !needle.isEmpty, start >= 0 else { return nil }
        let lastStart = haystack.count - needle.count
        guard start <= lastStart else { return nil }
        let limit = within.map { min(lastStart, start + $0) } ?? lastStart
        let first = needle[0]
        var index = start
        while index <= limit {
            if haystack[index] == first, haystack[index..<(index + needle.count)].elementsEqual(needle) { return index }
            index += 1
        }
        return nil
    }
}

/// One part of a multipart body.
struct FormPart {
    var headers: [(String, String)] = []
    var body = ByteBuffer()

    func header(_ name: String) -> String? { headers.first { $0.0 == name }?.1 }

    /// A parameter of the part's `Content-Disposition` (`name`, `filename`).
    func disposition(_ parameter: String) -> String? {
        guard let value = header("content-disposition") else { return nil }
        for item in value.split(separator: ";").dropFirst() {
            let pair = item.split(separator: "=", maxSplits: 1)
            guard pair.count == 2, pair[0].trimmingCharacters(in: .whitespaces).lowercased() == parameter else { continue }
            var text = pair[1].trimmingCharacters(in: .whitespaces)
            if text.hasPrefix("\""), text.hasSuffix("\""), text.count >= 2 { text = String(text.dropFirst().dropLast()) }
            return text
        }
        return nil
    }
}
