import Foundation
import JWTKit
import Messaging
import OnboardingAPI

extension UnlinkSettings {
    /// Every unlink setting's variable, for the README's table.
    public static let variables: [String] = [
        "ONBOARDING_APPLE_TEAM_ID", "ONBOARDING_APPLE_KEY_ID", "ONBOARDING_APPLE_PRIVATE_KEY_PATH",
        "ONBOARDING_APPLE_PRIVATE_KEY", "ONBOARDING_APPLE_UNLINK_CLIENT_ID", "ONBOARDING_APPLE_TOKEN_URL",
        "ONBOARDING_APPLE_REVOKE_URL", "ONBOARDING_KAKAO_ADMIN_KEY", "ONBOARDING_KAKAO_UNLINK_URL",
        "ONBOARDING_NAVER_CLIENT_SECRET", "ONBOARDING_NAVER_UNLINK_CLIENT_ID", "ONBOARDING_NAVER_TOKEN_URL",
        "ONBOARDING_GOOGLE_UNLINK", "ONBOARDING_GOOGLE_REVOKE_URL",
    ]

    /// The unlink settings from `values` (the environment); a provider whose credentials are not
    /// given stays `nil` (not unlinked).
    ///
    /// - Apple: `ONBOARDING_APPLE_TEAM_ID`, `_KEY_ID`, and the key as `_PRIVATE_KEY_PATH` (the
    ///   `.p8` file) or `_PRIVATE_KEY` (its PEM text); the client id is
    ///   `ONBOARDING_APPLE_UNLINK_CLIENT_ID`, else the first of `ONBOARDING_APPLE_CLIENT_IDS`.
    /// - Kakao: `ONBOARDING_KAKAO_ADMIN_KEY`.
    /// - Naver: `ONBOARDING_NAVER_CLIENT_SECRET`; the client id is
    ///   `ONBOARDING_NAVER_UNLINK_CLIENT_ID`, else the first of `ONBOARDING_NAVER_CLIENT_IDS`.
    /// - Google needs no credentials: `ONBOARDING_GOOGLE_UNLINK=1` turns its revoke on.
    /// - `ONBOARDING_APPLE_TOKEN_URL`, `_REVOKE_URL`, `ONBOARDING_KAKAO_UNLINK_URL`,
    ///   `ONBOARDING_NAVER_TOKEN_URL`, `ONBOARDING_GOOGLE_REVOKE_URL`: the endpoints (`https://`, or
    ///   `http://` to a loopback host for a local fake provider).
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` naming what is missing or cannot work (half of
    ///   Apple's settings, a key that is not a P-256 private key, a bad URL). Never echoes a secret.
    public static func fromEnvironment(_ values: [String: String]) throws -> UnlinkSettings {
        func value(_ name: String) -> String? {
            guard let raw = values[name]?.trimmingCharacters(in: .whitespacesAndNewlines), !raw.isEmpty else { return nil }
            return raw
        }
        func url(_ name: String, default fallback: String) throws -> String {
            guard let raw = value(name) else { return fallback }
            try IdentityProviderSettings.checkURL(raw, setting: name)
            return raw
        }
        func firstClientID(_ provider: Provider) -> String? {
            value(IdentityProviderSettings.variable(provider, "CLIENT_IDS"))?.split(separator: ",")
                .map { $0.trimmingCharacters(in: .whitespaces) }.first { !$0.isEmpty }
        }
        var settings = UnlinkSettings()

        let appleNames = ["ONBOARDING_APPLE_TEAM_ID", "ONBOARDING_APPLE_KEY_ID", "ONBOARDING_APPLE_PRIVATE_KEY_PATH", "ONBOARDING_APPLE_PRIVATE_KEY"]
        if appleNames.contains(where: { value($0) != nil }) {
            let pem: String
            if let path = value("ONBOARDING_APPLE_PRIVATE_KEY_PATH") {
                guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
                    throw ServiceError(.invalidRequest, "ONBOARDING_APPLE_PRIVATE_KEY_PATH names \(path), which cannot be read.")
                }
                pem = text
            } else if let text = value("ONBOARDING_APPLE_PRIVATE_KEY") {
                pem = text.replacingOccurrences(of: "\\n", with: "\n")
            } else {
                throw missing("ONBOARDING_APPLE_PRIVATE_KEY_PATH (the .p8 file) or ONBOARDING_APPLE_PRIVATE_KEY", for: "Apple")
            }
            guard (try? ES256PrivateKey(pem: pem)) != nil else {
                throw ServiceError(.invalidRequest, "The Apple private key is not a P-256 private key in PEM (the .p8 file Apple gives).")
            }
            guard let team = value("ONBOARDING_APPLE_TEAM_ID") else { throw missing("ONBOARDING_APPLE_TEAM_ID", for: "Apple") }
            guard let key = value("ONBOARDING_APPLE_KEY_ID") else { throw missing("ONBOARDING_APPLE_KEY_ID", for: "Apple") }
            guard let client = value("ONBOARDING_APPLE_UNLINK_CLIENT_ID") ?? firstClientID(.apple) else {
                throw missing("ONBOARDING_APPLE_UNLINK_CLIENT_ID (or ONBOARDING_APPLE_CLIENT_IDS)", for: "Apple")
            }
            let defaults = UnlinkSettings.Apple(teamID: "", keyID: "", privateKeyPEM: "", clientID: "")
            settings.apple = UnlinkSettings.Apple(
                teamID: team, keyID: key, privateKeyPEM: pem, clientID: client,
                revokeURL: try url("ONBOARDING_APPLE_REVOKE_URL", default: defaults.revokeURL),
                tokenURL: try url("ONBOARDING_APPLE_TOKEN_URL", default: defaults.tokenURL))
        }
        if let adminKey = value("ONBOARDING_KAKAO_ADMIN_KEY") {
            settings.kakao = UnlinkSettings.Kakao(
                adminKey: adminKey,
                unlinkURL: try url("ONBOARDING_KAKAO_UNLINK_URL", default: UnlinkSettings.Kakao(adminKey: "").unlinkURL))
        }
        if let secret = value("ONBOARDING_NAVER_CLIENT_SECRET") {
            guard let client = value("ONBOARDING_NAVER_UNLINK_CLIENT_ID") ?? firstClientID(.naver) else {
                throw missing("ONBOARDING_NAVER_UNLINK_CLIENT_ID (or ONBOARDING_NAVER_CLIENT_IDS)", for: "Naver")
            }
            settings.naver = UnlinkSettings.Naver(
                clientID: client, clientSecret: secret,
                tokenURL: try url("ONBOARDING_NAVER_TOKEN_URL", default: UnlinkSettings.Naver(clientID: "", clientSecret: "").tokenURL))
        }
        if let raw = value("ONBOARDING_GOOGLE_UNLINK") {
            switch raw.lowercased() {
            case "1", "true", "yes", "on":
                settings.google = UnlinkSettings.Google(
                    revokeURL: try url("ONBOARDING_GOOGLE_REVOKE_URL", default: UnlinkSettings.Google().revokeURL))
            case "0", "false", "no", "off": break
            default:
                throw ServiceError(.invalidRequest, "ONBOARDING_GOOGLE_UNLINK is \"\(raw)\"; give 1 (revoke Google tokens on withdrawal) or 0.")
            }
        }
        return settings
    }

    private static func missing(_ name: String, for provider: String) -> ServiceError {
        ServiceError(
            .invalidRequest,
            "Unlinking at \(provider) is half configured: \(name) is missing. Give every \(provider) unlink setting, or none.")
    }

    /// One line per provider saying whether withdrawals are unlinked there, for the start-up log.
    public var summary: [String] {
        [
            apple.map { "apple: unlinked on withdrawal (revoke at \($0.revokeURL), codes exchanged at \($0.tokenURL))" }
                ?? "apple: NOT unlinked on withdrawal; set ONBOARDING_APPLE_TEAM_ID, _KEY_ID and _PRIVATE_KEY_PATH",
            kakao.map { "kakao: unlinked on withdrawal at \($0.unlinkURL)" }
                ?? "kakao: NOT unlinked on withdrawal; set ONBOARDING_KAKAO_ADMIN_KEY",
            naver.map { "naver: unlinked on withdrawal at \($0.tokenURL)" }
                ?? "naver: NOT unlinked on withdrawal; set ONBOARDING_NAVER_CLIENT_SECRET",
            google.map { "google: access tokens revoked on withdrawal at \($0.revokeURL)" }
                ?? "google: NOT revoked on withdrawal; set ONBOARDING_GOOGLE_UNLINK=1",
        ]
    }
}
