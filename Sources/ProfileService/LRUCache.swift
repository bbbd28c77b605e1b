/// A bounded map that forgets its least recently used entry to make room.
///
/// Every operation is O(1): entries live in an array linked into a recency list by index.
/// A value type with no locking; ``ProfileCache`` puts it behind a mutex.
struct LRUCache<Key: Hashable, Value> {
    private struct Node {
        var key: Key
        var value: Value
        var newer: Int?
        var older: Int?
    }

    let capacity: Int
    private var nodes: [Node] = []
    private var slots: [Key: Int] = [:]
    private var newest: Int?
    private var oldest: Int?

    /// - Parameter capacity: at least 1.
    init(capacity: Int) {
        precondition(capacity >= 1, "An LRU cache holds at least one entry.")
        self.capacity = capacity
    }

    var count: Int { nodes.count }

    /// The keys from most to least recently used.
    var keysByRecency: [Key] {
        var keys: [Key] = []
        var cursor = newest
        while let slot = cursor {
            keys.append(nodes[slot].key)
            cursor = nodes[slot].older
        }
        return keys
    }

    /// The value for `key`, which becomes the most recently used.
    mutating func value(for key: Key) -> Value? {
        guard let slot = slots[key] else { return nil }
        moveToFront(slot)
        return nodes[slot].value
    }

    /// Sets `value` for `key` as the most recently used, forgetting the least recently used
    /// entry when full.
    ///
    /// - Returns: the key forgotten to make room, if any.
    @discardableResult
    mutating func set(_ value: Value, for key: Key) -> Key? {
        if let slot = slots[key] {
            nodes[slot].value = value
            moveToFront(slot)
            return nil
        }
        var evicted: Key?
        if nodes.count >= capacity, let oldest {
            evicted = nodes[oldest].key
            remove(slot: oldest)
        }
        nodes.append(Node(key: key, value: value, newer: nil, older: nil))
        let slot = nodes.count - 1
        slots[key] = slot
        linkAtFront(slot)
        return evicted
    }

    /// Forgets `key`.
    /// The value for `key`, leaving its recency as it is.
    func peek(_ key: Key) -> Value? {
        slots[key].map { nodes[$0].value }
    }

    mutating func removeValue(for key: Key) {
        if let slot = slots[key] { remove(slot: slot) }
    }

    private mutating func moveToFront(_ slot: Int) {
        guard newest != slot else { return }
        unlink(slot)
        linkAtFront(slot)
    }

    private mutating func linkAtFront(_ slot: Int) {
        nodes[slot].older = newest
        nodes[slot].newer = nil
        if let newest { nodes[newest].newer = slot }
        newest = slot
        if oldest == nil { oldest = slot }
    }

    private mutating func unlink(_ slot: Int) {
        let (newer, older) = (nodes[slot].newer, nodes[slot].older)
        if let newer { nodes[newer].older = older } else { newest = older }
        if let older { nodes[older].newer = newer } else { oldest = newer }
    }

    /// Unlinks `slot`, then fills the hole with the last node so the array stays dense.
    private mutating func remove(slot: Int) {
        unlink(slot)
        slots[nodes[slot].key] = nil
        let last = nodes.count - 1
        if slot != last {
            let moved = nodes[last]
            nodes[slot] = moved
            slots[moved.key] = slot
            if let newer = moved.newer { nodes[newer].older = slot } else { newest = slot }
            if let older = moved.older { nodes[older].newer = slot } else { oldest = slot }
        }
        nodes.removeLast()
    }
}
