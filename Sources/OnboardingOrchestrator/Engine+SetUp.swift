import Foundation
import GRDB
import Logging
import Messaging
import OnboardingAPI
import ServiceRuntime
import Synchronization

/// Profile set-up (upload, create, then `dismiss`) and the settling of set-ups a crash or an
/// unreachable service left unfinished.
extension Engine {

    /// Profile set-up: upload, create, then `dismiss`. The set-up is on record until it has
    /// succeeded or left nothing behind, so one that a crash interrupts is settled on restart.
    func setUp(_ request: SetUpProfile, uid: String, image: Data?, correlationId: String) async throws -> ProfileResult {
        if let problem = IdempotencyKey.problem(request.idempotencyKey) { throw problem }
        let key = request.idempotencyKey ?? IdempotencyKey.make()
        var saga = ProfileSetupSaga(username: request.username, hasImage: image != nil)
        var step = saga.start()
        if case .fail(let error, _) = step { throw error }
        guard claimSetUp(uid) else {
            throw ServiceError(
                .overloaded,
                "A set-up for this person is already under way; send it again in a moment with the same idempotencyKey.")
        }
        defer { releaseSetUp(uid) }
        var record = OrchestratorStore.Setup(uid: uid, idempotencyKey: key, username: saga.username)
        record.attempt = try await storage.beginSetup(record)
        let attempt = record.attempt
        var service = ServiceName.profile
        var strayImagesLeft = false
        /// How new the profile store's last answer about the profile was.
        var asOf: UInt64?
        while true {
            switch step {
            case .uploadImage:
                service = ServiceName.imageUpload
                do {
                    let stored = try await call(
                        UploadImage(contentType: request.contentType, idempotencyKey: key), to: configuration.imageRPC,
                        uid: uid, correlationId: correlationId, attachment: image, retrying: true)
                    step = saga.next(after: .uploaded(path: stored.path))
                } catch {
                    step = saga.next(after: .uploadFailed(Self.serviceError(error)))
                }
            case .createProfile(let username, let imagePath):
                service = ServiceName.profile
                do {
                    let created = try await call(
                        CreateProfile(username: username, imagePath: imagePath, idempotencyKey: key, attempt: attempt),
                        to: configuration.profileRPC, uid: uid, correlationId: correlationId, retrying: true)
                    guard let profile = created.profile else {
                        throw ServiceError(.invalidMessage, "profile.create answered without a profile.")
                    }
                    asOf = created.asOfSequence
                    step = saga.next(after: .created(profile))
                } catch {
                    step = saga.next(after: .createFailed(Self.serviceError(error)))
                }
            case .abandonCreates:
                do {
                    let found = try await call(
                        AbandonCreates(throughAttempt: attempt), to: configuration.profileRPC, uid: uid, retrying: true)
                    asOf = found.asOfSequence
                    step = saga.next(after: .abandoned(found.profile))
                } catch {
                    step = saga.next(after: .abandonFailed(Self.serviceError(error)))
                }
            case .deleteStrayImages(let keep):
                let outcome = await deleteImages(uid: uid, saga: &saga) { try await self.call(DeleteAllImages(keep: keep), to: self.configuration.imageRPC, uid: uid, retrying: true) }
                step = outcome.next
                if !outcome.removed { strayImagesLeft = true }
            case .succeed(let profile):
                // The reply means `dismiss` is stored (and on its way), or was already.
                try await sendAndWait([.profileCreated(uid: uid, asOf: asOf)])
                // Strays that could not be removed keep the record: settling removes them later.
                if !strayImagesLeft { await endSetUp(record) }
                return ProfileResult(profile: profile, asOfSequence: asOf)
            case .fail(let error, let settled):
                if settled { await endSetUp(record) }
                throw Self.dependencyError(error, service: service)
            }
        }
    }

    private func deleteImages(
        uid: String, saga: inout ProfileSetupSaga, _ delete: @Sendable () async throws -> DeletedImages
    ) async -> (next: ProfileSetupSaga.Step, removed: Bool) {
        do {
            _ = try await delete()
            return (saga.next(after: .imagesDeleted), true)
        } catch {
            logger.error("could not remove the image(s) of \(uid)'s unfinished set-up: \(error); will try again")
            return (saga.next(after: .imageDeleteFailed(Self.serviceError(error))), false)
        }
    }

    private func endSetUp(_ record: OrchestratorStore.Setup) async {
        do {
            try await storage.endSetup(record)
        } catch {
            logger.warning("could not close the record of \(record.uid)'s set-up: \(error); it is settled again later")
        }
    }

    private func claimSetUp(_ uid: String) -> Bool { settingUp.withLock { $0.insert(uid).inserted } }
    private func releaseSetUp(_ uid: String) { _ = settingUp.withLock { $0.remove(uid) } }

    /// Settles set-ups that a crash or an unreachable service left unfinished, every few seconds
    /// until cancelled. First their creates are abandoned (none still on its way can land after),
    /// then: a profile with the set-up's username means it went through (`dismiss`, and stray
    /// images are removed); no profile means every image of the person is removed.
    func settleSetUps(every interval: Duration = .seconds(2)) async {
        repeat {
            let unfinished = (try? await storage.unfinishedSetups()) ?? []
            for record in unfinished where claimSetUp(record.uid) {
                defer { releaseSetUp(record.uid) }
                do {
                    // A record from before attempts were numbered (0) has no creates to abandon.
                    let found = record.attempt > 0
                        ? try await call(AbandonCreates(throughAttempt: record.attempt), to: configuration.profileRPC, uid: record.uid)
                        : try await call(GetProfile(), to: configuration.profileRPC, uid: record.uid)
                    let profile = found.profile
                    if let profile, profile.username == record.username {
                        try await sendAndWait([.profileCreated(uid: record.uid, asOf: found.asOfSequence)])
                    }
                    _ = try await call(DeleteAllImages(keep: profile?.imagePath), to: configuration.imageRPC, uid: record.uid)
                    await endSetUp(record)
                    logger.info("settled the unfinished set-up of \(record.uid) (\(profile == nil ? "undone" : "completed"))")
                } catch {
                    logger.warning("could not settle the unfinished set-up of \(record.uid) yet: \(error)")
                }
            }
        } while (try? await Task.sleep(for: interval)) != nil
    }

    /// Bus failures (timeout, nothing listening) become `dependencyUnavailable`; a service's
    /// own refusal passes through unchanged.
    static func dependencyError(_ error: ServiceError, service: String) -> ServiceError {
        switch error.code {
        case .timeout, .noResponder, .closed: return .dependency(service, error)
        default: return error
        }
    }
}
