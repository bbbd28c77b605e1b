import Messaging

/// What each program may do on the bus beyond an app's requests, by the name of its CURVE key:
/// the one table the servers enforce and the README shows.
///
/// An app's requests (those that carry a `sessionToken`, and the open ones) are every known
/// key's to make: the session decides whose they are. What this table governs is the rest: the
/// requests made without a session (which once needed only the shared service token) and who may
/// follow each publisher. Keys not named here (the tap's, the client's, the chaos and bench
/// tools', an operator's) are ``operators``.
public enum BusRights {
    /// Stands for every key that is not one of ``programKeys``.
    public static let operators = "operators"
    /// The keys of our services and the gateway.
    public static let programKeys: Set<String> = ["auth", "profile", "image-upload", "orchestrator", "gateway"]

    /// Per server (by ``ServiceName``), the requests it answers without a session, and who may make them.
    public static let requests: [String: [String: Set<String>]] = [
        ServiceName.auth: [EventsAfter.type: ["orchestrator"]],
        ServiceName.profile: [
            GetProfile.type: ["orchestrator"], CreateProfile.type: ["orchestrator"], AbandonCreates.type: ["orchestrator"],
            UpdateProfile.type: ["orchestrator"],
            DeleteProfile.type: ["orchestrator"], EvictCachedProfile.type: ["orchestrator"], EventsAfter.type: ["orchestrator"],
        ],
        ServiceName.imageUpload: [
            UploadImage.type: ["orchestrator"], DeleteImage.type: ["orchestrator"], DeleteAllImages.type: ["orchestrator"],
        ],
        ServiceName.orchestrator: [
            EventsAfter.type: ["gateway", operators], CurrentIntent.type: ["gateway", operators],
            ListRouteStates.type: ["gateway", operators],
        ],
    ]

    /// Per publisher (by the ``ServiceName`` of the server that binds it), who may follow it.
    public static let followers: [String: Set<String>] = [
        ServiceName.auth: ["orchestrator"],
        ServiceName.profile: ["orchestrator"],
        ServiceName.orchestrator: ["gateway", operators],
    ]

    /// Whether the key `caller` may make `type` at `server` without a session.
    public static func may(_ caller: String, make type: String, at server: String) -> Bool {
        admits(requests[server]?[type] ?? [], caller)
    }

    /// Whether the key `caller` may follow the publisher of `server`.
    public static func may(_ caller: String, follow server: String) -> Bool {
        admits(followers[server] ?? [], caller)
    }

    private static func admits(_ callers: Set<String>, _ caller: String) -> Bool {
        callers.contains(caller) || (!programKeys.contains(caller) && callers.contains(operators))
    }

    /// The refusal of a request the caller's key has no right to.
    public static func refusal(_ caller: String, _ type: String, at server: String) -> ServiceError {
        ServiceError(
            .forbidden,
            "The key '\(caller)' may not make \(type) at \(server) without a session (the README's rights table says who may).",
            reason: caller)
    }
}

extension BusRights {
    /// The README's rights table, one row per kind of key.
    public static func markdownTable() -> String {
        let servers = [ServiceName.auth, ServiceName.profile, ServiceName.imageUpload, ServiceName.orchestrator]
        let publishers = [ServiceName.auth: "auth's events", ServiceName.profile: "profile's events", ServiceName.orchestrator: "route intents"]
        func row(_ label: String, _ caller: String) -> String {
            let calls = servers.compactMap { server -> String? in
                let types = (requests[server] ?? [:]).keys.filter { may(caller, make: $0, at: server) }.sorted()
                return types.isEmpty ? nil : "\(server): " + types.map { "`\($0)`" }.joined(separator: ", ")
            }
            let follows = servers.compactMap { server in may(caller, follow: server) ? publishers[server] : nil }
            return "| \(label) | \(calls.isEmpty ? "–" : calls.joined(separator: "; ")) | \(follows.isEmpty ? "–" : follows.joined(separator: ", ")) |"
        }
        return ([
            "| key | may make without a session | may follow |",
            "|---|---|---|",
            row("`orchestrator`", "orchestrator"),
            row("`gateway`", "gateway"),
            row("`auth`, `profile`, `image-upload`", "auth"),
            row("any other (`tap`, `client`, `chaos`, `bench`, an operator's)", "tap"),
        ]).joined(separator: "\n")
    }
}
