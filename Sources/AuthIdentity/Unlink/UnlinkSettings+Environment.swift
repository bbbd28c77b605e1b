import Foundation
import JWTKit
import Messaging
import OnboardingAPI
import OnboardingSettings

extension UnlinkSettings {
    /// The settings read here.
    public static let settings: [Setting] = [
        .appleTeamID, .appleKeyID, .applePrivateKeyPath, .applePrivateKey, .appleUnlinkClientID, .appleTokenURL,
        .appleRevokeURL, .kakaoAdminKey, .kakaoUnlinkURL, .naverClientSecret, .naverUnlinkClientID, .naverTokenURL,
        .googleUnlink, .googleRevokeURL, .appleClientIDs, .naverClientIDs,
    ]

    /// The unlink settings a program was started with.
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` naming what is missing or cannot work.
    public init(_ settings: Settings) throws {
        self = try Self.fromEnvironment(settings.environmentValues(Self.settings))
    }

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
        func value(_ setting: Setting) -> String? {
            guard let raw = values[setting.environmentVariable]?.trimmingCharacters(in: .whitespacesAndNewlines), !raw.isEmpty
            else { return nil }
            return raw
        }
        func url(_ setting: Setting, default fallback: String) throws -> String {
            guard let raw = value(setting) else { return fallback }
            try IdentityProviderSettings.checkURL(raw, setting: setting.environmentVariable)
            return raw
        }
        func firstClientID(_ setting: Setting) -> String? {
            value(setting)?.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.first { !$0.isEmpty }
        }
        var settings = UnlinkSettings()

        let appleSettings: [Setting] = [.appleTeamID, .appleKeyID, .applePrivateKeyPath, .applePrivateKey]
        if appleSettings.contains(where: { value($0) != nil }) {
            let pem: String
            if let path = value(.applePrivateKeyPath) {
                guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
                    throw ServiceError(.invalidRequest, "\(Setting.applePrivateKeyPath.environmentVariable) names \(path), which cannot be read.")
                }
                pem = text
            } else if let text = value(.applePrivateKey) {
                pem = text.replacingOccurrences(of: "\\n", with: "\n")
            } else {
                throw missing("\(Setting.applePrivateKeyPath.environmentVariable) (the .p8 file) or \(Setting.applePrivateKey.environmentVariable)", for: "Apple")
            }
            guard (try? ES256PrivateKey(pem: pem)) != nil else {
                throw ServiceError(.invalidRequest, "The Apple private key is not a P-256 private key in PEM (the .p8 file Apple gives).")
            }
            guard let team = value(.appleTeamID) else { throw missing(Setting.appleTeamID.environmentVariable, for: "Apple") }
            guard let key = value(.appleKeyID) else { throw missing(Setting.appleKeyID.environmentVariable, for: "Apple") }
            guard let client = value(.appleUnlinkClientID) ?? firstClientID(.appleClientIDs) else {
                throw missing("\(Setting.appleUnlinkClientID.environmentVariable) (or \(Setting.appleClientIDs.environmentVariable))", for: "Apple")
            }
            let defaults = UnlinkSettings.Apple(teamID: "", keyID: "", privateKeyPEM: "", clientID: "")
            settings.apple = UnlinkSettings.Apple(
                teamID: team, keyID: key, privateKeyPEM: pem, clientID: client,
                revokeURL: try url(.appleRevokeURL, default: defaults.revokeURL),
                tokenURL: try url(.appleTokenURL, default: defaults.tokenURL))
        }
        if let adminKey = value(.kakaoAdminKey) {
            settings.kakao = UnlinkSettings.Kakao(
                adminKey: adminKey,
                unlinkURL: try url(.kakaoUnlinkURL, default: UnlinkSettings.Kakao(adminKey: "").unlinkURL))
        }
        if let secret = value(.naverClientSecret) {
            guard let client = value(.naverUnlinkClientID) ?? firstClientID(.naverClientIDs) else {
                throw missing("\(Setting.naverUnlinkClientID.environmentVariable) (or \(Setting.naverClientIDs.environmentVariable))", for: "Naver")
            }
            settings.naver = UnlinkSettings.Naver(
                clientID: client, clientSecret: secret,
                tokenURL: try url(.naverTokenURL, default: UnlinkSettings.Naver(clientID: "", clientSecret: "").tokenURL))
        }
        if let raw = value(.googleUnlink) {
            switch raw.lowercased() {
            case "1", "true", "yes", "on":
                settings.google = UnlinkSettings.Google(
                    revokeURL: try url(.googleRevokeURL, default: UnlinkSettings.Google().revokeURL))
            case "0", "false", "no", "off": break
            default:
                throw ServiceError(.invalidRequest, "\(Setting.googleUnlink.environmentVariable) is \"\(raw)\"; give 1 (revoke Google tokens on withdrawal) or 0.")
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
                ?? "apple: NOT unlinked on withdrawal; set \(Setting.appleTeamID.environmentVariable), _KEY_ID and _PRIVATE_KEY_PATH",
            kakao.map { "kakao: unlinked on withdrawal at \($0.unlinkURL)" }
                ?? "kakao: NOT unlinked on withdrawal; set \(Setting.kakaoAdminKey.environmentVariable)",
            naver.map { "naver: unlinked on withdrawal at \($0.tokenURL)" }
                ?? "naver: NOT unlinked on withdrawal; set \(Setting.naverClientSecret.environmentVariable)",
            google.map { "google: access tokens revoked on withdrawal at \($0.revokeURL)" }
                ?? "google: NOT revoked on withdrawal; set \(Setting.googleUnlink.environmentVariable)=1",
        ]
    }
}
