import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import PostgresNIO
import PostgresSupport

/// Where the services keep their data, as compose lays it out under the data directory.
public struct StoreLocations: Sendable, Hashable {
    /// auth's SQLite file (`<data-dir>/auth.sqlite`), unless ``authPostgres`` is set.
    public var authDatabase: String
    /// auth's PostgreSQL database, when it keeps its store there (`postgres.url`).
    public var authPostgres: PostgresLocation?
    /// profile's SQLite file (`<data-dir>/profile.sqlite`), unless ``profilePostgres`` is set.
    public var profileDatabase: String
    /// profile's PostgreSQL database, when it keeps its store there (`postgres.url`).
    public var profilePostgres: PostgresLocation?
    /// image-upload's root: images are `<root>/<uid>/<file>`.
    public var imageDirectory: String

    public init(
        authDatabase: String, authPostgres: PostgresLocation? = nil, profileDatabase: String,
        profilePostgres: PostgresLocation? = nil, imageDirectory: String
    ) {
        self.authDatabase = authDatabase
        self.authPostgres = authPostgres
        self.profileDatabase = profileDatabase
        self.profilePostgres = profilePostgres
        self.imageDirectory = imageDirectory
    }
}

/// A profile row as the profile store holds it.
public struct StoredProfile: Sendable, Hashable {
    public var username: String
    public var imagePath: String?

    public init(username: String, imagePath: String?) {
        self.username = username
        self.imagePath = imagePath
    }
}

/// What the stores held at one moment.
public struct StoreSnapshot: Sendable {
    /// Every account's uid.
    public var accounts: Set<String> = []
    /// Account uids by `<provider>/<subject>`, to name people whose sign-in was never answered.
    public var accountBySubject: [String: String] = [:]
    /// Live sessions per uid (people with none are absent).
    public var sessions: [String: Int] = [:]
    public var profiles: [String: StoredProfile] = [:]
    /// Who holds each username, keyed both by the store's uniqueness key and by the lowercased
    /// name as stored (so a name is found whatever way the store keys it).
    public var usernameHolders: [String: String] = [:]
    /// The files in each person's image folder (temporary upload files included), for the uids asked about.
    public var imageFiles: [String: [String]] = [:]
    /// Stores that could not be read.
    public var problems: [String] = []

    public init() {}

    public static func subjectKey(provider: Provider, subject: String) -> String { "\(provider.rawValue)/\(subject)" }

    mutating func addProfile(uid: String, username: String, key: String, imagePath: String?) {
        profiles[uid] = StoredProfile(username: username, imagePath: imagePath)
        usernameHolders[key] = uid
        usernameHolders[username.lowercased()] = uid
    }
}

/// Reads the stores directly: SQLite files opened read-only (on a thread of ``Blocking``), the
/// PostgreSQL schemas of auth and profile when they are there, and the image folders.
enum StoreInspector {
    /// Takes a snapshot, listing the image folders of `uids`.
    static func snapshot(of locations: StoreLocations, uids: Set<String>) async throws -> StoreSnapshot {
        var snapshot = try await Blocking.run { read(locations, uids: uids) }
        if let postgres = locations.authPostgres {
            do {
                try await readAuth(postgres, into: &snapshot)
            } catch {
                snapshot.problems.append("auth's store at \(postgres) could not be read: \(error)")
            }
        }
        if let postgres = locations.profilePostgres {
            do {
                try await readProfiles(postgres, into: &snapshot)
            } catch {
                snapshot.problems.append("profile's store at \(postgres) could not be read: \(error)")
            }
        }
        return snapshot
    }

    /// auth's accounts and live sessions, from its PostgreSQL schema.
    private static func readAuth(_ location: PostgresLocation, into snapshot: inout StoreSnapshot) async throws {
        let (accounts, sessions) = try await withClient(of: location) { client, logger in
            var accounts: [(String, String, String)] = []
            for try await row in try await client.query("SELECT uid, provider, subject FROM account", logger: logger)
                .decode((String, String, String).self)
            { accounts.append(row) }
            var sessions: [(String, Int64)] = []
            for try await row in try await client.query("SELECT uid, count(*) FROM session GROUP BY uid", logger: logger)
                .decode((String, Int64).self)
            { sessions.append(row) }
            return (accounts, sessions)
        }
        for (uid, provider, subject) in accounts {
            snapshot.accounts.insert(uid)
            snapshot.accountBySubject["\(provider)/\(subject)"] = uid
        }
        for (uid, live) in sessions { snapshot.sessions[uid] = Int(live) }
    }

    /// profile's profiles, from its PostgreSQL schema.
    private static func readProfiles(_ location: PostgresLocation, into snapshot: inout StoreSnapshot) async throws {
        let rows = try await withClient(of: location) { client, logger in
            var rows: [(String, String, String, String?)] = []
            for try await row in try await client.query("SELECT uid, username, username_key, image_path FROM profile", logger: logger)
                .decode((String, String, String, String?).self)
            { rows.append(row) }
            return rows
        }
        for (uid, username, key, imagePath) in rows { snapshot.addProfile(uid: uid, username: username, key: key, imagePath: imagePath) }
    }

    /// Runs `body` with a client of `location`'s database, open for as long as `body` runs.
    private static func withClient<T: Sendable>(
        of location: PostgresLocation, _ body: (PostgresClient, Logger) async throws -> T
    ) async throws -> T {
        var logger = Logger(label: "onboarding-chaos.postgres")
        logger.logLevel = .critical
        let client = PostgresClient(configuration: location.clientConfiguration(applicationName: "onboarding-chaos"), backgroundLogger: logger)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            return try await body(client, logger)
        }
    }

    private static func read(_ locations: StoreLocations, uids: Set<String>) -> StoreSnapshot {
        var snapshot = StoreSnapshot()
        if locations.authPostgres == nil { readAuth(locations.authDatabase, into: &snapshot) }
        if locations.profilePostgres == nil {
            do {
                let rows = try fetch(
                    locations.profileDatabase, sql: "SELECT uid, username, usernameKey, imagePath FROM profile")
                for row in rows {
                    snapshot.addProfile(uid: row["uid"], username: row["username"], key: row["usernameKey"], imagePath: row["imagePath"])
                }
            } catch {
                snapshot.problems.append("profile's store \(locations.profileDatabase) could not be read: \(error)")
            }
        }
        let files = FileManager.default
        var isDirectory: ObjCBool = false
        if files.fileExists(atPath: locations.imageDirectory, isDirectory: &isDirectory), isDirectory.boolValue {
            do {
                let folders = Set(try files.contentsOfDirectory(atPath: locations.imageDirectory))
                for uid in uids where folders.contains(uid) {
                    // A withdrawal leaves `.withdrawn` there on purpose (it refuses late uploads).
                    let names = ((try? files.contentsOfDirectory(atPath: "\(locations.imageDirectory)/\(uid)")) ?? [])
                        .filter { $0 != ".withdrawn" }
                    if !names.isEmpty { snapshot.imageFiles[uid] = names.sorted() }
                }
            } catch {
                snapshot.problems.append("the image folder \(locations.imageDirectory) could not be listed: \(error)")
            }
        }
        // No folder at all: image-upload has stored nothing yet, which is a valid state.
        return snapshot
    }

    /// auth's accounts and live sessions, from its SQLite file.
    private static func readAuth(_ path: String, into snapshot: inout StoreSnapshot) {
        do {
            let rows = try fetch(path, sql: "SELECT uid, provider, subject FROM account")
            for row in rows {
                let uid: String = row["uid"]
                snapshot.accounts.insert(uid)
                snapshot.accountBySubject["\(row["provider"] as String)/\(row["subject"] as String)"] = uid
            }
            for row in try fetch(path, sql: "SELECT uid, COUNT(*) AS live FROM session GROUP BY uid") {
                snapshot.sessions[row["uid"] as String] = row["live"] as Int
            }
        } catch {
            snapshot.problems.append("auth's store \(path) could not be read: \(error)")
        }
    }

    /// Opens `path` read-only (never creating it), runs `sql`, and closes it again.
    private static func fetch(_ path: String, sql: String) throws -> [Row] {
        guard FileManager.default.fileExists(atPath: path) else {
            throw ServiceError(.storeUnavailable, "there is no such file")
        }
        var configuration = Configuration()
        configuration.readonly = true
        configuration.busyMode = .timeout(10)
        configuration.label = "onboarding-chaos"
        let database = try DatabaseQueue(path: path, configuration: configuration)
        defer { try? database.close() }
        return try database.read { db in try Row.fetchAll(db, sql: sql) }
    }
}
