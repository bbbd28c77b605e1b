import Foundation
import Messaging
import OnboardingAPI

/// What Naver's profile API (`GET /v1/nid/me`) said about an access token, as a decision: a
/// pure function of the HTTP answer, tested without sockets.
///
/// - 200 with `resultcode` `00` and a non-empty `response.id`: that id is the account's stable
///   subject.
/// - 401 with `resultcode` `024` (authentication failed) or `028` (no token / expired):
///   `unauthenticated`, reason ``IdentityRefusal/providerRefusedToken``.
/// - Anything else (5xx, 429, 403, an unreadable body): `dependencyUnavailable`, reason `naver`,
///   because the token may be fine and Naver could not say.
public enum NaverProfileAnswer {
    public static let refusedCodes: Set<String> = ["024", "028"]

    public static func subject(from answer: HTTPAnswer) -> Result<String, ServiceError> {
        let body = try? JSONDecoder().decode(Body.self, from: answer.body)
        switch answer.status {
        case 200:
            guard body?.resultcode == "00", let id = body?.response?.id, !id.isEmpty else {
                return .failure(
                    .providerUnavailable(
                        .naver, "its profile API answered 200 without an account id (resultcode \(body?.resultcode ?? "none"))"))
            }
            return .success(id)
        case 401 where body.map { refusedCodes.contains($0.resultcode ?? "") } == true:
            return .failure(
                .signInRefused(
                    .providerRefusedToken, .naver,
                    "Naver refused the access token (\(body?.resultcode ?? ""): \(body?.message ?? "authentication failed"))"))
        default:
            return .failure(
                .providerUnavailable(.naver, "its profile API answered HTTP \(answer.status) (resultcode \(body?.resultcode ?? "none"))"))
        }
    }

    private struct Body: Decodable {
        var resultcode: String?
        var message: String?
        var response: Profile?
        struct Profile: Decodable { var id: String? }
    }
}
