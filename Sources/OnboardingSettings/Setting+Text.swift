import Foundation

/// What people read of the settings: the flags on a command line, `--help`, `--print-config`
/// and the README's table, all made from the one declaration of each setting.
extension Setting {
    /// The settings given on a command line as `--name value`, `--name=value`, or a bare
    /// `--name` for an on/off setting.
    ///
    /// - Throws: ``SettingError`` for a flag that is not one of `program`'s settings, or one
    ///   without a value.
    public static func parseFlags(_ arguments: [String], for program: Program) throws -> [Setting: String] {
        let byFlag = Dictionary(uniqueKeysWithValues: program.settings.map { ($0.flag, $0) })
        var values: [Setting: String] = [:]
        var index = arguments.startIndex
        while index < arguments.endIndex {
            let argument = arguments[index]
            index += 1
            let name: String
            var value: String?
            if let equals = argument.firstIndex(of: "=") {
                name = String(argument[..<equals])
                value = String(argument[argument.index(after: equals)...])
            } else {
                name = argument
            }
            guard let setting = byFlag[name] else {
                if let other = Setting.all.first(where: { $0.flag == name }) {
                    let readers = other.programs.sorted().map(\.rawValue).joined(separator: ", ")
                    throw SettingError("\(name) is not a setting of \(program.rawValue) (it is read by \(readers)).")
                }
                throw SettingError("\(argument) is not a setting of \(program.rawValue); \(program.rawValue) --help lists them.")
            }
            if value == nil {
                if index < arguments.endIndex, !arguments[index].hasPrefix("--") {
                    value = arguments[index]
                    index += 1
                } else if setting.kind == .toggle {
                    value = "1"
                } else {
                    throw SettingError("\(name) needs a value: \(name) VALUE or \(name)=VALUE.")
                }
            }
            values[setting] = value
        }
        return values
    }

    /// The lines `--help` shows for `program`'s settings, grouped and wrapped at `width`.
    public static func help(for program: Program, width: Int = 80) -> String {
        var lines: [String] = []
        for group in Group.allCases {
            let settings = program.settings.filter { $0.group == group }
            guard !settings.isEmpty else { continue }
            lines.append("\(group.rawValue.uppercased()):")
            for setting in settings {
                var head = "  \(setting.flag) <\(setting.placeholder)>"
                if setting.kind == .toggle { head = "  \(setting.flag)[=1|0]" }
                lines.append(head)
                var text = setting.meaning.prefix(1).uppercased() + setting.meaning.dropFirst()
                if let allowed = setting.allowedText, setting.kind != .toggle { text += " (\(allowed))" }
                text += ". Env: \(setting.environmentVariable). Default: \(setting.defaultText)."
                lines += wrap(text, width: width, indent: "        ")
            }
            lines.append("")
        }
        return lines.joined(separator: "\n")
    }

    /// What a value looks like, for `--help`.
    var placeholder: String {
        switch kind {
        case .endpoint: "endpoint"
        case .endpoints: "endpoint,..."
        case .httpAddress: "http-address"
        case .path: "path"
        case .text: isSecret ? "secret" : "text"
        case .integer: "n"
        case .toggle: "1|0"
        case .list: "a,b,..."
        case .url: "url"
        case .choice: "level"
        }
    }

    /// The README's Configuration table: every setting, grouped, with its default and range,
    /// who reads it and what it does. A test keeps the README's copy equal to this.
    public static func markdownTables() -> String {
        var out = ["| variable | flag | default | read by | what it does |", "|---|---|---|---|---|"]
        for group in Group.allCases {
            let settings = all.filter { $0.group == group }
            guard !settings.isEmpty else { continue }
            out.append("| **\(group.rawValue)** | | | | |")
            for setting in settings {
                var defaultCell = "`\(setting.defaultText)`"
                if case .value = setting.defaultValue {} else { defaultCell = setting.defaultText }
                if let allowed = setting.allowedText, ![.toggle, .path, .endpoint, .endpoints, .httpAddress].contains(setting.kind) {
                    defaultCell += " (\(allowed))"
                }
                let readers = setting.programs.sorted().map(\.shortName).joined(separator: ", ")
                let meaning = setting.meaning + (setting.isSecret ? "; a secret, never printed" : "")
                out.append(
                    "| `\(setting.environmentVariable)` | `\(setting.flag)` | \(escaped(defaultCell)) | \(readers) | \(escaped(meaning)) |")
            }
        }
        return out.joined(separator: "\n") + "\n"
    }

    private static func escaped(_ text: String) -> String {
        text.replacingOccurrences(of: "|", with: "\\|")
    }

    static func wrap(_ text: String, width: Int, indent: String) -> [String] {
        var lines: [String] = []
        var line = indent
        for word in text.split(separator: " ") {
            if line.count > indent.count, line.count + 1 + word.count > width {
                lines.append(line)
                line = indent
            }
            line += (line.count > indent.count ? " " : "") + word
        }
        if line.count > indent.count { lines.append(line) }
        return lines
    }
}

extension Settings {
    /// One line per setting of `program`: its variable, the value in force (`<secret>` for a
    /// secret that is set) and where it came from. `dataDirectory` fills in derived defaults.
    public func effectiveConfiguration(for program: Program) -> String {
        let settings = program.settings
        let width = settings.map(\.environmentVariable.count).max() ?? 0
        let dataDirectory = text(.dataDir) ?? ".data"
        return settings.map { setting in
            let value: String
            let source: Source
            if let (text, from) = raw(setting) {
                value = setting.isSecret ? "<secret>" : text
                source = from
            } else {
                value = setting.defaultText.replacingOccurrences(of: "<data-dir>", with: dataDirectory)
                source = .defaultValue
            }
            let name = setting.environmentVariable.padding(toLength: width, withPad: " ", startingAt: 0)
            return "\(name)  \(value)  (\(source))"
        }.joined(separator: "\n")
    }

    /// Reads every setting of `program` as its kind says, so that a value that cannot work
    /// fails start-up before anything else is done.
    ///
    /// - Throws: the first ``SettingError``.
    public func validate(for program: Program) throws {
        for setting in program.settings where raw(setting) != nil {
            switch setting.kind {
            case .endpoint, .endpoints: _ = try endpoint(setting)
            case .httpAddress:
                // One that is off unless set may also be set to off.
                if case .unset = setting.defaultValue { _ = try optionalHTTPAddress(setting) } else { _ = try httpAddress(setting) }
            case .integer: _ = try optionalInteger(setting)
            case .toggle: _ = try toggle(setting)
            case .url: _ = try url(setting)
            case .choice: _ = try choice(setting)
            case .path, .text, .list: break
            }
        }
    }
}
