import Foundation
import Logging
import Messaging
import PostgresNIO

/// Where a service's PostgreSQL database is, read from a URL in libpq's form:
///
///     postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=disable|prefer|require][&host=/socket/dir]
///
/// `host=` in the query names the directory of a Unix socket to connect through instead of TCP
/// (as libpq reads it); the port then picks the socket file (`.s.PGSQL.PORT`). `sslmode`
/// defaults to `prefer`. Each service keeps its tables in a schema of its own (``schema``), so one
/// database can hold them all.
public struct PostgresLocation: Sendable, Hashable, CustomStringConvertible {
    public enum TLSMode: String, Sendable, Hashable {
        case disable, prefer, require
    }

    public var host: String
    public var port: Int
    public var socketDirectory: String?
    public var username: String
    public var password: String?
    public var database: String
    public var tls: TLSMode
    /// The schema the service's tables live in.
    public var schema: String

    /// Reads `url`, for the tables of `schema`.
    ///
    /// - Throws: ``ServiceError`` `invalidRequest` naming what is wrong with the URL or the schema.
    public init(url: String, schema: String) throws(ServiceError) {
        guard let components = URLComponents(string: url), ["postgresql", "postgres"].contains(components.scheme ?? "")
        else {
            throw ServiceError(
                .invalidRequest,
                "\(Self.redacted(url)) is not a PostgreSQL URL: write postgresql://USER@HOST:PORT/DATABASE.")
        }
        guard let username = components.user, !username.isEmpty else {
            throw ServiceError(.invalidRequest, "\(Self.redacted(url)) names no user: write postgresql://USER@HOST:PORT/DATABASE.")
        }
        let database = String(components.path.drop { $0 == "/" })
        guard !database.isEmpty else {
            throw ServiceError(.invalidRequest, "\(Self.redacted(url)) names no database: write postgresql://USER@HOST:PORT/DATABASE.")
        }
        let query = Dictionary((components.queryItems ?? []).map { ($0.name, $0.value ?? "") }) { _, last in last }
        let tls = try TLSMode(rawValue: query["sslmode"] ?? "prefer").orThrow(
            ServiceError(.invalidRequest, "sslmode in \(Self.redacted(url)) must be disable, prefer or require."))
        self.host = components.host ?? "127.0.0.1"
        self.port = components.port ?? 5432
        self.socketDirectory = query["host"].flatMap { $0.hasPrefix("/") ? $0 : nil }
        self.username = username
        self.password = components.password
        self.database = database
        self.tls = tls
        self.schema = try Self.checkedSchema(schema)
    }

    /// The URL with its password left out, for logs and errors.
    public var description: String {
        "postgresql://\(username)@\(host):\(port)/\(database)"
            + (socketDirectory.map { "?host=\($0)" } ?? "") + " (schema \(schema))"
    }

    /// How postgres-nio connects: every connection starts with `search_path` set to ``schema``,
    /// so the service's statements name its tables without a schema, and asks the server to
    /// probe the connection when idle: a client whose host has gone is noticed within about
    /// 25 s (not the system's two hours), so its session ends and, for a leading orchestrator,
    /// its lead passes on. (Unix-socket connections need no probing and ignore it.)
    public func clientConfiguration(applicationName: String) -> PostgresClient.Configuration {
        var configuration: PostgresClient.Configuration
        if let socketDirectory {
            configuration = PostgresClient.Configuration(
                unixSocketPath: "\(socketDirectory)/.s.PGSQL.\(port)", username: username, password: password,
                database: database)
        } else {
            let mode: PostgresClient.Configuration.TLS =
                switch tls {
                case .disable: .disable
                case .prefer: .prefer(.makeClientConfiguration())
                case .require: .require(.makeClientConfiguration())
                }
            configuration = PostgresClient.Configuration(
                host: host, port: port, username: username, password: password, database: database, tls: mode)
        }
        configuration.options.additionalStartupParameters = [
            ("search_path", schema), ("application_name", applicationName),
            ("tcp_keepalives_idle", "10"), ("tcp_keepalives_interval", "5"), ("tcp_keepalives_count", "3"),
            // The stores prepare their busiest statements (parsed once per connection), whose
            // inputs are arrays of one to thousands of rows: each run gets a plan for its own
            // sizes. With generic plans (made once, for arrays of any size, while the tables were
            // small) the orchestrator's read of a batch's people took 0.7 s a batch once the table
            // had grown: at 10,000 sign-ins a second throughput fell to a tenth.
            ("plan_cache_mode", "force_custom_plan"),
        ]
        return configuration
    }

    /// `schema` when it is a plain lower-case identifier (it is written into statements).
    public static func checkedSchema(_ schema: String) throws(ServiceError) -> String {
        let allowed = schema.utf8.allSatisfy { ($0 >= 97 && $0 <= 122) || ($0 >= 48 && $0 <= 57) || $0 == 95 }
        guard allowed, let first = schema.utf8.first, !(first >= 48 && first <= 57), schema.utf8.count <= 63 else {
            throw ServiceError(
                .invalidRequest,
                "The schema name \"\(schema)\" must be 1 to 63 of a-z, 0-9 and _, not starting with a digit.")
        }
        return schema
    }

    private static func redacted(_ url: String) -> String {
        guard var components = URLComponents(string: url), components.password != nil else { return url }
        components.password = "…"
        return components.string ?? "the URL"
    }
}

extension Optional {
    fileprivate func orThrow(_ error: ServiceError) throws(ServiceError) -> Wrapped {
        guard let value = self else { throw error }
        return value
    }
}
