import OnboardingClient
import Synchronization

/// Home's profile set-up sheet: shown while the back end says `presentProfileSetup`, gone on
/// `dismiss`. The app's own code, which the tests check.
public final class HomeScreen: Sendable {
    public enum Sheet: Sendable, Equatable { case none, profileSetup }

    /// Every change of the sheet, in order.
    public let changes: AsyncStream<Sheet>
    private let continuation: AsyncStream<Sheet>.Continuation
    private let sheet = Mutex(Sheet.none)
    private let client: OnboardingClient

    public init(client: OnboardingClient) {
        self.client = client
        (changes, continuation) = AsyncStream.makeStream(of: Sheet.self)
    }

    /// Follows the signed-in person's intents until the calling task is cancelled.
    public func run() async throws {
        for await received in try await client.intents() {
            show(received.intent.intent == .presentProfileSetup ? .profileSetup : .none)
        }
    }

    /// Sets up the profile. Returns what to tell the person when that failed, or nil.
    public func confirm(username: String) async -> String? {
        do {
            _ = try await client.setUpProfile(username: username)
            return nil
        } catch let error as ServiceError where error.code == .usernameTaken {
            return "Someone already has that name."
        } catch let error as ServiceError where error.code == .dependencyUnavailable {
            return "We could not reach the server. Try again."
        } catch {
            return "Something went wrong. Try again."
        }
    }

    private func show(_ new: Sheet) {
        let changed = sheet.withLock { old in
            defer { old = new }
            return old != new
        }
        if changed { continuation.yield(new) }
    }
}
