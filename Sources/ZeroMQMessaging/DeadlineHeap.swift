/// A binary min-heap of (deadline, request id). Entries of finished requests stay until they
/// surface and are skipped.
///
/// Threading: a value owned by ``IOLoop``, so used by the I/O thread only.
struct DeadlineHeap {
    private var items: [(time: UInt64, id: UInt64)] = []

    init() {}

    init(_ entries: [(UInt64, UInt64)]) {
        items = entries.map { (time: $0.0, id: $0.1) }
        for index in stride(from: items.count / 2 - 1, through: 0, by: -1) { siftDown(index) }
    }

    var count: Int { items.count }
    var first: (time: UInt64, id: UInt64)? { items.first }

    mutating func push(time: UInt64, id: UInt64) {
        items.append((time, id))
        var child = items.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard items[child].time < items[parent].time else { break }
            items.swapAt(child, parent)
            child = parent
        }
    }

    mutating func removeFirst() {
        let last = items.removeLast()
        guard !items.isEmpty else { return }
        items[0] = last
        siftDown(0)
    }

    private mutating func siftDown(_ start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < items.count, items[left].time < items[smallest].time { smallest = left }
            if right < items.count, items[right].time < items[smallest].time { smallest = right }
            if smallest == parent { return }
            items.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
