import ArgumentParser
import FakeIdentityProvider
import Foundation
import OnboardingAPI
import OnboardingSettings

/// `onboarding-fake-provider`: Google, Apple, Kakao and Naver on this machine, for trying auth's
/// production mode (`serve`), and the tokens they would give an app (`token`).
@main
struct FakeProviderCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "onboarding-fake-provider",
        abstract: "A local stand-in for Google, Apple, Kakao and Naver sign-in (for development only).",
        discussion: """
            serve publishes key sets, Naver's profile API and the unlink endpoints on 127.0.0.1 and prints the \
            settings that point auth at it; token prints a token signed with the same keys (kept in --key-file).
            """,
        subcommands: [Serve.self, Token.self])

    struct KeyFileOption: ParsableArguments {
        @Option(help: "Where the fake's signing keys are kept (made on first use, 0600). Default: <data dir>/fake-provider/keys.json")
        var keyFile: String?

        var url: URL {
            let dataDirectory = Settings().dataDirectory
            return URL(fileURLWithPath: keyFile ?? "\(dataDirectory)/fake-provider/keys.json")
        }
    }

    /// One shell line that sets these settings' variables.
    static func export(_ values: [(Setting, String)]) -> String {
        "export " + values.map { "\($0.0.environmentVariable)=\($0.1)" }.joined(separator: " ")
    }

    struct Serve: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Serve the fake providers on 127.0.0.1 until Ctrl-C.")

        @Option(help: "Port on 127.0.0.1.")
        var port = 7601
        @OptionGroup var keys: KeyFileOption

        func run() async throws {
            let fake = try await FakeIdentityProvider.make(keyFile: keys.url)
            let base = "http://127.0.0.1:\(port)"
            // A developer key for Apple's unlink settings, beside the signing keys.
            let appleKey = keys.url.deletingLastPathComponent().appendingPathComponent("AuthKey_FAKEKEY01.p8")
            if !FileManager.default.fileExists(atPath: appleKey.path) {
                try FakeIdentityProvider.makeAppleDeveloperKeyPEM().write(to: appleKey, atomically: true, encoding: .utf8)
                try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: appleKey.path)
            }
            try await fake.run(port: port) { _ in
                var lines = [
                    "fake identity providers at \(base) (keys in \(keys.url.path))",
                    "Start auth in production mode against them with:", "", export([(.authDevMode, "0")]),
                ]
                for provider in FakeIdentityProvider.oidcProviders {
                    guard let keySet = Setting.jwksURL(provider) else { continue }
                    lines.append(export([
                        (.clientIDs(provider), FakeIdentityProvider.defaultClientID(provider)),
                        (keySet, FakeIdentityProvider.jwksURL(provider, base: base)),
                    ]))
                }
                lines.append(export([
                    (.naverClientIDs, FakeIdentityProvider.defaultClientID(.naver)),
                    (.naverProfileURL, FakeIdentityProvider.naverProfileURL(base: base)),
                ]))
                lines += [
                    "", "and to unlink withdrawals at them (README: Unlinking at the provider on withdrawal):",
                    export([(.appleTeamID, "FAKETEAM01"), (.appleKeyID, "FAKEKEY01")]),
                    export([(.applePrivateKeyPath, appleKey.path)]),
                    export([
                        (.appleTokenURL, "\(base)\(FakeIdentityProvider.appleTokenPath)"), (.appleRevokeURL, "\(base)/apple/auth/revoke"),
                    ]),
                    export([(.kakaoAdminKey, "fake-kakao-admin-key"), (.kakaoUnlinkURL, "\(base)/kakao/v1/user/unlink")]),
                    export([(.naverClientSecret, "fake-naver-secret"), (.naverTokenURL, "\(base)/naver/oauth2.0/token")]),
                    export([(.googleUnlink, "1"), (.googleRevokeURL, "\(base)/google/revoke")]),
                ]
                // Written at once and unbuffered, so a terminal or a pipe sees it while serving.
                FileHandle.standardOutput.write(Data((lines.joined(separator: "\n") + "\n\n").utf8))
            }
        }
    }

    struct Token: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a token the fake provider vouches for: an ID token (google, apple, kakao) or a Naver access token.")

        @Option(help: "google, apple, kakao or naver.")
        var provider: Provider
        @Option(help: "The account's id at the provider (the token's sub; Naver's response.id).")
        var subject: String
        @Option(help: "The client id the token is for. Default: fake-<provider>-client")
        var audience: String?
        @Option(help: "The raw nonce to put in the token (Apple's carries its SHA-256).")
        var nonce: String?
        @Option(help: "Seconds until the token expires.")
        var lifetime = 3600
        @OptionGroup var keys: KeyFileOption

        func run() async throws {
            if provider == .naver {
                print(FakeIdentityProvider.naverAccessToken(for: subject))
                return
            }
            let fake = try await FakeIdentityProvider.make(keyFile: keys.url)
            print(
                try fake.mintIDToken(
                    provider, subject: subject, audience: audience, nonce: nonce, lifetime: TimeInterval(lifetime)))
        }
    }
}

extension Provider: ExpressibleByArgument {}
