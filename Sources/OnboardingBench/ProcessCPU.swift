import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// CPU time of a process from `/proc/<pid>/stat`: user plus system time of all its threads
/// (fields 14 and 15, in clock ticks of `sysconf(_SC_CLK_TCK)`, 10 ms on Linux).
enum ProcStat {
    struct Times: Equatable, Sendable {
        var userTicks: UInt64
        var systemTicks: UInt64
        var totalTicks: UInt64 { userTicks + systemTicks }
    }

    /// Parses the text of `/proc/<pid>/stat`. The command name (field 2) is in parentheses and
    /// may itself hold spaces and parentheses, so fields are counted from the last `)`.
    static func parse(_ text: String) -> Times? {
        guard let close = text.lastIndex(of: ")") else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ", omittingEmptySubsequences: true)
        // fields[0] is field 3 (state), so field n is fields[n - 3].
        guard fields.count > 12, let user = UInt64(fields[11]), let system = UInt64(fields[12]) else { return nil }
        return Times(userTicks: user, systemTicks: system)
    }

    static func read(pid: Int32) -> Times? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8) else { return nil }
        return parse(text)
    }

    /// The parent's pid (field 4) in the text of `/proc/<pid>/stat`.
    static func parent(_ text: String) -> Int32? {
        guard let close = text.lastIndex(of: ")") else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ", omittingEmptySubsequences: true)
        return fields.count > 1 ? Int32(fields[1]) : nil
    }

    /// CPU time of `pid` and of its children: a server that forks a process per connection
    /// (PostgreSQL's postmaster and its backends). A child that exits between two readings
    /// takes its time with it, so long-lived children (a connection pool's) are what it counts.
    static func readFamily(pid: Int32) -> Times? {
        guard var total = read(pid: pid) else { return nil }
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        for entry in entries {
            guard let child = Int32(entry), child != pid,
                let text = try? String(contentsOfFile: "/proc/\(child)/stat", encoding: .utf8), parent(text) == pid,
                let times = parse(text)
            else { continue }
            total.userTicks += times.userTicks
            total.systemTicks += times.systemTicks
        }
        return total
    }

    static var ticksPerSecond: UInt64 {
        let ticks = sysconf(Int32(_SC_CLK_TCK))
        return ticks > 0 ? UInt64(ticks) : 100
    }

    static func microseconds(ticks: UInt64) -> Double {
        Double(ticks) * 1_000_000 / Double(ticksPerSecond)
    }

    /// Busy ticks of the whole machine, all cores (the first line of `/proc/stat`: every
    /// column but idle and iowait).
    static func parseMachine(_ text: String) -> UInt64? {
        guard let line = text.split(separator: "\n").first, line.hasPrefix("cpu ") else { return nil }
        let values = line.split(separator: " ").dropFirst().compactMap { UInt64($0) }
        guard values.count >= 5 else { return nil }
        // user nice system idle iowait irq softirq steal (guest and guest_nice are in user already)
        let busy = values.prefix(8).enumerated().filter { $0.offset != 3 && $0.offset != 4 }.map(\.element).reduce(0, +)
        return busy
    }

    static func readMachine() -> UInt64? {
        guard let text = try? String(contentsOfFile: "/proc/stat", encoding: .utf8) else { return nil }
        return parseMachine(text)
    }
}

/// The processes whose CPU the benchmark reports: each service (its pid from compose's pid file
/// `<run dir>/<name>.pid`, its further replicas' from `<name>-2.pid` and on, counted together),
/// PostgreSQL when compose runs one (`postgres.pid`: the postmaster,
/// counted with its backends), and the load generator itself.
struct CPUProbe: Sendable {
    /// compose's names for the services (`supervise <name>` writes `<name>.pid`).
    static let services = ["auth", "profile", "image-upload", "onboarding-orchestrator"]
    static let database = "postgres"
    static let generator = "onboarding-bench"

    var runDirectory: String?

    struct Sample: Sendable {
        var pids: [String: Int32] = [:]
        /// Every replica's pid, by service: a restart of any makes the service's figure unknown.
        var replicas: [String: [Int32]] = [:]
        var times: [String: ProcStat.Times] = [:]
        /// Busy ticks of the whole machine.
        var machine: UInt64?
        var taken: UInt64 = MonotonicClock.now()
    }

    func pid(of service: String) -> Int32? {
        guard let runDirectory,
            let text = try? String(contentsOfFile: "\(runDirectory)/\(service).pid", encoding: .utf8),
            let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)), pid > 0
        else { return nil }
        return pid
    }

    func sample() -> Sample {
        var sample = Sample()
        for service in Self.services {
            guard let pid = pid(of: service), var times = ProcStat.read(pid: pid) else { continue }
            var replicas = [pid]
            for replica in 2...9 {
                guard let pid = self.pid(of: "\(service)-\(replica)") else { break }
                guard let more = ProcStat.read(pid: pid) else { continue }
                replicas.append(pid)
                times.userTicks += more.userTicks
                times.systemTicks += more.systemTicks
            }
            sample.pids[service] = pid
            sample.replicas[service] = replicas
            sample.times[service] = times
        }
        if let pid = pid(of: Self.database), let times = ProcStat.readFamily(pid: pid) {
            sample.pids[Self.database] = pid
            sample.times[Self.database] = times
        }
        let me = getpid()
        if let times = ProcStat.read(pid: me) {
            sample.pids[Self.generator] = me
            sample.times[Self.generator] = times
        }
        sample.machine = ProcStat.readMachine()
        sample.taken = MonotonicClock.now()
        return sample
    }

    /// Cores kept busy by everything else on the machine between two samples (the machine's
    /// busy time less that of the services and the load generator): what disturbed the step.
    static func otherBusy(from before: Sample, to after: Sample, usage: [CPUUsage]) -> Double? {
        guard let start = before.machine, let end = after.machine, end >= start, after.taken > before.taken else { return nil }
        let machine = ProcStat.microseconds(ticks: end - start)
        let ours = usage.compactMap(\.microseconds).reduce(0, +)
        return max(0, machine - ours) / (Double(after.taken - before.taken) / 1000)
    }

    /// CPU per process between two samples. A process whose pid changed (restarted) or that
    /// could not be read has no figure.
    static func usage(from before: Sample, to after: Sample, operations: Int) -> [CPUUsage] {
        let seconds = Double(after.taken &- before.taken) / 1e9
        let database = before.pids[Self.database] == nil ? [] : [Self.database]
        return (services + database + [generator]).map { name in
            guard let pid = before.pids[name], after.pids[name] == pid, before.replicas[name] == after.replicas[name],
                let start = before.times[name],
                let end = after.times[name], end.totalTicks >= start.totalTicks
            else {
                return CPUUsage(name: name, pid: before.pids[name] ?? after.pids[name], microseconds: nil, perOperation: nil, busy: nil)
            }
            let microseconds = ProcStat.microseconds(ticks: end.totalTicks - start.totalTicks)
            return CPUUsage(
                name: name, pid: pid, microseconds: microseconds,
                perOperation: operations > 0 ? microseconds / Double(operations) : nil,
                busy: seconds > 0 ? microseconds / 1e6 / seconds : nil)
        }
    }
}

/// One process's CPU over a step.
struct CPUUsage: Codable, Sendable, Equatable {
    var name: String
    var pid: Int32?
    /// User + system CPU time over the window, µs.
    var microseconds: Double?
    /// ``microseconds`` per request sent, µs.
    var perOperation: Double?
    /// Share of one core over the window (1.0 = one core busy all the time).
    var busy: Double?
}

/// The machine's load averages (`/proc/loadavg`), noted with every step.
enum LoadAverage {
    static func read() -> [Double] {
        guard let text = try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8) else { return [] }
        return text.split(separator: " ").prefix(3).compactMap { Double($0) }
    }
}
