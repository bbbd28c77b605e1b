import Messaging
import OnboardingAPI
import Testing

@Suite("Username rules")
struct UsernameRulesTests {
    static let cases: [(String, UsernameProblem?)] = [
        ("", .empty),
        ("a", .tooShort),
        ("ab", nil),
        ("abcdefghi", nil),
        ("abcdefghij", .tooLong),
        ("가나", nil),
        ("\u{1100}\u{1161}", .tooShort),  // decomposed 가: one syllable after NFC
        ("\u{1100}\u{1161}\u{1102}\u{1161}", nil),  // decomposed 가나
        ("mina!", .invalidCharacters),
        ("mi na", .invalidCharacters),
        ("mi-na", .invalidCharacters),
        ("_ok", nil),
        ("Mina_09", nil),
        ("mina😀", .invalidCharacters),
        ("😀😀", .invalidCharacters),
        ("Ａb", .invalidCharacters),  // fullwidth Ａ
        ("ㄱㄴ", .invalidCharacters),  // compatibility jamo are not syllables
        ("가나다라마바사아자", nil),
        ("가나다라마바사아자차", .tooLong),
    ]

    @Test("Format rules, checked in order", arguments: cases)
    func formatProblem(name: String, expected: UsernameProblem?) {
        #expect(UsernameRules.formatProblem(name) == expected)
    }

    @Test("Decomposed Hangul normalizes to composed")
    func normalization() {
        #expect(UsernameRules.normalized("\u{1100}\u{1161}\u{1102}\u{1161}") == "가나")
    }

    @Test("Uniqueness ignores letter case")
    func uniquenessKey() {
        #expect(UsernameRules.uniquenessKey("Mina") == UsernameRules.uniquenessKey("mina"))
        #expect(UsernameRules.uniquenessKey("\u{1100}\u{1161}\u{1102}\u{1161}") == UsernameRules.uniquenessKey("가나"))
        #expect(UsernameRules.uniquenessKey("mina") != UsernameRules.uniquenessKey("mina_"))
    }

    @Test("Each problem has its error code")
    func errors() {
        for problem in UsernameProblem.allCases {
            let error = ServiceError.username(problem)
            #expect(error.reason == problem.rawValue)
            #expect(error.code == (problem == .duplicated ? .usernameTaken : .invalidUsername))
        }
    }
}
