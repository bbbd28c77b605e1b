import NIOCore

/// Runs the jobs of the tasks that prefer it on one NIO event loop.
///
/// A store's connections all do their I/O on that loop, and its transactions run there too
/// (`Task(executorPreference:)`): a statement's reply resumes the transaction on the thread that
/// read it, where it would otherwise wake a thread of the concurrency pool and, for the next
/// statement, the loop again. The work on the loop is short: building statements and reading
/// rows, never waiting.
final class EventLoopTaskExecutor: TaskExecutor {
    let loop: any EventLoop

    init(_ loop: any EventLoop) {
        self.loop = loop
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        loop.execute { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}
