import Foundation

/// A JSON Schema (draft 2020-12) validator for the subset `proto/schemas` uses.
///
/// Assertions: `type` (a name or an array of names), `enum`, `const`, `properties`, `required`,
/// `additionalProperties` (`false` or a schema), `items`, `pattern` (unanchored, as the spec
/// says, and with ECMA-262's `$`: the end of the text only, never before a last line break as
/// ICU's), `minLength`/`maxLength` (in code points), `minimum`/`maximum`, `anyOf`, and `$ref` to
/// `#/$defs/…` in the same file or `<file>#/$defs/…` in another file of the folder. `$ref` may
/// sit beside other keywords; both apply. Annotations (`title`, `description`, `examples`,
/// `format`, …) are ignored. Any other keyword is reported as an error, so that a schema never
/// passes because the validator did not understand it.
struct SchemaValidator {
    /// Schema documents by file name (`common.schema.json`).
    let documents: [String: JSONValue]

    static let annotations: Set<String> = [
        "$schema", "$id", "$defs", "$comment", "title", "description", "examples", "format", "default",
    ]
    static let assertions: Set<String> = [
        "$ref", "type", "enum", "const", "properties", "required", "additionalProperties", "items", "pattern",
        "minLength", "maxLength", "minimum", "maximum", "anyOf",
    ]

    /// Loads every `*.json` file in `folder`.
    init(folder: URL) throws {
        var documents: [String: JSONValue] = [:]
        for name in try FileManager.default.contentsOfDirectory(atPath: folder.path) where name.hasSuffix(".json") {
            documents[name] = try JSONValue.parse(Data(contentsOf: folder.appendingPathComponent(name)))
        }
        self.documents = documents
    }

    init(documents: [String: JSONValue]) {
        self.documents = documents
    }

    /// The problems of `instance` against the schema file `file`; empty when it is valid.
    func validate(_ instance: JSONValue, against file: String) -> [String] {
        validate(instance, reference: file)
    }

    /// The problems of `instance` against a reference such as `common.schema.json#/$defs/Uid`.
    func validate(_ instance: JSONValue, reference: String) -> [String] {
        var errors: [String] = []
        follow(reference, from: "", instance: instance, path: "$", errors: &errors)
        return errors
    }

    private func follow(_ reference: String, from document: String, instance: JSONValue, path: String, errors: inout [String]) {
        let parts = reference.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false)
        let file = parts[0].isEmpty ? document : String(parts[0])
        guard var schema = documents[file] else {
            errors.append("\(path): $ref \(reference): no schema file \(file)")
            return
        }
        if parts.count == 2, !parts[1].isEmpty {
            for token in parts[1].split(separator: "/") {
                let key = token.replacingOccurrences(of: "~1", with: "/").replacingOccurrences(of: "~0", with: "~")
                guard let next = schema[key] else {
                    errors.append("\(path): $ref \(reference) points at nothing")
                    return
                }
                schema = next
            }
        }
        check(instance, schema: schema, document: file, path: path, errors: &errors)
    }

    private func check(_ instance: JSONValue, schema: JSONValue, document: String, path: String, errors: inout [String]) {
        if case .bool(let allowed) = schema {
            if !allowed { errors.append("\(path): no value is allowed here") }
            return
        }
        guard let keywords = schema.objectValue else {
            errors.append("\(path): a schema must be an object or a boolean, not \(schema)")
            return
        }
        for key in keywords.keys where !Self.annotations.contains(key) && !Self.assertions.contains(key) {
            errors.append("\(path): unsupported schema keyword \(key) in \(document)")
        }
        if let reference = keywords["$ref"]?.stringValue {
            follow(reference, from: document, instance: instance, path: path, errors: &errors)
        }
        if let type = keywords["type"] {
            let names = type.arrayValue?.compactMap(\.stringValue) ?? type.stringValue.map { [$0] } ?? []
            if !names.contains(where: { Self.instance(instance, hasType: $0) }) {
                errors.append("\(path): \(instance) is not of type \(names.joined(separator: " or "))")
            }
        }
        if let options = keywords["enum"]?.arrayValue, !options.contains(where: { $0.sameJSON(as: instance) }) {
            errors.append("\(path): \(instance) is not one of \(JSONValue.array(options))")
        }
        if let constant = keywords["const"], !constant.sameJSON(as: instance) {
            errors.append("\(path): \(instance) is not \(constant)")
        }
        if let anyOf = keywords["anyOf"]?.arrayValue {
            let branches = anyOf.map { branch in
                var branchErrors: [String] = []
                check(instance, schema: branch, document: document, path: path, errors: &branchErrors)
                return branchErrors
            }
            if !branches.contains(where: \.isEmpty) {
                errors.append("\(path): \(instance) matches none of anyOf: \(branches.flatMap { $0 }.joined(separator: "; "))")
            }
        }
        switch instance {
        case .object(let members):
            checkObject(members, keywords: keywords, document: document, path: path, errors: &errors)
        case .array(let elements):
            if let items = keywords["items"] {
                for (index, element) in elements.enumerated() {
                    check(element, schema: items, document: document, path: "\(path)[\(index)]", errors: &errors)
                }
            }
        case .string(let text):
            checkString(text, keywords: keywords, path: path, errors: &errors)
        case .int, .double:
            let number = instance.numberValue ?? 0
            if let minimum = keywords["minimum"]?.numberValue, number < minimum {
                errors.append("\(path): \(number) is less than \(minimum)")
            }
            if let maximum = keywords["maximum"]?.numberValue, number > maximum {
                errors.append("\(path): \(number) is more than \(maximum)")
            }
        case .null, .bool:
            break
        }
    }

    private func checkObject(
        _ members: [String: JSONValue], keywords: [String: JSONValue], document: String, path: String, errors: inout [String]
    ) {
        let properties = keywords["properties"]?.objectValue ?? [:]
        for name in keywords["required"]?.arrayValue?.compactMap(\.stringValue) ?? [] where members[name] == nil {
            errors.append("\(path): missing required property \(name)")
        }
        for (name, value) in members.sorted(by: { $0.key < $1.key }) {
            if let property = properties[name] {
                check(value, schema: property, document: document, path: "\(path).\(name)", errors: &errors)
            } else if let additional = keywords["additionalProperties"] {
                check(value, schema: additional, document: document, path: "\(path).\(name)", errors: &errors)
            }
        }
    }

    private func checkString(_ text: String, keywords: [String: JSONValue], path: String, errors: inout [String]) {
        let length = text.unicodeScalars.count
        if let minimum = keywords["minLength"]?.numberValue, Double(length) < minimum {
            errors.append("\(path): \"\(text)\" is shorter than \(Int(minimum))")
        }
        if let maximum = keywords["maxLength"]?.numberValue, Double(length) > maximum {
            errors.append("\(path): \"\(text)\" is longer than \(Int(maximum))")
        }
        if let pattern = keywords["pattern"]?.stringValue {
            do {
                let expression = try NSRegularExpression(pattern: Self.ecmaEnd(pattern))
                let range = NSRange(text.startIndex..<text.endIndex, in: text)
                if expression.firstMatch(in: text, range: range) == nil {
                    errors.append("\(path): \"\(text)\" does not match \(pattern)")
                }
            } catch {
                errors.append("\(path): the pattern \(pattern) is not a valid regular expression")
            }
        }
    }

    static func instance(_ instance: JSONValue, hasType name: String) -> Bool {
        switch (name, instance) {
        case ("null", .null), ("boolean", .bool), ("string", .string), ("array", .array), ("object", .object),
            ("number", .int), ("number", .double), ("integer", .int):
            true
        case ("integer", .double(let value)):
            value.rounded() == value && value.isFinite
        default:
            false
        }
    }
}

extension SchemaValidator {
    /// `pattern` with each `$` outside a character class as `\z`: in ECMA-262 (the dialect JSON
    /// Schema names) `$` is the end of the text, while ICU's also matches before a last line
    /// break, which would let `"a\n"` pass `^[^\n]*$`.
    static func ecmaEnd(_ pattern: String) -> String {
        var out = ""
        var escaped = false
        var inClass = false
        for character in pattern {
            if escaped {
                out.append(character)
                escaped = false
                continue
            }
            switch character {
            case "\\": escaped = true; out.append(character)
            case "[": inClass = true; out.append(character)
            case "]": inClass = false; out.append(character)
            case "$" where !inClass: out += "\\z"
            default: out.append(character)
            }
        }
        return out
    }
}
