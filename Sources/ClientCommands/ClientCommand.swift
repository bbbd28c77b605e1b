import ArgumentParser
import Foundation
import Messaging
import OnboardingAPI
import OnboardingClient
import OnboardingSettings

/// `onboarding-client`: drives the flows an app drives, one command at a time.
public struct ClientCommand: AsyncParsableCommand {
    public static let configuration = CommandConfiguration(
        commandName: "onboarding-client",
        abstract: "Drive the onboarding flows as an app would: sign in, check, set up a profile, sign out, withdraw.",
        discussion: """
            The session from sign-in is kept in a small state file (--client-state, env \(Setting.clientState.environmentVariable), \
            default ~/.onboarding-client/session.json) for the commands after it. Errors are printed with their \
            code and a hint, and the command exits with status 1.
            """,
        subcommands: [
            SignInCommand.self, CheckCommand.self, CheckUsernameCommand.self, SetUpCommand.self,
            ProfileCommand.self, SignOutCommand.self, WithdrawCommand.self, WaitIntentCommand.self, HealthCommand.self,
        ])

    public init() {}
}

/// Options every client subcommand takes.
struct ClientOptions: ParsableArguments {
    @OptionGroup var endpoints: EndpointOptions
    @OptionGroup var calls: CallOptions
    @Option(help: ArgumentHelp(Setting.clientState.helpLine))
    var clientState: String?
    @Flag(help: "Print the reply as one JSON object instead of text.")
    var json = false

    var sessionFile: SessionFile { SessionFile(path: clientState ?? SessionFile.defaultPath) }

    /// Runs `body` with a client holding the saved session.
    func withClient<T: Sendable>(_ body: (OnboardingClient) async throws -> T) async throws -> T {
        bootstrapToolLogging()
        let session = sessionFile.load()
        let configuration = endpoints.clientConfiguration(calls)
        let bus = try endpoints.busConfiguration(for: .client)
        return try await withBus(name: configuration.name, configuration: bus) { bus in
            try await body(OnboardingClient(bus: bus, configuration: configuration, session: session))
        }
    }
}

struct SignInCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sign-in", abstract: "Sign in with a provider account and keep the session.")

    @Option(help: "google, apple, kakao or naver.")
    var provider: Provider
    @Option(help: "The provider's id for the account: all dev mode needs (any name you like); ignored otherwise.")
    var subject: String = ""
    @Option(help: "Google, Apple, Kakao: the provider's ID token (onboarding-fake-provider token makes one for a local fake).")
    var idToken: String?
    @Option(help: "Naver: the access token from Naver's sign-in. Google: optionally its OAuth access token (revoked on withdrawal).")
    var accessToken: String?
    @Option(help: "The raw nonce given to the provider's sign-in, when there was one; the ID token must carry it.")
    var nonce: String?
    @Option(help: "Apple: the authorization code of the same sign-in (exchanged to unlink the account at Apple on withdrawal).")
    var authorizationCode: String?
    @OptionGroup var options: ClientOptions

    func run() async throws {
        let result = try await options.withClient { client in
            try await client.signIn(
                provider: provider, subject: subject, idToken: idToken, accessToken: accessToken, nonce: nonce,
                authorizationCode: authorizationCode)
        }
        try options.sessionFile.save(.init(uid: result.uid, sessionToken: result.sessionToken, provider: result.provider))
        if options.json { return Terminal.line(Terminal.json(result)) }
        Terminal.line("signed in with \(result.provider.rawValue) as uid \(result.uid)\(result.isNewAccount ? " (new account)" : "")")
        Terminal.line("session saved in \(options.sessionFile.path)")
    }
}

struct CheckCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check", abstract: "\"Check me now\", as the app does whenever Home appears.")
    @OptionGroup var options: ClientOptions

    func run() async throws {
        _ = try options.sessionFile.require()
        let status = try await options.withClient { try await $0.checkNow() }
        if options.json { return Terminal.line(Terminal.json(status)) }
        Terminal.line(status.hasProfile ? "has a profile: nothing to do" : "no profile: \(status.intent?.rawValue ?? "-")")
    }
}

struct CheckUsernameCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check-username", abstract: "Check a username's format here and its availability with the profile service.")
    @Argument(help: "The username to check.")
    var username: String
    @OptionGroup var options: ClientOptions

    func run() async throws {
        let checked = UsernameRules.check(username)
        if let problem = checked.problem {
            let answer = UsernameAvailability(username: checked.normalized, available: false, reason: problem)
            if options.json { Terminal.line(Terminal.json(answer)) } else { Terminal.report(.username(problem)) }
            throw ExitCode.failure
        }
        let answer = try await options.withClient { try await $0.checkUsername(username) }
        if options.json {
            Terminal.line(Terminal.json(answer))
        } else {
            Terminal.line(answer.available ? "\(answer.username) is available" : "\(answer.username) is not available (\(answer.reason?.rawValue ?? "-"))")
        }
        if !answer.available { throw ExitCode.failure }
    }
}

struct SetUpCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set-up", abstract: "Set up the profile: upload the image (if any), create the profile, then dismiss.")
    @Option(help: "The username (2 to 9 letters, digits, Hangul syllables or _).")
    var username: String
    @Option(help: "A PNG, JPEG, WebP or HEIC file for the profile image.")
    var image: String?
    @OptionGroup var options: ClientOptions

    func run() async throws {
        _ = try options.sessionFile.require()
        var bytes: Data?
        if let image {
            guard let data = FileManager.default.contents(atPath: image) else {
                Terminal.note("error: cannot read the image file \(image)")
                throw ExitCode.failure
            }
            bytes = data
        }
        let profile = try await options.withClient { client in
            try await client.setUpProfile(username: username, image: bytes)
        }
        if options.json { return Terminal.line(Terminal.json(profile)) }
        Terminal.line("profile created: \(profile.username)\(profile.imagePath.map { ", image \($0)" } ?? "")")
    }
}

struct ProfileCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "profile", abstract: "Show the signed-in person's profile.")
    @OptionGroup var options: ClientOptions

    func run() async throws {
        _ = try options.sessionFile.require()
        let profile = try await options.withClient { try await $0.profile() }
        if options.json { return Terminal.line(Terminal.json(ProfileResult(profile: profile))) }
        guard let profile else { return Terminal.line("no profile yet") }
        Terminal.line("username:  \(profile.username)")
        Terminal.line("image:     \(profile.imagePath ?? "-")")
        Terminal.line("created:   \(profile.createdAt)")
        Terminal.line("updated:   \(profile.updatedAt)")
    }
}

struct SignOutCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "sign-out", abstract: "End the session; the profile stays.")
    @Flag(help: "End every session of the account, on every device.")
    var everywhere = false
    @OptionGroup var options: ClientOptions

    func run() async throws {
        let session = try options.sessionFile.require()
        try await options.withClient { try await $0.signOut(everywhere: everywhere) }
        try options.sessionFile.save(nil)
        Terminal.line("signed out \(session.uid)\(everywhere ? " everywhere" : "")")
    }
}

struct WithdrawCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "withdraw", abstract: "Delete the account, with its profile, username and images.")
    @OptionGroup var options: ClientOptions

    func run() async throws {
        let session = try options.sessionFile.require()
        try await options.withClient { try await $0.withdraw() }
        try options.sessionFile.save(nil)
        Terminal.line("withdrew \(session.uid): its profile and images are being deleted")
    }
}

struct WaitIntentCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "wait-intent", abstract: "Wait for the signed-in person's next route intent and print it.")
    @Option(help: "Give up after this many seconds.")
    var timeout: Int = 30
    @OptionGroup var options: ClientOptions

    func run() async throws {
        let session = try options.sessionFile.require()
        let timeout = self.timeout
        let received: ReceivedIntent? = try await options.withClient { client in
            let intents = try await client.routeIntents(for: session.uid)
            return await withTaskGroup(of: ReceivedIntent?.self) { group in
                group.addTask {
                    for await intent in intents { return intent }
                    return nil
                }
                group.addTask {
                    try? await Task.sleep(for: .seconds(timeout))
                    return nil
                }
                let first = await group.next() ?? nil
                group.cancelAll()
                return first
            }
        }
        guard let received else {
            Terminal.note("error: no route intent for \(session.uid) within \(timeout) s")
            throw ExitCode.failure
        }
        Terminal.line(options.json ? IntentLine.json(received) : IntentLine.text(received, color: false))
    }
}

struct HealthCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "health", abstract: "Ask every service whether it is up.")
    @Option(help: "Keep asking for up to this many seconds until every service answers.")
    var wait: Int = 0
    @Flag(help: "Print nothing; only the exit status says whether all are up.")
    var quiet = false
    @OptionGroup var endpoints: EndpointOptions
    @Option(help: "How long to wait for each reply, in milliseconds.")
    var timeoutMs: Int = 3000

    func run() async throws {
        bootstrapToolLogging()
        let services = endpoints.services
        let timeout = Duration.milliseconds(timeoutMs)
        let down: [String] = try await withBus(name: "onboarding-client", configuration: try endpoints.busConfiguration(for: .client)) { bus in
            // One deadline for all services: an attempt may start until `wait` is over, and
            // gets its full timeout. With no time left, each service is asked once.
            let deadline = ContinuousClock.now.advanced(by: .seconds(wait))
            var down: [String] = []
            for service in services {
                let left = ContinuousClock.now.duration(to: deadline)
                do {
                    let status = try await bus.callRetrying(
                        HealthCheck(), to: service.endpoint, source: "onboarding-client", timeout: timeout,
                        retry: RetryPolicy(initial: .milliseconds(100), maximum: .milliseconds(100)),
                        deadline: max(left, .zero) + timeout, retryingOn: left > .zero ? ErrorCode.retryable : [])
                    if !quiet { Terminal.line("\(service.name.padding(toLength: 24, withPad: " ", startingAt: 0)) up    \(service.endpoint)  since \(status.startedAt)") }
                    if !quiet, let counts = Self.nonZero(status.statistics) {
                        Terminal.line("    bus: \(counts)")
                    }
                    for feed in (quiet ? nil : status.feeds) ?? [] {
                        Terminal.line(
                            "    feed from \(feed.publisher): through \(feed.sequence), \(feed.handled) handled, "
                                + "\(feed.replayed) fetched with events.after, \(feed.duplicatesDropped) duplicates dropped, \(feed.lost) lost")
                    }
                    if !quiet, let unlink = status.unlink {
                        Terminal.line(
                            "    unlinks pending: \(unlink.pending)" + (unlink.oldestPendingSeconds.map { ", the oldest for \($0) s" } ?? "")
                                + (unlink.lastError.map { "; last error: \($0) (\(unlink.lastErrorAt ?? ""))" } ?? ""))
                    }
                    if !quiet, service.endpoint.isList {
                        await Self.showReplicas(of: service, bus: bus, timeout: timeout)
                    }
                } catch let error as ServiceError {
                    if !quiet { Terminal.line("\(service.name.padding(toLength: 24, withPad: " ", startingAt: 0)) DOWN  \(service.endpoint)  (\(error.code))") }
                    down.append(service.name)
                }
            }
            return down
        }
        if !down.isEmpty { throw ExitCode.failure }
    }
}

extension HealthCommand {
    /// One line per replica of a service whose endpoint lists several: the service answered,
    /// and this says which of its replicas do (a standby orchestrator answers nothing).
    static func showReplicas(of service: (name: String, endpoint: Endpoint), bus: any MessageBus, timeout: Duration) async {
        for replica in service.endpoint.replicas {
            let state: String
            do {
                let status = try await bus.call(HealthCheck(), to: replica, source: "onboarding-client", timeout: timeout)
                state = "up    since \(status.startedAt)"
            } catch let error as ServiceError {
                state = service.name == ServiceName.orchestrator && error.code == .noResponder
                    ? "not answering (standing by, or down)" : "DOWN  (\(error.code))"
            } catch {
                state = "DOWN  (\(error))"
            }
            Terminal.line("    replica \(replica)  \(state)")
        }
    }

    /// The bus's counts that are not 0, as `name value` pairs, or `nil` when all are.
    static func nonZero(_ statistics: BusStatistics) -> String? {
        let counts: [(String, Int)] = [
            ("droppedEvents", statistics.droppedEvents), ("unreadableEvents", statistics.unreadableEvents),
            ("overloadedRequests", statistics.overloadedRequests), ("rejectedRequests", statistics.rejectedRequests),
            ("lateReplies", statistics.lateReplies), ("refusedHandshakes", statistics.refusedHandshakes),
            ("failedHandshakes", statistics.failedHandshakes), ("slowSubscribers", statistics.slowSubscribers),
            ("droppedReplies", statistics.droppedReplies),
        ]
        let shown = counts.filter { $0.1 != 0 }.map { "\($0.0) \($0.1)" }
        return shown.isEmpty ? nil : shown.joined(separator: ", ")
    }
}

extension Provider: ExpressibleByArgument {}
