@testable import AuthService
import Foundation
import OnboardingGateway
import OpenAPIKit
import Testing

/// `proto/openapi.json`: a valid OpenAPI 3.1 document that describes what the gateway does.
@Suite("The OpenAPI document")
struct OpenAPIDocumentTests {
    static let protoDirectory = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("proto")

    static func documentData() throws -> Data {
        try Data(contentsOf: protoDirectory.appendingPathComponent("openapi.json"))
    }

    static func documentObject() throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: documentData()) as? [String: Any])
    }

    /// The statuses the document declares for `method` (lowercase) at the path template `path`.
    static func declaredStatuses(_ method: String, _ path: String) throws -> Set<Int> {
        let paths = try #require(try documentObject()["paths"] as? [String: Any])
        let operation = try #require((paths[path] as? [String: Any])?[method] as? [String: Any], "\(method) \(path)")
        let responses = try #require(operation["responses"] as? [String: Any])
        return Set(responses.keys.compactMap(Int.init))
    }

    @Test("DELETE /v1/session says how a repeat is answered: 204 within auth's memory of ended sessions, 401 after")
    func repeatedSignOutDocumented() throws {
        let hours = Int(AuthStore.endedSessionRetention / 3600)
        let paths = try #require(try Self.documentObject()["paths"] as? [String: Any])
        let signOut = try #require((paths["/v1/session"] as? [String: Any])?["delete"] as? [String: Any])
        let description = try #require(signOut["description"] as? String)
        #expect(description.contains("within the last \(hours) hours is answered 204"), "\(description)")
        #expect(description.contains("After those \(hours) hours, or with a token that never was a session, it is 401"))
        let noContent = try #require(((signOut["responses"] as? [String: Any])?["204"] as? [String: Any])?["description"] as? String)
        #expect(noContent.contains("\(hours) hours") && !noContent.contains("gets 401"), "\(noContent)")
    }

    @Test("it decodes as OpenAPI 3.1 and passes OpenAPIKit's validation")
    func validates() throws {
        let document = try JSONDecoder().decode(OpenAPI.Document.self, from: Self.documentData())
        #expect(document.openAPIVersion.rawValue.hasPrefix("3.1"))
        try document.validate()
        // Every reference resolves.
        _ = try document.locallyDereferenced()
    }

    @Test("it lists exactly the gateway's routes, each with its errors")
    func routes() throws {
        let document = try JSONDecoder().decode(OpenAPI.Document.self, from: Self.documentData())
        var documented: Set<String> = []
        for (path, item) in document.paths {
            guard case .b(let item) = item else { continue }
            for endpoint in item.endpoints {
                documented.insert("\(endpoint.method.rawValue.uppercased()) \(path.rawValue)")
            }
        }
        let served = Set(OnboardingGateway.routeList.map { "\($0.method) \($0.path)" })
        #expect(documented == served)
    }

    @Test("its table of codes and statuses is the gateway's")
    func problemCodes() throws {
        let table = try #require(try Self.documentObject()["x-problem-codes"] as? [String: Int])
        let gateway = Dictionary(uniqueKeysWithValues: ProblemMapping.statuses.map { ($0.0.rawValue, $0.1.code) })
        #expect(table == gateway)
        let schemas = try #require((try Self.documentObject()["components"] as? [String: Any])?["schemas"] as? [String: Any])
        let problem = try #require(schemas["Problem"] as? [String: Any])
        let codes = try #require(((problem["properties"] as? [String: Any])?["code"] as? [String: Any])?["enum"] as? [String])
        #expect(Set(codes) == Set(gateway.keys))
    }

    @Test("the components it shares with the bus are the bus's JSON Schemas")
    func sharedSchemas() throws {
        let schemas = try #require((try Self.documentObject()["components"] as? [String: Any])?["schemas"] as? [String: Any])
        var names: [String: String] = [:]
        for (name, value) in schemas {
            guard let source = (value as? [String: Any])?["x-bus-schema"] as? String else { continue }
            if !source.contains("#") { names[source] = name }
        }
        #expect(names.count >= 8)
        for (name, value) in schemas {
            guard let component = value as? [String: Any], let source = component["x-bus-schema"] as? String else { continue }
            let parts = source.split(separator: "#", maxSplits: 1)
            let file = Self.protoDirectory.appendingPathComponent("schemas").appendingPathComponent(String(parts[0]))
            var schema = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: file)) as? [String: Any])
            if parts.count == 2 {
                let definition = String(parts[1].split(separator: "/").last!)
                schema = try #require((schema["$defs"] as? [String: Any])?[definition] as? [String: Any])
            }
            var expected = try #require(Self.rewrite(schema, files: names) as? [String: Any])
            expected["x-bus-schema"] = source
            #expect(
                try Self.canonical(component) == Self.canonical(expected),
                "components/schemas/\(name) differs from \(source); run python3 proto/openapi-sync.py")
        }
    }

    static func canonical(_ object: Any) throws -> String {
        String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), as: UTF8.self)
    }

    /// As `proto/openapi-sync.py` rewrites a bus schema into a component.
    static func rewrite(_ node: Any, files: [String: String]) -> Any {
        if let object = node as? [String: Any] {
            var out: [String: Any] = [:]
            for (key, value) in object where key != "$schema" && key != "$id" {
                if key == "$ref", let reference = value as? String {
                    if reference.hasPrefix("common.schema.json#/$defs/") {
                        out[key] = "#/components/schemas/" + reference.dropFirst("common.schema.json#/$defs/".count)
                    } else {
                        out[key] = files[reference].map { "#/components/schemas/" + $0 } ?? reference
                    }
                } else {
                    out[key] = rewrite(value, files: files)
                }
            }
            return out
        }
        if let array = node as? [Any] { return array.map { rewrite($0, files: files) } }
        return node
    }

    @Test("the gateway serves it at /openapi.json, byte for byte")
    func served() async throws {
        try await GatewaySystem().run { _, gateway in
            let reply = try await GatewayHTTP(gateway).send(.GET, "/openapi.json")
            #expect(reply.status == 200)
            #expect(reply.body == (try Self.documentData()))
        }
    }
}
