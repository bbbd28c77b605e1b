import ArgumentParser
import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingClient
import ServiceLifecycle
import ZeroMQMessaging

/// `onboarding-tap`: prints route intents as they happen.
public struct TapCommand: AsyncParsableCommand {
    public static let configuration = CommandConfiguration(
        commandName: "onboarding-tap",
        abstract: "Print route intents as they are sent: everyone's, or one person's.",
        discussion: "One line per intent: time, uid, intent, reason. Ctrl-C stops it.")

    @Option(help: "Only this person's intents.")
    var uid: String?
    @Flag(help: "Print one JSON object per line instead of text.")
    var json = false
    @Option(help: "Colour the text: auto (on a terminal), always or never.")
    var color: ColorChoice = .auto
    @OptionGroup var endpoints: EndpointOptions

    enum ColorChoice: String, ExpressibleByArgument, CaseIterable {
        case auto, always, never
    }

    public init() {}

    public func run() async throws {
        bootstrapToolLogging()
        let logger = Logger(label: "onboarding-tap")
        let bus = ZeroMQBus(source: "onboarding-tap", logger: logger)
        let useColor = color == .always || (color == .auto && Terminal.standardOutputIsTerminal)
        // Uids are lowercase UUIDs; topics match byte for byte.
        let tap = Tap(
            bus: bus, configuration: endpoints.clientConfiguration, uid: uid?.lowercased(), json: json, color: useColor,
            orchestrator: endpoints.orchestratorRPC)
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

    func run() async throws {
        let client = OnboardingClient(bus: bus, configuration: configuration)
        let intents = try await client.routeIntents(for: uid)
        Terminal.note("listening for \(uid.map { "route intents of \($0)" } ?? "every route intent") at \(configuration.routes); Ctrl-C to stop")
        await withDiscardingTaskGroup { group in
            group.addTask { await watchOrchestrator(client) }
            group.addTask {
                for await received in intents.cancelOnGracefulShutdown() {
                    Terminal.line(json ? IntentLine.json(received) : IntentLine.text(received, color: color))
                }
            }
            try? await gracefulShutdown()
            group.cancelAll()
        }
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
    }

    static func json(_ received: ReceivedIntent) -> String {
        Terminal.json(Record(
            time: received.time, uid: received.intent.uid, intent: received.intent.intent.rawValue,
            reason: received.intent.reason.rawValue, intentId: received.intent.intentId, sequence: received.sequence))
    }

    static func text(_ received: ReceivedIntent, color: Bool) -> String {
        let intent = received.intent
        let clock = received.time.split(separator: "T").last.map { String($0.dropLast()) } ?? received.time
        let name = intent.intent.rawValue.padding(toLength: 19, withPad: " ", startingAt: 0)
        let painted = Terminal.paint(name, intent.intent == .dismiss ? .green : .yellow, when: color)
        return "\(Terminal.paint(clock, .dim, when: color))  \(intent.uid)  \(painted)  \(Terminal.paint(intent.reason.rawValue, .cyan, when: color))"
    }
}
