import Foundation
import OnboardingAPI

/// Sign in with Apple's authorization code, exchanged at sign-in for the refresh token that
/// revoking the account at Apple needs later (`POST /auth/token`,
/// `grant_type=authorization_code`, authenticated by ``AppleClientSecret``).
///
/// The code is single-use and lives five minutes: it is exchanged while the sign-in is answered.
public enum AppleCodeExchange {
    /// The exchange's form (sent like an ``UnlinkRequest``).
    public static func request(code: String, clientSecret: String, settings: UnlinkSettings.Apple) -> UnlinkRequest {
        UnlinkRequest(
            provider: .apple, url: settings.tokenURL, headers: [:],
            form: [
                .init("client_id", settings.clientID), .init("client_secret", clientSecret), .init("code", code),
                .init("grant_type", "authorization_code"),
            ])
    }

    /// Reads Apple's answer: the refresh token, or why there is none (never the token itself).
    public static func refreshToken(status: Int, body: Data) -> Result<String, ExchangeFailure> {
        let json = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any]
        guard (200..<300).contains(status) else {
            return .failure(ExchangeFailure("Apple answered HTTP \(status) \(json?["error"] as? String ?? "")"))
        }
        guard let token = json?["refresh_token"] as? String, !token.isEmpty else {
            return .failure(ExchangeFailure("Apple's answer has no refresh_token"))
        }
        return .success(token)
    }

    /// Exchanges `code`: signs a client secret, sends the form, reads the answer.
    ///
    /// - Throws: ``ExchangeFailure`` when there is no refresh token (no answer, a refusal, a
    ///   key that cannot sign). Its description never holds a token.
    public static func exchange(
        code: String, settings: UnlinkSettings.Apple, http: any IdentityHTTPClient, timeout: TimeInterval
    ) async throws -> String {
        let secret: String
        do {
            secret = try await AppleClientSecret.make(settings)
        } catch {
            throw ExchangeFailure("the Apple key cannot sign a client secret (\(error))")
        }
        let request = request(code: code, clientSecret: secret, settings: settings)
        let answer: HTTPAnswer
        do {
            answer = try await http.post(request.url, headers: request.headers, form: request.body, timeout: timeout)
        } catch {
            throw ExchangeFailure("Apple's token endpoint did not answer (\(error))")
        }
        return try refreshToken(status: answer.status, body: answer.body).get()
    }

    /// Why an exchange gave no refresh token.
    public struct ExchangeFailure: Error, CustomStringConvertible, Sendable, Hashable {
        public var description: String
        public init(_ description: String) { self.description = description }
    }
}
