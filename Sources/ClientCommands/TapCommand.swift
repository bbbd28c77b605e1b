import ArgumentParser
import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingClient
import OnboardingSettings
import ServiceLifecycle
import ZeroMQMessaging

/// `onboarding-tap`: prints route intents as they happen.
public struct TapCommand: AsyncParsableCommand {
    public static let configuration = CommandConfiguration(
        commandName: "onboarding-tap",
        abstract: "Print route intents as they are sent: everyone's, or one person's.",
        discussion: """
            One line per intent: time, uid, intent, reason. With --current, first the intent in \
            force for each person (marked "current"), then what is sent after it. Ctrl-C stops it.
            """)

    @Option(help: "Only this person's intents.")
    var uid: String?
    @Flag(help: "First print the intent in force for the person (or for everyone), then follow live. Needs the service token.")
    var current = false
    @Option(help: ArgumentHelp("For --current: " + Setting.serviceToken.helpLine))
    var serviceToken: String?
    @Option(help: ArgumentHelp("For --current, the service token: " + Setting.dataDir.helpLine))
    var dataDir: String?
    @Flag(help: "Print one JSON object per line instead of text.")
    var json = false
    @Option(help: "Colour the text: auto (on a terminal), always or never.")
    var color: ColorChoice = .auto
    @OptionGroup var endpoints: EndpointOptions
    @OptionGroup var calls: CallOptions

    enum ColorChoice: String, ExpressibleByArgument, CaseIterable {
        case auto, always, never
    }

    public init() {}

    public func run() async throws {
        bootstrapToolLogging()
        let logger = Logger(label: "onboarding-tap")
        let bus = ZeroMQBus(source: "onboarding-tap", logger: logger, configuration: try endpoints.busConfiguration(for: .tap, more: [.dataDir: dataDir]))
        let useColor = color == .always || (color == .auto && Terminal.standardOutputIsTerminal)
        var token: String?
        if current {
            let settings = Settings(flags: [Setting.serviceToken: serviceToken, .dataDir: dataDir].compactMapValues { $0 })
            token = try settings.serviceToken(create: false)
            guard token != nil else {
                throw ValidationError(
                    "--current needs the service token: pass --service-token, set \(Setting.serviceToken.environmentVariable), or point --data-dir at the running system's data directory (no service.token in \(settings.dataDirectory)).")
            }
        }
        // Uids are lowercase UUIDs; topics match byte for byte.
        let tap = Tap(
            bus: bus, configuration: endpoints.clientConfiguration(calls), uid: uid?.lowercased(), json: json, color: useColor,
            orchestrator: endpoints.orchestratorRPC, serviceToken: token)
        let group = ServiceGroup(
            configuration: .init(
                // Stopped last to first: the bus stops after the tap.
                services: [.init(service: bus), .init(service: tap, successTerminationBehavior: .gracefullyShutdownGroup)],
                gracefulShutdownSignals: [.sigint, .sigterm], logger: logger))
        try await group.run()
    }
}

/// Follows route intents until graceful shutdown.
struct Tap: Service {
    let bus: ZeroMQBus
    let configuration: OnboardingClient.Configuration
    let uid: String?
    let json: Bool
    let color: Bool
    let orchestrator: Endpoint
    /// Set with `--current`: print the intents in force first.
    let serviceToken: String?

    func run() async throws {
        let client = OnboardingClient(bus: bus, configuration: configuration)
        // Subscribe first, then read the state: nothing sent in between is missed (zguide's
        // Clone pattern). Live intents the state already reflects are skipped.
        let intents = try await client.routeIntents(for: uid)
        var shown: [String: UInt64] = [:]
        if let serviceToken {
            for state in try await currentStates(token: serviceToken) {
                guard let intent = state.intent, let sequence = state.sequence else { continue }
                shown[state.uid] = sequence
                let line = ReceivedIntent(intent: intent, time: state.time ?? "", sequence: sequence)
                Terminal.line(json ? IntentLine.json(line, current: true) : IntentLine.text(line, color: color, current: true))
            }
        }
        let alreadyShown = shown
        Terminal.note("listening for \(uid.map { "route intents of \($0)" } ?? "every route intent") at \(configuration.routes); Ctrl-C to stop")
        await withDiscardingTaskGroup { group in
            group.addTask { await watchOrchestrator(client) }
            group.addTask {
                for await received in intents.cancelOnGracefulShutdown() {
                    if let seen = alreadyShown[received.intent.uid], received.sequence <= seen { continue }
                    Terminal.line(json ? IntentLine.json(received) : IntentLine.text(received, color: color))
                }
            }
            try? await gracefulShutdown()
            group.cancelAll()
        }
    }

    /// The intents in force: one person's, or everyone's page by page.
    private func currentStates(token: String) async throws -> [RouteState] {
        if let uid {
            return [try await bus.call(CurrentIntent(), to: orchestrator, source: "onboarding-tap", uid: uid, serviceToken: token)]
        }
        var states: [RouteState] = []
        var after: String?
        repeat {
            let page = try await bus.call(
                ListRouteStates(afterUID: after), to: orchestrator, source: "onboarding-tap", serviceToken: token)
            states += page.states
            after = page.nextUID
        } while after != nil
        return states
    }

    /// Says clearly when nothing answers where the tap listens, and again when it comes up.
    private func watchOrchestrator(_ client: OnboardingClient) async {
        var reportedDown = false
        while !Task.isCancelled {
            do {
                _ = try await client.health(of: orchestrator)
                if reportedDown { Terminal.note("the orchestrator at \(orchestrator) is up now") }
                return
            } catch let error as ServiceError where error.code == .noResponder || error.code == .timeout {
                if !reportedDown {
                    Terminal.note(
                        "warning: nothing answers at \(orchestrator) (\(error.code)): is the system running? "
                            + "Start it with ./compose/onboarding up. Still listening; intents will show once it is up.")
                    reportedDown = true
                }
                try? await Task.sleep(for: .seconds(1))
            } catch {
                return
            }
        }
    }
}

/// How an intent is printed.
enum IntentLine {
    struct Record: Encodable {
        var time: String
        var uid: String
        var intent: String
        var reason: String
        var intentId: String
        var sequence: UInt64
        /// Set on the intents in force printed by `--current`.
        var current: Bool?
    }

    static func json(_ received: ReceivedIntent, current: Bool = false) -> String {
        Terminal.json(Record(
            time: received.time, uid: received.intent.uid, intent: received.intent.intent.rawValue,
            reason: received.intent.reason.rawValue, intentId: received.intent.intentId, sequence: received.sequence,
            current: current ? true : nil))
    }

    static func text(_ received: ReceivedIntent, color: Bool, current: Bool = false) -> String {
        let intent = received.intent
        let clock = received.time.split(separator: "T").last.map { String($0.dropLast()) } ?? received.time
        let name = intent.intent.rawValue.padding(toLength: 19, withPad: " ", startingAt: 0)
        let painted = Terminal.paint(name, intent.intent == .dismiss ? .green : .yellow, when: color)
        let marker = current ? Terminal.paint("  (current)", .dim, when: color) : ""
        let reason = Terminal.paint(intent.reason.rawValue.padding(toLength: 14, withPad: " ", startingAt: 0), .cyan, when: color)
        // The id's start tells a repeat of the intent in force (same id) from a new decision.
        let id = Terminal.paint("id \(intent.intentId.prefix(8))", .dim, when: color)
        return "\(Terminal.paint(clock, .dim, when: color))  \(intent.uid)  \(painted)  \(reason)  \(id)\(marker)"
    }
}
