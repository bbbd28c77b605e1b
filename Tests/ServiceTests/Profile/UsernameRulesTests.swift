import OnboardingAPI
import Testing

extension ProfileServiceTests {
    @Suite("Username rules")
    struct UsernameRulesTests {
        /// The rules in the order the domain gives them; `nil` means the format is fine.
        static let table: [(name: String, problem: UsernameProblem?, why: String)] = [
            ("", .empty, "empty"),
            ("a", .tooShort, "1 character"),
            ("ab", nil, "2 characters: the shortest allowed"),
            ("abcdefghi", nil, "9 characters: the longest allowed"),
            ("abcdefghij", .tooLong, "10 characters"),
            ("가나다라마바사아자", nil, "9 composed Hangul syllables"),
            ("가나다라마바사아자차", .tooLong, "10 composed Hangul syllables"),
            ("\u{1100}\u{1161}\u{11A8}", .tooShort, "decomposed jamo that make one syllable (각)"),
            ("\u{1100}\u{1161}\u{11A8}\u{1102}\u{1161}", nil, "decomposed jamo that make two syllables (각나)"),
            ("ㄱㄴ", .invalidCharacters, "compatibility jamo, not syllables"),
            ("😀😀", .invalidCharacters, "emoji"),
            ("👨‍👩‍👧", .tooShort, "one emoji a person sees as one character"),
            ("mi na", .invalidCharacters, "a space"),
            ("mi-na", .invalidCharacters, "a hyphen"),
            ("mi_na", nil, "an underscore"),
            ("MiNa2", nil, "mixed case and a digit"),
            ("café", .invalidCharacters, "a letter outside ASCII"),
            (" ", .tooShort, "length is checked before characters"),
            ("abcdefghi-", .tooLong, "length is checked before characters"),
        ]

        @Test("each name breaks the first rule it fails, or none", arguments: table)
        func formatProblem(_ row: (name: String, problem: UsernameProblem?, why: String)) {
            #expect(UsernameRules.formatProblem(row.name) == row.problem, "\(row.why)")
        }

        @Test("decomposed and composed Hangul share one form and one uniqueness key")
        func normalization() {
            let decomposed = "\u{1100}\u{1161}\u{11A8}\u{1102}\u{1161}"
            #expect(UsernameRules.normalized(decomposed) == "각나")
            #expect(UsernameRules.uniquenessKey(decomposed) == UsernameRules.uniquenessKey("각나"))
            #expect(UsernameRules.uniquenessKey("Mina") == UsernameRules.uniquenessKey("mINA"))
        }
    }
}
