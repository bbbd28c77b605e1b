import ArgumentParser
import ClientCommands
import Foundation
import Logging
import Messaging
import OnboardingAPI
import OnboardingSettings
import PostgresSupport

/// `onboarding-chaos`: the chaos test against a compose deployment.
public struct ChaosCommand: AsyncParsableCommand {
    public static let configuration = CommandConfiguration(
        commandName: "onboarding-chaos",
        abstract: "Drive simulated people through onboarding while killing, hanging and restarting the services, then check that nothing was lost or doubled.",
        discussion: """
            Each person signs in, sets up a profile (most of them; half with an image), signs out, signs in again, \
            asks "check me now" and withdraws, ends signed out or stays signed in. Some sign in on two devices (one \
            signs out while the other stays); some apps send "check me now" whenever Home appears (after each sign-in, \
            while the set-up is in flight, racing a sign-out). \
            Meanwhile, at random points of the drive: each service is SIGKILLed --kills times and hung (SIGSTOP, then \
            SIGCONT) --hangs times, every other hang right after a set-up was sent; two services are SIGKILLed at once \
            --double-kills times; every service is stopped at once --system-restarts times (SIGTERM, then SIGKILL, \
            alternating). compose's supervise loop restarts what dies, on the same data. A stopped service always gets \
            SIGCONT, also when this tool is interrupted. \
            At the end the tool checks the stores (SQLite files read-only, the image folders), the route intents it \
            recorded from route. (plus events.after) and the route state (onboarding.routes) until everything holds or \
            --settle-timeout passes, and prints its counts. Exit status 1 when a person is lost (a rule broken: the \
            intent in force disagrees with the stores, a dismiss is missing, …), got a decision twice (two dismiss, or \
            two presentProfileSetup, for one state change), could not finish, or a planned fault did not happen.

            Run it against a system started by ./compose/onboarding up, or let ./compose/onboarding chaos start a fresh \
            one, run it and stop it.
            """)

    @Option(help: "How many people to drive.")
    var people = 1000
    @Option(help: "How many people are in the middle of their journey at once.")
    var concurrency = 64
    @Option(help: "How many times each service is SIGKILLed during the drive (0: none).")
    var kills = 3
    @Option(help: "How many times each service hangs during the drive: SIGSTOP, then SIGCONT after --hang-min-ms to --hang-max-ms; every other hang starts right after a set-up was sent (0: none).")
    var hangs = 2
    @Option(help: "The shortest hang, in milliseconds.")
    var hangMinMs = 2_000
    @Option(help: "The longest hang, in milliseconds.")
    var hangMaxMs = 4_000
    @Option(help: "How many times two services (a random pair) are SIGKILLed at once (0: none).")
    var doubleKills = 2
    @Option(help: "How many times the whole system stops and starts on the same data: every service signalled at once, the first time with SIGTERM, then SIGKILL, alternating (0: none).")
    var systemRestarts = 2
    @Option(help: "How many times compose's PostgreSQL is paused (SIGSTOP of every process of it, for a hang's length, then SIGCONT) during the drive. Default: 2 when auth keeps its store in PostgreSQL (postgres.url), else 0.")
    var databasePauses: Int?
    @Option(help: "How many times compose's PostgreSQL is restarted at once (pg_ctl restart -m immediate, through <run-dir>/postgres-restart) during the drive. Default: 2 when auth keeps its store in PostgreSQL, else 0.")
    var databaseRestarts: Int?
    @Option(help: "The seed of the run's choices (who sets up, who withdraws, which fault happens when). Default: random; it is printed.")
    var seed: UInt64?
    @Option(help: "The share of people who set up a profile, in percent.")
    var setUpPercent = 80
    @Option(help: "The share of set-ups that carry an image, in percent.")
    var imagePercent = 50
    @Option(help: "The share of people who withdraw at the end, in percent.")
    var withdrawPercent = 40
    @Option(help: "The share of people who sign in on a second device while the first is signed in, in percent.")
    var twoDevicePercent = 30
    @Option(help: "The share of people whose app sends \"check me now\" whenever Home appears (after each sign-in, during the set-up, racing a sign-out), in percent. Every app checks once before the end of the journey.")
    var checkPercent = 50
    @Option(help: "The share of people who do not withdraw and end signed out on every device, in percent (the others stay signed in).")
    var signOutPercent = 25
    @Option(help: "An image file every set-up with an image sends (such as compose/sample.png). Default: a small PNG of each person's own.")
    var image: String?

    @Option(help: ArgumentHelp(Setting.dataDir.helpLine))
    var dataDir: String?
    @Option(help: "Where compose keeps the services' pid files. Default: <data-dir>/run")
    var runDir: String?
    @Option(help: ArgumentHelp(Setting.authDatabase.helpLine))
    var authDatabase: String?
    @Option(help: ArgumentHelp(Setting.profileDatabase.helpLine))
    var profileDatabase: String?
    @Option(help: ArgumentHelp(Setting.imageDir.helpLine))
    var imageDir: String?
    @Option(help: ArgumentHelp("For onboarding.routes and events.after: " + Setting.serviceToken.helpLine))
    var serviceToken: String?

    @OptionGroup var endpoints: EndpointOptions

    @Option(help: "Also write the result as JSON to this file: the counts, and every person with what they did and what is wrong.")
    var reportFile: String?

    @Option(help: "How long one attempt of a request waits for its reply, in milliseconds.")
    var timeoutMs = 3000
    @Option(help: "How long one person may take over the whole journey, resends included, in seconds.")
    var personTimeout = 180
    @Option(help: "How long to wait at the end for the system to converge, in seconds.")
    var settleTimeout = 60
    @Option(help: "How long a killed service may take to come back (or a hung one to answer after SIGCONT), in seconds.")
    var recoveryTimeout = 120

    public init() {}

    public func validate() throws {
        guard people >= 1 else { throw ValidationError("--people must be at least 1.") }
        guard concurrency >= 1 else { throw ValidationError("--concurrency must be at least 1.") }
        for (name, value) in [
            ("--kills", kills), ("--hangs", hangs), ("--double-kills", doubleKills), ("--system-restarts", systemRestarts),
            ("--database-pauses", databasePauses ?? 0), ("--database-restarts", databaseRestarts ?? 0),
        ] {
            guard value >= 0 else { throw ValidationError("\(name) must be 0 or more.") }
        }
        guard hangMinMs >= 1, hangMaxMs >= hangMinMs else {
            throw ValidationError("--hang-min-ms must be at least 1, and --hang-max-ms at least --hang-min-ms.")
        }
        for (name, value) in [
            ("--set-up-percent", setUpPercent), ("--image-percent", imagePercent), ("--withdraw-percent", withdrawPercent),
            ("--two-device-percent", twoDevicePercent), ("--check-percent", checkPercent), ("--sign-out-percent", signOutPercent),
        ] {
            guard (0...100).contains(value) else { throw ValidationError("\(name) must be from 0 to 100.") }
        }
        guard timeoutMs >= 10, personTimeout >= 1, settleTimeout >= 0, recoveryTimeout >= 1 else {
            throw ValidationError("--timeout-ms must be at least 10, --person-timeout and --recovery-timeout at least 1, --settle-timeout at least 0.")
        }
    }

    public func run() async throws {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .warning
            return handler
        }
        let configuration = try await makeConfiguration()
        // A service this tool SIGSTOPped gets SIGCONT even when the tool is interrupted.
        StoppedProcesses.installSignalHandlers()
        let summary: ChaosSummary
        do {
            summary = try await ChaosRun(configuration: configuration, output: Self.line).run()
        } catch let error as ChaosSetupError {
            Self.line("onboarding-chaos: \(error)")
            throw ExitCode(2)
        }
        Self.line(Report.summary(summary))
        if let reportFile {
            do {
                try await ReportFile.write(summary, to: reportFile)
                Self.line("the whole result, person by person: \(reportFile)")
            } catch {
                Self.line("onboarding-chaos: could not write \(reportFile): \(error)")
            }
        }
        if !summary.passed { throw ExitCode.failure }
    }

    /// Writes a line to standard output at once (unbuffered, so progress shows even in a log file).
    @Sendable static func line(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }

    func makeConfiguration() async throws -> ChaosConfiguration {
        let settings = Settings(
            flags: [
                Setting.dataDir: dataDir, .authDatabase: authDatabase, .profileDatabase: profileDatabase, .imageDir: imageDir,
                .serviceToken: serviceToken,
            ].compactMapValues { $0 })
        let dataDirectory = settings.dataDirectory
        let endpoints = ChaosEndpoints(
            authRPC: endpoints.authRPC, profileRPC: endpoints.profileRPC, imageRPC: endpoints.imageRPC,
            orchestratorRPC: endpoints.orchestratorRPC, routes: endpoints.routesEndpoint)
        var imageBytes: Data?
        if let image {
            guard let bytes = try await Blocking.run({ FileManager.default.contents(atPath: image) }) else {
                throw ValidationError("Cannot read the image file \(image).")
            }
            imageBytes = bytes
        }
        let token = try await Blocking.run { try? settings.serviceToken(create: false) } ?? nil
        let postgres = try Self.postgres(settings, schema: .authPostgresSchema)
        let profilePostgres = try Self.postgres(settings, schema: .profilePostgresSchema)
        var seedGenerator = SystemRandomNumberGenerator()
        var configuration = ChaosConfiguration(
            people: people, concurrency: concurrency,
            faults: FaultCounts(
                killsPerService: kills, hangsPerService: hangs, hangMilliseconds: hangMinMs...hangMaxMs,
                doubleKills: doubleKills, systemRestarts: systemRestarts,
                databasePauses: databasePauses ?? (postgres == nil ? 0 : 2),
                databaseRestarts: databaseRestarts ?? (postgres == nil ? 0 : 2)),
            seed: seed ?? UInt64.random(in: 1...999_999_999, using: &seedGenerator),
            shares: RunPlan.Shares(
                setUp: Double(setUpPercent) / 100, image: Double(imagePercent) / 100,
                withdraw: Double(withdrawPercent) / 100, twoDevices: Double(twoDevicePercent) / 100,
                checks: Double(checkPercent) / 100, endSignedOut: Double(signOutPercent) / 100),
            endpoints: endpoints,
            stores: StoreLocations(
                authDatabase: settings.path(.authDatabase, derived: "\(dataDirectory)/auth.sqlite"),
                authPostgres: postgres,
                profileDatabase: settings.path(.profileDatabase, derived: "\(dataDirectory)/profile.sqlite"),
                profilePostgres: profilePostgres,
                imageDirectory: settings.path(.imageDir, derived: "\(dataDirectory)/images")),
            runDirectory: runDir ?? "\(dataDirectory)/run",
            serviceToken: token?.isEmpty == false ? token : nil,
            requestTimeout: .milliseconds(timeoutMs), personTimeout: .seconds(personTimeout),
            settleTimeout: .seconds(settleTimeout), recoveryTimeout: .seconds(recoveryTimeout), image: imageBytes)
        configuration.bus = try self.endpoints.busConfiguration(for: .chaos, more: [.dataDir: dataDir])
        return configuration
    }

    /// A service's PostgreSQL database (its tables in the schema `schema` names), when
    /// `postgres.url` says the stores are kept there.
    static func postgres(_ settings: Settings, schema: Setting) throws -> PostgresLocation? {
        do {
            return try PostgresLocation(settings, schema: schema)
        } catch {
            throw ValidationError(error.description)
        }
    }
}
