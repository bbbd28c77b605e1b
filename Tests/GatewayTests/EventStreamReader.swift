import AsyncHTTPClient
import Foundation
import NIOCore
import OnboardingAPI
import Synchronization
import Testing

/// One dispatched block of a `text/event-stream`, as a browser's parser sees it.
struct StreamEvent: Sendable, Hashable {
    /// The `id` in force after this block (the stream's last event ID).
    var lastEventID: String?
    /// The `event` field; `nil` for a block without one.
    var type: String?
    /// The `data` lines joined; `nil` for a block without data (a heartbeat).
    var data: String?

    var isIntent: Bool { type == "intent" && data != nil }

    /// The intent event's payload.
    var state: RouteState? {
        guard isIntent, let data else { return nil }
        return try? JSONDecoder().decode(RouteState.self, from: Data(data.utf8))
    }

    var sequence: UInt64? { lastEventID.flatMap { UInt64($0) } }
}

/// Reads an intent stream from a gateway in a task of its own and lets a test wait for what
/// arrives (event-driven: a waiter is resumed by the reading task, or by its deadline).
final class EventStreamReader: Sendable {
    private struct Waiter {
        var predicate: @Sendable ([StreamEvent]) -> Bool
        var continuation: CheckedContinuation<Bool, Never>
        /// Met when the stream ends.
        var end = false
    }

    private struct State {
        var events: [StreamEvent] = []
        var ended = false
        var waiters: [Int: Waiter] = [:]
        var nextID = 0
    }

    let status: Int
    let contentType: String?
    private let state = Mutex(State())
    private let task: Mutex<Task<Void, Never>?> = Mutex(nil)

    private init(status: Int, contentType: String?) {
        self.status = status
        self.contentType = contentType
    }

    /// Opens `GET /v1/me/intents` with `token` (and `Last-Event-ID` when given).
    static func open(base: String, token: String, lastEventID: String? = nil) async throws -> EventStreamReader {
        var request = HTTPClientRequest(url: base + "/v1/me/intents")
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        request.headers.add(name: "Accept", value: "text/event-stream")
        if let lastEventID { request.headers.add(name: "Last-Event-ID", value: lastEventID) }
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(600))
        let reader = EventStreamReader(status: Int(response.status.code), contentType: response.headers.first(name: "content-type"))
        let body = response.body
        reader.task.withLock {
            $0 = Task { await reader.read(body) }
        }
        return reader
    }

    /// Stops reading (the connection closes).
    func close() {
        task.withLock { $0?.cancel() }
    }

    deinit { task.withLock { $0?.cancel() } }

    var events: [StreamEvent] { state.withLock { $0.events } }
    var intents: [RouteState] { events.compactMap(\.state) }
    var ended: Bool { state.withLock { $0.ended } }
    var lastEventID: String? { state.withLock { $0.events.last?.lastEventID } }

    /// Waits until `predicate` holds for the events so far (or the stream ended and it never
    /// will), up to `timeout`. Records an issue when it does not.
    @discardableResult
    func wait(
        for what: String, timeout: Duration = .seconds(30), sourceLocation: SourceLocation = #_sourceLocation,
        _ predicate: @escaping @Sendable ([StreamEvent]) -> Bool
    ) async -> Bool {
        let met = await withCheckedContinuation { continuation in
            let now: Bool? = state.withLock { state in
                if predicate(state.events) { return true }
                if state.ended { return false }
                state.nextID += 1
                state.waiters[state.nextID] = Waiter(predicate: predicate, continuation: continuation)
                let id = state.nextID
                Task { [self] in
                    try? await Task.sleep(for: timeout)
                    self.state.withLock { $0.waiters.removeValue(forKey: id) }?.continuation.resume(returning: false)
                }
                return nil
            }
            if let now { continuation.resume(returning: now) }
        }
        if !met {
            Issue.record("waited \(timeout) for \(what); the stream had \(events)", sourceLocation: sourceLocation)
        }
        return met
    }

    /// Waits for the `count`th intent event.
    @discardableResult
    func waitForIntents(_ count: Int, timeout: Duration = .seconds(30), sourceLocation: SourceLocation = #_sourceLocation) async -> Bool {
        await wait(for: "\(count) intent events", timeout: timeout, sourceLocation: sourceLocation) {
            $0.filter(\.isIntent).count >= count
        }
    }

    /// Waits until the stream has ended.
    @discardableResult
    func waitForEnd(timeout: Duration = .seconds(30), sourceLocation: SourceLocation = #_sourceLocation) async -> Bool {
        let ended = await withCheckedContinuation { continuation in
            let now: Bool? = state.withLock { state in
                if state.ended { return true }
                state.nextID += 1
                state.waiters[state.nextID] = Waiter(predicate: { _ in false }, continuation: continuation, end: true)
                let id = state.nextID
                Task { [self] in
                    try? await Task.sleep(for: timeout)
                    self.state.withLock { $0.waiters.removeValue(forKey: id) }?.continuation.resume(returning: false)
                }
                return nil
            }
            if let now { continuation.resume(returning: now) }
        }
        if !ended { Issue.record("the stream did not end within \(timeout); it had \(events)", sourceLocation: sourceLocation) }
        return ended
    }

    // MARK: Parsing (the WHATWG event-stream rules: lines, fields, a blank line dispatches)

    private func read(_ body: HTTPClientResponse.Body) async {
        var parser = Parser()
        do {
            for try await buffer in body {
                for event in parser.feed(Array(buffer.readableBytesView)) { append(event) }
            }
        } catch {}
        let waiters = state.withLock { state in
            state.ended = true
            let waiters = state.waiters.values
            state.waiters = [:]
            return Array(waiters)
        }
        let events = self.events
        for waiter in waiters { waiter.continuation.resume(returning: waiter.end || waiter.predicate(events)) }
    }

    private func append(_ event: StreamEvent) {
        let matched = state.withLock { state -> [Waiter] in
            state.events.append(event)
            let events = state.events
            let matched = state.waiters.filter { $0.value.predicate(events) }
            for id in matched.keys { state.waiters[id] = nil }
            return Array(matched.values)
        }
        for waiter in matched { waiter.continuation.resume(returning: true) }
    }

    struct Parser {
        private var pending: [UInt8] = []
        private var lastEventID: String?
        private var type: String?
        private var data: [String] = []
        private var sawField = false

        mutating func feed(_ bytes: [UInt8]) -> [StreamEvent] {
            pending += bytes
            var events: [StreamEvent] = []
            while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                var line = Array(pending[..<newline])
                pending.removeFirst(newline + 1)
                if line.last == UInt8(ascii: "\r") { line.removeLast() }
                let text = String(decoding: line, as: UTF8.self)
                if text.isEmpty {
                    if sawField {
                        events.append(StreamEvent(lastEventID: lastEventID, type: type, data: data.isEmpty ? nil : data.joined(separator: "\n")))
                    }
                    type = nil
                    data = []
                    sawField = false
                    continue
                }
                if text.hasPrefix(":") { continue }
                let (field, value) = Self.split(text)
                switch field {
                case "id": lastEventID = value; sawField = true
                case "event": type = value; sawField = true
                case "data": data.append(value); sawField = true
                default: break
                }
            }
            return events
        }

        static func split(_ line: String) -> (String, String) {
            guard let colon = line.firstIndex(of: ":") else { return (line, "") }
            var value = line[line.index(after: colon)...]
            if value.hasPrefix(" ") { value = value.dropFirst() }
            return (String(line[..<colon]), String(value))
        }
    }
}
