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
                let outcome = await deleteImages(of: record, saga: &saga) {
                    try await self.call(DeleteAllImages(keep: keep), to: self.configuration.imageRPC, uid: uid, retrying: true)
                }
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

    /// Removes the images of `record`'s person with `delete`, once the store says the set-up is
    /// still this try's (``OrchestratorStorage/isCurrentSetup(_:)``).
    private func deleteImages(
        of record: OrchestratorStore.Setup, saga: inout ProfileSetupSaga, _ delete: @Sendable () async throws -> DeletedImages
    ) async -> (next: ProfileSetupSaga.Step, removed: Bool) {
        do {
            guard try await storage.isCurrentSetup(record) else {
                logger.notice("\(record.uid)'s set-up (attempt \(record.attempt)) was taken over; its images are left to the newer try")
                return (saga.next(after: .takenOver), false)
            }
            _ = try await delete()
            return (saga.next(after: .imagesDeleted), true)
        } catch {
            logger.error("could not remove the image(s) of \(record.uid)'s unfinished set-up: \(error); will try again")
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
    /// until cancelled, a person at a time, through the person's newest try: its creates are
    /// abandoned, and with them every earlier try's (attempts only grow), so none still on its
    /// way can land after. Then a profile with a try's username means it went through
    /// (`dismiss`); either way every image of the person but the profile's is removed, and the
    /// person's records through that try are closed.
    func settleSetUps(every interval: Duration = .seconds(2)) async {
        repeat {
            let unfinished = Dictionary(grouping: (try? await storage.unfinishedSetups()) ?? [], by: \.uid)
            for (uid, tries) in unfinished where claimSetUp(uid) {
                defer { releaseSetUp(uid) }
                guard let record = tries.max(by: { $0.attempt < $1.attempt }) else { continue }
                do {
                    // A record from before attempts were numbered (0) has no creates to abandon.
                    let found = record.attempt > 0
                        ? try await call(AbandonCreates(throughAttempt: record.attempt), to: configuration.profileRPC, uid: uid)
                        : try await call(GetProfile(), to: configuration.profileRPC, uid: uid)
                    let profile = found.profile
                    if let profile, tries.contains(where: { $0.username == profile.username }) {
                        try await sendAndWait([.profileCreated(uid: uid, asOf: found.asOfSequence)])
                    }
                    // A newer try of the person may have begun (and stored an image) since the
                    // list was read, or another orchestrator leads now: it is theirs to settle.
                    guard try await storage.isCurrentSetup(record) else {
                        logger.notice("the unfinished set-up of \(uid) (attempt \(record.attempt)) was taken over; left to the newer try")
                        continue
                    }
                    _ = try await call(DeleteAllImages(keep: profile?.imagePath), to: configuration.imageRPC, uid: uid)
                    do {
                        try await storage.endSetups(of: uid, through: record.attempt)
                    } catch {
                        logger.warning("could not close the records of \(uid)'s set-ups: \(error); they are settled again later")
                    }
                    logger.info("settled the unfinished set-up of \(uid) (\(profile == nil ? "undone" : "completed"))")
                } catch {
                    logger.warning("could not settle the unfinished set-up of \(uid) yet: \(error)")
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
