import Foundation
import Messaging
import OnboardingAPI

/// Writing for a person at a terminal, or for a program reading lines.
enum Terminal {
    /// Prints a line to standard output and flushes it, so a pipe sees it at once.
    static func line(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }

    /// Prints a line to standard error.
    static func note(_ text: String) {
        FileHandle.standardError.write(Data((text + "\n").utf8))
    }

    static var standardOutputIsTerminal: Bool { isatty(STDOUT_FILENO) == 1 }
    static var standardErrorIsTerminal: Bool { isatty(STDERR_FILENO) == 1 }

    enum Color: String {
        case red = "31", green = "32", yellow = "33", cyan = "36", dim = "2", bold = "1"
    }

    static func paint(_ text: String, _ color: Color, when enabled: Bool) -> String {
        enabled ? "\u{1B}[\(color.rawValue)m\(text)\u{1B}[0m" : text
    }

    /// Prints `error` with its code and a plain explanation of what to do.
    static func report(_ error: ServiceError) {
        let colored = standardErrorIsTerminal
        note(paint("error: \(error.code.rawValue)\(error.reason.map { " (\($0))" } ?? "")", .red, when: colored) + ": \(error.message)")
        if let hint = hint(for: error) { note("hint: \(hint)") }
    }

    static func hint(for error: ServiceError) -> String? {
        switch error.code {
        case .noResponder where error.message.contains("CURVE handshake"):
            "Check the keys: this program's key pair and the server's public key (onboarding-keys show, ONBOARDING_KEYS_DIR)."
        case .noResponder:
            "Is the system running? Start it with ./compose/onboarding up, or check the endpoint flags."
        case .timeout:
            "The service did not answer in time. Look at its log lines in the compose terminal."
        case .unauthenticated where error.reason == "providerNotConfigured":
            "Sign in with a provider this auth service verifies (its log lists them at start), or give auth the setting named above."
        case .unauthenticated where error.reason == "sessionExpired" || error.reason == "sessionEvicted":
            "The session ended by itself; sign in again (onboarding-client sign-in)."
        case .unauthenticated where error.reason != nil:
            "The sign-in proof was refused: get a new token from the provider (locally: onboarding-fake-provider token) and sign in again."
        case .unauthenticated:
            "Sign in again: onboarding-client sign-in --provider google --subject <someone>"
        case .invalidUsername:
            "Usernames are 2 to 9 characters: letters A-Z a-z, digits, Hangul syllables and _."
        case .usernameTaken:
            "Pick another username; onboarding-client check-username <name> tells you if one is free."
        case .profileExists:
            "This person already has a profile: onboarding-client profile shows it."
        case .imageRejected:
            "Use a whole PNG, JPEG, WebP or HEIC image within the size and pixel limits (the message says which)."
        case .dependencyUnavailable where Provider(rawValue: error.reason ?? "") != nil:
            "The sign-in provider (\(error.reason ?? "")) could not be asked: its key set or API is down or slow. Try again."
        case .dependencyUnavailable:
            "A service behind this one is down or slow; ./compose/onboarding status shows which. Try again."
        default:
            nil
        }
    }

    /// JSON for `--json` output.
    static func json<Value: Encodable>(_ value: Value) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? encoder.encode(value)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }
}
