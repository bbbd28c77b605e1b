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
///
/// **Bounded work.** Unicode normalization reorders runs of combining marks, so its cost grows
/// with the square of such a run: one 62 KiB name of combining marks took 2.6 s of CPU. Before
/// normalizing, ``check(_:)`` therefore bounds the input, in this order:
/// 1. more than ``maximumBytes`` UTF-8 bytes is `tooLong`: a valid name has at most 9
///    characters, each at most 9 bytes however it is written (a Hangul syllable as three
///    conjoining jamo), so 81 bytes; 256 leaves room for anything a person types;
/// 2. more than ``maximumCombiningMarks`` combining marks (Unicode general category M) is
///    `invalidCharacters`: no allowed character is or contains a combining mark (ASCII has
///    none, and Hangul syllables decompose into jamo, which are letters), so any mark makes a
///    name invalid; the cap only decides that a name with many is refused without normalizing.
///
/// A name within both bounds is normalized once and judged by the rules as written. Beyond
/// them the reason can differ from what the full rules would give (`a` with 300 marks is one
/// character, `tooShort` by the rules, `tooLong` here), never whether the name is accepted.
public enum UsernameRules {
    public static let minimumLength = 2
    public static let maximumLength = 9
    /// The most UTF-8 bytes a name may have before it is normalized; more is `tooLong`.
    public static let maximumBytes = 256
    /// The most combining marks a name may have before it is normalized; more is
    /// `invalidCharacters`.
    public static let maximumCombiningMarks = 16

    /// A name checked once: its normalized form and the first rule it breaks.
    public struct Checked: Sendable, Hashable {
        /// The name as stored and shown (NFC); the name as sent when it was refused before
        /// normalizing (over ``maximumBytes`` or ``maximumCombiningMarks``).
        public var normalized: String
        /// The first format rule the name breaks, or `nil`.
        public var problem: UsernameProblem?

        /// The key uniqueness is decided on (the normalized name, letter case ignored), for a
        /// name whose format is fine.
        public var uniquenessKey: String? { problem == nil ? normalized.lowercased() : nil }
    }

    /// Checks `name` against the format rules, normalizing it at most once and only within the
    /// bounds above. Costs microseconds whatever the input.
    public static func check(_ name: String) -> Checked {
        check(name) { $0.precomposedStringWithCanonicalMapping }
    }

    /// ``check(_:)`` with the normalization given, so tests can see what it is run on.
    static func check(_ name: String, normalizingWith normalize: (String) -> String) -> Checked {
        if name.utf8.count > maximumBytes { return Checked(normalized: name, problem: .tooLong) }
        var marks = 0
        for scalar in name.unicodeScalars where isCombiningMark(scalar) {
            marks += 1
            if marks > maximumCombiningMarks { return Checked(normalized: name, problem: .invalidCharacters) }
        }
        let normalized = normalize(name)
        return Checked(normalized: normalized, problem: problem(ofNormalized: normalized))
    }

    /// The name as stored and shown: the NFC form of what was entered. Unbounded: for names
    /// from outside, use ``check(_:)``.
    public static func normalized(_ name: String) -> String {
        name.precomposedStringWithCanonicalMapping
    }

    /// The key uniqueness is decided on: the normalized name, letter case ignored.
    public static func uniquenessKey(_ name: String) -> String {
        normalized(name).lowercased()
    }

    /// The first format rule `name` breaks, or `nil` when its format is fine (``check(_:)``'s
    /// verdict).
    public static func formatProblem(_ name: String) -> UsernameProblem? {
        check(name).problem
    }

    /// The rules, on a name already in NFC.
    private static func problem(ofNormalized name: String) -> UsernameProblem? {
        if name.isEmpty { return .empty }
        let length = name.count
        if length < minimumLength { return .tooShort }
        if length > maximumLength { return .tooLong }
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

    private static func isCombiningMark(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.properties.generalCategory {
        case .nonspacingMark, .spacingMark, .enclosingMark: true
        default: false
        }
    }
}
