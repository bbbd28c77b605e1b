import ArgumentParser
import Foundation
import Logging
import OnboardingAPI
import OnboardingGateway
import ServiceRuntime

@main
struct GatewayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "onboarding-gateway",
        abstract: "The app's front door: HTTP and a live intent stream (Server-Sent Events) over the onboarding bus.")

    @Option(help: "Where to listen for HTTP (plain HTTP; put a TLS-terminating proxy in front). Env: ONBOARDING_GATEWAY_HTTP. Default: http://\(GatewayDefaults.host):\(GatewayDefaults.port)")
    var http: String?
    @Option(help: "auth's request endpoint. Env: ONBOARDING_AUTH_RPC. Default: \(Defaults.authRPC)")
    var authRpc: String?
    @Option(help: "profile's request endpoint. Env: ONBOARDING_PROFILE_RPC. Default: \(Defaults.profileRPC)")
    var profileRpc: String?
    @Option(help: "The orchestrator's request endpoint. Env: ONBOARDING_ORCHESTRATOR_RPC. Default: \(Defaults.orchestratorRPC)")
    var orchestratorRpc: String?
    @Option(help: "The orchestrator's route-intent publisher. Env: ONBOARDING_ROUTES. Default: \(Defaults.routes)")
    var routes: String?
    @Option(help: "The largest image accepted. Env: ONBOARDING_MAX_IMAGE_BYTES. Default: \(Defaults.maxImageBytes)")
    var maxImageBytes: Int?
    @Option(help: "Comma-separated addresses of reverse proxies whose X-Forwarded-For is believed. Env: ONBOARDING_GATEWAY_TRUSTED_PROXIES. Default: none")
    var trustedProxies: String?
    @Option(help: "Sign-ins a client address may make a minute (all at once if need be). Env: ONBOARDING_GATEWAY_SIGN_INS_PER_MINUTE. Default: 30")
    var signInsPerMinute: Int?
    @Option(help: "Username checks a client address may make a second, after a burst of four times that. Env: ONBOARDING_GATEWAY_USERNAME_CHECKS_PER_SECOND. Default: 5")
    var usernameChecksPerSecond: Int?
    @Option(help: "Seconds between heartbeats on an idle intent stream (1 to 3600). Env: ONBOARDING_GATEWAY_HEARTBEAT_SECONDS. Default: 15")
    var heartbeatSeconds: Int?
    @OptionGroup var common: CommonServiceOptions

    func run() async throws {
        ServiceHost.bootstrapLogging(level: common.level)
        let logger = Logger(label: GatewayDefaults.name)
        let (host, port) = try Self.hostAndPort(http ?? Settings.environment("ONBOARDING_GATEWAY_HTTP"))
        let proxies = (trustedProxies ?? Settings.environment("ONBOARDING_GATEWAY_TRUSTED_PROXIES") ?? "")
            .split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        let configuration = GatewayConfiguration(
            host: host, port: port,
            authRPC: Settings.endpoint(authRpc, env: "ONBOARDING_AUTH_RPC", default: Defaults.authRPC),
            profileRPC: Settings.endpoint(profileRpc, env: "ONBOARDING_PROFILE_RPC", default: Defaults.profileRPC),
            orchestratorRPC: Settings.endpoint(orchestratorRpc, env: "ONBOARDING_ORCHESTRATOR_RPC", default: Defaults.orchestratorRPC),
            routes: Settings.endpoint(routes, env: "ONBOARDING_ROUTES", default: Defaults.routes),
            serviceToken: try common.resolvedServiceToken(),
            maxImageBytes: try Settings.imageLimit(maxImageBytes),
            heartbeat: .seconds(try Self.ranged(
                heartbeatSeconds, env: "ONBOARDING_GATEWAY_HEARTBEAT_SECONDS", default: 15, flag: "--heartbeat-seconds",
                in: 1...3600)),
            signInLimit: .perMinute(try Self.ranged(signInsPerMinute, env: "ONBOARDING_GATEWAY_SIGN_INS_PER_MINUTE", default: 30, flag: "--sign-ins-per-minute")),
            usernameCheckLimit: try {
                let perSecond = try Self.ranged(
                    usernameChecksPerSecond, env: "ONBOARDING_GATEWAY_USERNAME_CHECKS_PER_SECOND", default: 5,
                    flag: "--username-checks-per-second")
                return RateLimiter.Rule(burst: Double(perSecond * 4), perSecond: Double(perSecond))
            }(),
            trustedProxies: Set(proxies))
        try await ServiceHost.run(name: GatewayDefaults.name, logger: logger) { bus in
            [OnboardingGateway(configuration: configuration, bus: bus, logger: logger)]
        }
    }

    /// A number from its flag, the environment, or the default, within `range`.
    static func ranged(
        _ flag: Int?, env: String, default value: Int, flag name: String, in range: ClosedRange<Int> = 1...1_000_000
    ) throws -> Int {
        let number = try Settings.integer(flag, env: env, default: value)
        guard range.contains(number) else {
            throw ValidationError("\(name) (or \(env)) must be from \(range.lowerBound) to \(range.upperBound), not \(number).")
        }
        return number
    }

    /// `http://HOST:PORT` (or `HOST:PORT`) as host and port.
    static func hostAndPort(_ text: String?) throws -> (String, Int) {
        guard let text else { return (GatewayDefaults.host, GatewayDefaults.port) }
        var rest = Substring(text)
        if rest.hasPrefix("http://") { rest = rest.dropFirst("http://".count) }
        if rest.hasSuffix("/") { rest = rest.dropLast() }
        guard let colon = rest.lastIndex(of: ":"), let port = Int(rest[rest.index(after: colon)...]),
            (0...65535).contains(port), colon > rest.startIndex
        else {
            throw ValidationError(
                "--http (or ONBOARDING_GATEWAY_HTTP) must look like http://127.0.0.1:8080, not '\(text)'. The gateway speaks plain HTTP; TLS is for the proxy in front of it.")
        }
        var host = String(rest[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        return (host, port)
    }
}
