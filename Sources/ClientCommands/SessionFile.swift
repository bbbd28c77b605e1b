import ArgumentParser
import Foundation
import Messaging
import OnboardingAPI
import OnboardingClient
import OnboardingSettings

/// The small file the client CLI keeps the session in between commands.
struct SessionFile {
    let path: String

    static var defaultPath: String {
        if let path = Settings().text(.clientState) { return path }
        let home = ProcessInfo.processInfo.environment["HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? FileManager.default.currentDirectoryPath
        return home + "/.onboarding-client/session.json"
    }

    func load() -> OnboardingClient.Session? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        return try? JSONDecoder().decode(OnboardingClient.Session.self, from: data)
    }

    func save(_ session: OnboardingClient.Session?) throws {
        guard let session else {
            try? FileManager.default.removeItem(atPath: path)
            return
        }
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent().path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let data = try JSONEncoder().encode(session)
        guard FileManager.default.createFile(atPath: path, contents: data, attributes: [.posixPermissions: 0o600]) else {
            throw ServiceError(.internalError, "Could not write the session file \(path).")
        }
    }

    /// The saved session, or an `unauthenticated` error that says how to sign in.
    func require() throws -> OnboardingClient.Session {
        guard let session = load() else {
            Terminal.report(ServiceError(.unauthenticated, "Nobody is signed in (no session in \(path))."))
            throw ExitCode.failure
        }
        return session
    }
}
