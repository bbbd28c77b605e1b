import Foundation

/// Why a username cannot be used. Reasons travel as these codes; a client turns a code into
/// words in the person's language.
public enum UsernameProblem: String, Codable, Sendable, CaseIterable {
    case empty
    case tooShort
    case tooLong
    case invalidCharacters
    case duplicated
}

/// The username rules of `shared/domain.md`, as pure functions.
///
/// Rules are checked in order (empty, too short, too long, invalid characters) on the NFC form
/// of the name, counting what a person sees (grapheme clusters). `duplicated` is not a format
/// rule: only the profile store can say it.
public enum UsernameRules {
    public static let minimumLength = 2
    public static let maximumLength = 9

    /// The name as stored and shown: the NFC form of what was entered.
    public static func normalized(_ name: String) -> String {
        name.precomposedStringWithCanonicalMapping
    }

    /// The key uniqueness is decided on: the normalized name, letter case ignored.
    public static func uniquenessKey(_ name: String) -> String {
        normalized(name).lowercased()
    }

    /// The first format rule `name` breaks, or `nil` when its format is fine.
    public static func formatProblem(_ name: String) -> UsernameProblem? {
        let name = normalized(name)
        if name.isEmpty { return .empty }
        if name.count < minimumLength { return .tooShort }
        if name.count > maximumLength { return .tooLong }
        if !name.unicodeScalars.allSatisfy(isAllowed) { return .invalidCharacters }
        return nil
    }

    /// ASCII letters and digits, `_`, and precomposed Hangul syllables (가 to 힣).
    public static func isAllowed(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x30...0x39, 0x41...0x5A, 0x61...0x7A, 0x5F: true
        case 0xAC00...0xD7A3: true
        default: false
        }
    }
}
