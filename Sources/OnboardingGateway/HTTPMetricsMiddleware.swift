import CoreMetrics
import HTTPTypes
import Hummingbird
import ServiceRuntime
import Synchronization

/// Counts and times every HTTP request by route template, method and status
/// (``MetricDefinition/httpRequests``, ``MetricDefinition/httpDuration``).
///
/// The route is the template the router matched (`/v1/usernames/{username}`), never the path a
/// client sent, so no username reaches a label; a request no route matched counts as
/// `unmatched`. The time runs to the start of the response: for an intent stream, until its
/// headers are sent, not for as long as it stays open.
///
/// Hummingbird's own `MetricsMiddleware` is not used: its metric names hold dots, which
/// Prometheus's naming conventions do not allow.
struct HTTPMetricsMiddleware: RouterMiddleware {
    typealias Context = GatewayContext

    /// The handles made so far, by route, method and status: a few dozen at most.
    private let handles = Handles()

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let started = ContinuousClock.now
        do {
            let response = try await next(request, context)
            record(request, context, status: response.status.code, since: started)
            return response
        } catch {
            record(request, context, status: (error as? any HTTPResponseError)?.status.code ?? 500, since: started)
            throw error
        }
    }

    private func record(_ request: Request, _ context: Context, status: Int, since started: ContinuousClock.Instant) {
        let route = Self.route(of: context)
        let method = Self.methods.contains(request.method) ? request.method.rawValue : "other"
        let (counter, timer) = handles.for(route: route, method: method, status: status)
        counter.increment()
        timer.recordNanoseconds(started.duration(to: .now).nanoseconds)
    }

    static let methods: Set<HTTPRequest.Method> = [.get, .post, .put, .patch, .delete, .head, .options]

    /// The route template the router matched, or `unmatched` (Hummingbird's not-found
    /// responder calls it `NotFound`: no route, or none for this method).
    static func route(of context: Context) -> String {
        guard let path = context.endpointPath, path != "NotFound" else { return "unmatched" }
        return template(path)
    }

    /// Hummingbird's `/v1/usernames/:username` as OpenAPI writes it: `/v1/usernames/{username}`.
    static func template(_ path: String) -> String {
        path.split(separator: "/", omittingEmptySubsequences: false).map { part in
            part.hasPrefix(":") ? "{\(part.dropFirst())}" : String(part)
        }.joined(separator: "/")
    }

    final class Handles: Sendable {
        private let made = Mutex<[String: (Counter, CoreMetrics.Timer)]>([:])

        func `for`(route: String, method: String, status: Int) -> (Counter, CoreMetrics.Timer) {
            made.withLock { made in
                let key = "\(method) \(route) \(status)"
                if let handles = made[key] { return handles }
                let handles = (
                    Counter(
                        label: MetricDefinition.httpRequests.name,
                        dimensions: [("route", route), ("method", method), ("status", String(status))]),
                    CoreMetrics.Timer(label: MetricDefinition.httpDuration.name, dimensions: [("route", route), ("method", method)])
                )
                made[key] = handles
                return handles
            }
        }
    }
}
