import Messaging
import OnboardingAPI

/// Carrying out the actions the machine decides once they have committed: profile checks, timers,
/// clean-up calls, and the answers to those waiting for a "check me now".
extension Engine {
    func perform(_ action: OnboardingStateMachine.Action) {
        switch action {
        case .checkProfile(let uid, let check):
            // The hot path of a returning person: asked from the bus's thread, and the answer
            // decided and committed there when it comes.
            bus.call(
                GetProfile(), to: configuration.profileRPC, source: source, uid: uid,
                serviceToken: configuration.serviceToken, timeout: configuration.callTimeout
            ) { [self] result in
                let input: OnboardingStateMachine.Input =
                    switch result {
                    case .success(let found):
                        .profileChecked(uid: uid, check: check, exists: found.profile != nil, asOf: found.asOfSequence)
                    case .failure(let error):
                        .profileCheckFailed(uid: uid, check: check, error: error)
                    }
                // Committed with the other answers that arrived together (one job on the loop).
                send(input)
            }
        case .retryCheck(let uid, let check, let delay, let attempt, let error):
            logger.warning("profile check for \(uid) failed (\(error)); retry \(attempt) in \(delay)")
            enqueue(timer: true) { engine in
                guard (try? await Task.sleep(for: delay)) != nil else { return }
                engine.send(.checkRetryDue(uid: uid, check: check))
            }
        case .emit(let intent):
            // Emitted inside the transaction (see `apply`); never reaches here.
            logger.error("an intent \(intent.intent.rawValue) for \(intent.uid) was not stored")
        case .answer(let waiter, let status):
            resume(waiter, with: .success(status))
        case .answerFailure(let waiter, let error):
            resume(waiter, with: .failure(error))
        case .evictProfileCache(let uid):
            enqueue { engine in
                do {
                    _ = try await engine.call(EvictCachedProfile(), to: engine.configuration.profileRPC, uid: uid)
                } catch {
                    engine.logger.warning("could not clear the cached profile of \(uid): \(error)")
                }
            }
        case .cleanUp(let uid, let step):
            enqueue { engine in
                do {
                    switch step {
                    case .deleteProfile:
                        _ = try await engine.call(DeleteProfile(reason: .withdrawal), to: engine.configuration.profileRPC, uid: uid)
                    case .deleteImages:
                        _ = try await engine.call(DeleteAllImages(withdrawn: true), to: engine.configuration.imageRPC, uid: uid)
                    }
                    engine.figures.cleanUp(step, succeeded: true)
                    engine.send(.cleanupFinished(uid: uid, step: step))
                } catch {
                    engine.figures.cleanUp(step, succeeded: false)
                    engine.send(.cleanupFailed(uid: uid, step: step, error: Self.serviceError(error)))
                }
            }
        case .retryCleanup(let uid, let step, let delay, let attempt, let error):
            logger.warning("withdrawal clean-up \(step.rawValue) for \(uid) failed (\(error)); retry \(attempt) in \(delay)")
            enqueue(timer: true) { engine in
                guard (try? await Task.sleep(for: delay)) != nil else { return }
                engine.send(.cleanupRetryDue(uid: uid, step: step))
            }
        }
    }

    func enqueue(timer: Bool = false, _ job: @escaping @Sendable (Engine) async -> Void) {
        work.yield(Work(isTimer: timer) { [self] in await job(self) })
    }

    func resume(_ waiter: OnboardingStateMachine.WaiterID, with result: Result<OnboardingStatus, ServiceError>) {
        let answer = waiters.withLock { $0.removeValue(forKey: waiter) }
        answer?(result)
    }
}
