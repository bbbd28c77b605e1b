import Foundation
import Messaging
import OnboardingAPI

/// Where a feed stands in one publisher's events, and what to do with what arrives: the logic of
/// ``EventFeed`` without any waiting or calling.
struct FeedProgress: Sendable {
    /// What to hand over after one look at the live queue.
    struct LiveStep {
        /// The live events to handle, in order, of the feed's topics.
        var batch: [Message] = []
        /// The cursor once they are handled.
        var through: UInt64
        /// The sequence of a live event that skipped numbers: fetch before going on.
        var gap: UInt64?
        /// How many events were dropped as already handled.
        var duplicates = 0
        /// The lowest number among them.
        var lowestDuplicate: UInt64?
    }

    /// What to hand over from one `events.after` page.
    struct PageStep {
        var batch: [Message] = []
        var through: UInt64
        /// Whether the page reached the publisher's newest event.
        var caughtUp: Bool
        /// The publisher's store was reset: the feed starts again from 0.
        var reset = false
        /// Events pruned before they could be fetched.
        var lost: UInt64 = 0
        /// Recorded events that are not readable envelopes (skipped, counted as lost).
        var unreadable: [UInt64] = []
    }

    let topics: [String]
    private(set) var statistics: FeedStatistics

    init(topics: [String], statistics: FeedStatistics) {
        self.topics = topics
        self.statistics = statistics
    }

    /// The last sequence handled.
    var cursor: UInt64 { statistics.sequence }

    func wants(_ topic: String?) -> Bool {
        let topic = topic ?? ""
        return topics.contains { topic.matchesTopicPrefix($0) }
    }

    /// Takes the live events that follow the cursor without a gap off the front of `pending`,
    /// dropping (and counting) those already handled. Stops at a gap, and keeps the events from
    /// there on in `pending`: the missing ones may still arrive (see ``EventFeed``), and what a
    /// fetch covers is dropped as a duplicate later.
    ///
    /// Replicas of a publisher share one numbering but publish apart, so what is queued may be a
    /// little out of order: it is sorted first, and only a number still missing is a gap.
    mutating func planLive(_ pending: inout [Message]) -> LiveStep {
        pending.sort { $0.header.sequence < $1.header.sequence }
        if let last = pending.last?.header.sequence { heard(of: last) }
        var step = LiveStep(through: cursor)
        var taken = 0
        for message in pending {
            let sequence = message.header.sequence
            if sequence > step.through + 1 {
                step.gap = sequence
                break
            }
            taken += 1
            if sequence <= step.through {
                statistics.duplicatesDropped += 1
                step.duplicates += 1
                step.lowestDuplicate = min(step.lowestDuplicate ?? sequence, sequence)
            } else {
                step.through = sequence
                if wants(message.topic) { step.batch.append(message) }
            }
        }
        pending.removeFirst(taken)
        return step
    }

    /// Reads a page fetched after the cursor: a reset store, pruned events, and the events to
    /// hand over.
    mutating func planPage(_ page: EventPage) -> PageStep {
        var after = cursor
        if page.lastSequence < after {
            // Nothing after 0 was fetched yet; the next page starts from the beginning.
            statistics.newest = page.lastSequence
            statistics.lastHandledTime = nil
            return PageStep(through: 0, caughtUp: false, reset: true)
        }
        heard(of: page.lastSequence)
        // No events kept but some recorded: all of them were pruned.
        let oldestKept = page.firstSequence == 0 ? page.lastSequence + 1 : page.firstSequence
        var step = PageStep(through: after, caughtUp: false)
        if oldestKept > after + 1 {
            step.lost = oldestKept - 1 - after
            after = oldestKept - 1
            step.through = after
        }
        for event in page.events.sorted(by: { $0.sequence < $1.sequence }) where event.sequence > step.through {
            step.through = event.sequence
            guard wants(event.topic) else { continue }
            do {
                step.batch.append(try Message(topic: event.topic, body: Data(event.envelope.utf8)))
            } catch {
                step.unreadable.append(event.sequence)
            }
        }
        step.lost += UInt64(step.unreadable.count)
        statistics.lost += Int(clamping: step.lost)
        step.caughtUp = step.through >= page.lastSequence || step.through == after
        return step
    }

    /// `count` events were handled, up to `through`; `time` is when the last of them was
    /// committed (its envelope's), if known.
    mutating func handled(_ count: Int, through: UInt64, replayed: Bool, time: String? = nil) {
        statistics.sequence = through
        statistics.handled += count
        if replayed { statistics.replayed += count }
        if let time { statistics.lastHandledTime = time }
        heard(of: through)
    }

    /// The publisher has recorded `sequence`.
    private mutating func heard(of sequence: UInt64) {
        statistics.newest = max(statistics.newest ?? 0, sequence)
    }
}

extension FeedStatistics {
    /// How far the feed lags: events the publisher has recorded that are not handled yet, and
    /// how long ago the last one handled was committed while any wait (0 when none does, or
    /// before the first is handled). The seconds are an upper bound: the waiting events came
    /// after that one.
    public func lag(now: Date = Date()) -> (events: UInt64, seconds: Double) {
        guard let newest, newest > sequence else { return (0, 0) }
        guard let time = lastHandledTime.flatMap(Timestamp.parseFast) else { return (newest - sequence, 0) }
        return (newest - sequence, max(0, now.timeIntervalSince(time)))
    }
}
