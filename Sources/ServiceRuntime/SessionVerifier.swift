import Messaging
import OnboardingAPI

/// Turns a session token into the uid it belongs to.
///
/// A request handled on the bus's thread (see `LoopRoutes.swift`) asks with a callback, so that
/// the thread never waits; every other handler awaits the answer.
public protocol SessionVerifier: Sendable {
    /// - Throws: ``ServiceError`` `unauthenticated` for a token that is not a live session, or
    ///   `dependencyUnavailable` when the answer could not be had.
    func uid(forSessionToken token: String) async throws -> String

    /// Hands the uid of `token`'s session, or the same errors as
    /// ``uid(forSessionToken:)``, to `callback`: on the bus's thread when the verifier can
    /// (``RemoteSessionVerifier`` over a ``MessageBus``), otherwise from a task. By default, a
    /// task awaits ``uid(forSessionToken:)``.
    func uid(forSessionToken token: String, then callback: @escaping @Sendable (Result<String, ServiceError>) -> Void)
}

extension SessionVerifier {
    public func uid(forSessionToken token: String, then callback: @escaping @Sendable (Result<String, ServiceError>) -> Void) {
        Task {
            do {
                callback(.success(try await uid(forSessionToken: token)))
            } catch let error as ServiceError {
                callback(.failure(error))
            } catch {
                callback(.failure(ServiceError(.internalError, "The session could not be verified: \(error)")))
            }
        }
    }
}

/// Asks auth (`auth.verifySession`) for every token.
public struct RemoteSessionVerifier: SessionVerifier {
    public let bus: any MessageBus
    public let authEndpoint: Endpoint
    public let source: String
    public let timeout: Duration

    public init(bus: any MessageBus, authEndpoint: Endpoint, source: String, timeout: Duration = .seconds(2)) {
        self.bus = bus
        self.authEndpoint = authEndpoint
        self.source = source
        self.timeout = timeout
    }

    public func uid(forSessionToken token: String) async throws -> String {
        do {
            return try await bus.call(
                VerifySession(sessionToken: token), to: authEndpoint, source: source, timeout: timeout
            ).uid
        } catch let error as ServiceError where error.code == .unauthenticated {
            throw error
        } catch let error as ServiceError {
            throw ServiceError.dependency("auth", error)
        }
    }

    public func uid(forSessionToken token: String, then callback: @escaping @Sendable (Result<String, ServiceError>) -> Void) {
        bus.call(VerifySession(sessionToken: token), to: authEndpoint, source: source, timeout: timeout) { result in
            callback(result.map(\.uid).mapError { error in
                error.code == .unauthenticated ? error : ServiceError.dependency("auth", error)
            })
        }
    }
}

extension ServiceError {
    /// The answer to a *session* request that carries no session token.
    public static let missingSessionToken = ServiceError(
        .unauthenticated, "This request needs the sessionToken from auth.signIn. Sign in first.")

    /// The error to answer with when a service this one depends on failed.
    public static func dependency(_ service: String, _ cause: ServiceError) -> ServiceError {
        ServiceError(
            .dependencyUnavailable,
            "\(service) could not be reached (\(cause.code): \(cause.message)). Nothing was lost; try again.",
            reason: service)
    }
}
