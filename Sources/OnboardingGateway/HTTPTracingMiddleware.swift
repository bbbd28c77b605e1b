import HTTPTypes
import Hummingbird
import OnboardingAPI
import Tracing

/// A span for each HTTP request, when the gateway exports traces (see ``Traces``): a child of
/// the trace the request's `traceparent` header names when it is well formed and sampled, or
/// the root of a new one (the sampler decides which are kept). The calls the request makes on the bus carry the trace on.
///
/// The span is named by the route template (`HTTP GET /v1/usernames/{username}`) and has only
/// the method, the route and the status as attributes: never the path, which can hold a
/// username, nor a header.
struct HTTPTracingMiddleware: RouterMiddleware {
    typealias Context = GatewayContext

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard Traces.isEnabled else { return try await next(request, context) }
        // Only the two trace fields reach the tracer, never the headers (they hold the session).
        let parent = request.headers[Self.traceparent].flatMap { Traces.context(traceparent: $0, tracestate: request.headers[Self.tracestate]) }
        let method = HTTPMetricsMiddleware.methods.contains(request.method) ? request.method.rawValue : "other"
        let span = InstrumentationSystem.tracer.startSpan("HTTP \(method)", context: parent ?? .topLevel, ofKind: .server)
        defer { span.end() }
        span.attributes["http.request.method"] = method
        do {
            let response = try await ServiceContext.withValue(span.context) { try await next(request, context) }
            finish(span, context, method: method, status: response.status.code)
            return response
        } catch {
            finish(span, context, method: method, status: (error as? any HTTPResponseError)?.status.code ?? 500)
            throw error
        }
    }

    private func finish(_ span: any Tracing.Span, _ context: Context, method: String, status: Int) {
        let route = HTTPMetricsMiddleware.route(of: context)
        span.operationName = "HTTP \(method) \(route)"
        span.attributes["http.route"] = route
        span.attributes["http.response.status_code"] = status
        if status >= 500 { span.setStatus(SpanStatus(code: .error)) }
    }
}

extension HTTPTracingMiddleware {
    static let traceparent = HTTPField.Name("traceparent")!
    static let tracestate = HTTPField.Name("tracestate")!
}
