import HTTPTypes
import Hummingbird
import OnboardingAPI
import Tracing

/// A span for each HTTP request, when the gateway exports traces (see ``Traces``): a child of
/// the trace the request's `traceparent` header names, or the root of a new one (the sampler
/// decides which are kept). The calls the request makes on the bus carry the trace on.
///
/// The span is named by the route template (`HTTP GET /v1/usernames/{username}`) and has only
/// the method, the route and the status as attributes: never the path, which can hold a
/// username, nor a header.
struct HTTPTracingMiddleware: RouterMiddleware {
    typealias Context = GatewayContext

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard Traces.isEnabled else { return try await next(request, context) }
        var parent = ServiceContext.topLevel
        InstrumentationSystem.instrument.extract(request.headers, into: &parent, using: HTTPFieldsExtractor())
        let method = request.method.rawValue
        let span = InstrumentationSystem.tracer.startSpan("HTTP \(method)", context: parent, ofKind: .server)
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
        let route = context.endpointPath.map(HTTPMetricsMiddleware.template) ?? "unmatched"
        span.operationName = "HTTP \(method) \(route)"
        span.attributes["http.route"] = route
        span.attributes["http.response.status_code"] = status
        if status >= 500 { span.setStatus(SpanStatus(code: .error)) }
    }
}

/// Reads W3C trace context from HTTP headers.
struct HTTPFieldsExtractor: Extractor {
    func extract(key: String, from fields: HTTPFields) -> String? {
        HTTPField.Name(key).flatMap { fields[$0] }
    }
}
