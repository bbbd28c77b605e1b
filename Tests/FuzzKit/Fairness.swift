/// Lets the other tests run between the cases of a long loop.
///
/// Swift Testing starts every test at once on the concurrency pool, which has one thread per core
/// (two here). A test that computes for seconds without suspending holds a thread that whole
/// time, and the tests beside it that wait on a deadline (a reply within half a second, a service
/// answering within 30 s) miss it on a loaded machine. Calling this once per case gives them a
/// turn every `period` cases.
public func letOtherTestsRun(every period: Int, at index: Int) async {
    if index % period == period - 1 { await Task.yield() }
}
