//! The checker's counters, as reported.

use serde::Serialize;

/// Counters and the first violation, as reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CheckerCounts {
    /// Logical messages published.
    pub published: u64,
    /// Deliveries to consumers (including duplicates), summed over subscriptions.
    pub delivered: u64,
    /// Distinct messages acknowledged, summed over subscriptions (a
    /// message a backward seek reopened counts again when acknowledged
    /// again: `reopened_by_seek`).
    pub acked: u64,
    /// Redeliveries after the consumer that received the message
    /// reconnected or was removed, or after a restart or seek (Pulsar's
    /// at-least-once).
    pub duplicates_allowed: u64,
    /// Duplicates while the consumer that received the message kept its
    /// incarnation (no reconnect of it, restart or seek in between), or
    /// after an ack.
    pub duplicate_violations: u64,
    /// Messages published but never acknowledged by some subscription
    /// (counted once per subscription) at the end of the run.
    pub lost: u64,
    /// Deliveries (first-time or redelivered) to one consumer incarnation
    /// that came after a later message of the same key (Key_Shared) or any
    /// later message (Failover), and first-time deliveries that overtook an
    /// earlier message of the key across consumers between two reconnects.
    pub order_violations: u64,
    /// Messages not acknowledged when an admin seek moved the subscription's
    /// mark-delete past them (skipped, not lost), summed over subscriptions.
    pub skipped_by_seek: u64,
    /// Deliveries of a message at or below a seek's mark-delete that the
    /// broker dispatched after the seek completed (e.g. a delayed tracker
    /// that keeps delivering trimmed indexes).
    pub delivered_after_seek: u64,
    /// Seeks (resets of a subscription, backward or forward) the checker
    /// was told about (`checker::seek`).
    pub seek_resets: u64,
    /// Acknowledged messages a backward seek made deliverable again (each
    /// must be delivered and acknowledged again).
    pub reopened_by_seek: u64,
    /// Delayed messages delivered before their delivery time (minus the
    /// allowed tick).
    pub early_deliveries: u64,
    /// Acknowledgements (individual, or covered by a cumulative ack) of
    /// messages not delivered to the acking consumer's current incarnation,
    /// or deliveries of messages never published.
    pub invalid_events: u64,
    /// Consumers that had backlog and free receiver queue but got nothing for
    /// longer than the stall bound.
    pub stalls: u64,
    /// Consumers whose broker-side permits, once everything was delivered,
    /// acknowledged and returned, differ from their receiver queue size
    /// (PIP-491: a permit leaked or was returned twice).
    pub permit_mismatches: u64,
    /// Messages not published, plus planned faults not run, when the run hit
    /// its virtual-time limit (a cut-short run proves nothing).
    pub unfinished: u64,
    /// Delayed messages first delivered later than their delivery time plus
    /// the late bound, or still waiting in the tracker past it (a tracker
    /// that lost or delayed an index, even if a later re-read repairs it).
    pub late_deliveries: u64,
    /// Delayed messages first delivered later than their delivery time plus
    /// the late bound while the subscription's dispatch had not passed them
    /// (no ordinary message after them first delivered since they were
    /// overdue): they waited behind older unacknowledged messages re-read
    /// in position order after a consumer-set rewind, as Pulsar's
    /// dispatcher does. Not a violation.
    pub late_behind_backlog: u64,
    /// Delayed tracker steps after which its reported count differs from the
    /// truth (messages it accepted and has not yet scheduled), or in which
    /// it scheduled a position it did not hold (twice, or never added).
    pub tracker_violations: u64,
    /// Pending-ack replays reported complete whose state differs from the
    /// log's records up to its end at the start, or that did not complete
    /// within the replay bound.
    pub replay_violations: u64,
    /// Entries the locked post-I/O filter let through although they were
    /// deleted (acknowledged, or at or below mark-delete) when it ran (the
    /// read-scheduling hint's correctness boundary: an entry acked before
    /// the filter ran must never be delivered).
    pub filter_leaks: u64,
    /// Transaction rules broken, as the client sees them (`checker::txn`:
    /// committed messages lost or visible twice, aborted or open ones
    /// visible, an entry past an open transaction's first entry delivered,
    /// committed acks redelivered, aborted acks never redelivered).
    pub txn_violations: u64,
    /// Reader rules broken (`checker::reader`): a reader session missed a
    /// message published after its start before it reached the end, read
    /// one before its start, never published, twice, or out of its
    /// producer's order; or a reader's cursor was found in the store.
    pub reader_violations: u64,
    /// Chunked messages reassembled by a consumer that are not the
    /// message their `uuid` names or not of their `total_chunk_msg_size`
    /// (`sim::node::chunks`).
    pub chunk_violations: u64,
    /// Producer access-mode and producer-name rules broken
    /// (`checker::producers`): two conflicting admissions live at once, a
    /// send after a fence receipted, a queued producer promoted out of
    /// order, two producers of one name admitted.
    pub producer_access_violations: u64,
    /// Watchdog stops: virtual time did not advance for too many events, or
    /// the wall-clock bound was exceeded.
    pub livelocks: u64,
}

impl CheckerCounts {
    /// Total number of violations of any kind.
    pub fn violations(&self) -> u64 {
        self.duplicate_violations
            + self.lost
            + self.order_violations
            + self.delivered_after_seek
            + self.early_deliveries
            + self.invalid_events
            + self.stalls
            + self.permit_mismatches
            + self.unfinished
            + self.late_deliveries
            + self.tracker_violations
            + self.replay_violations
            + self.filter_leaks
            + self.txn_violations
            + self.reader_violations
            + self.chunk_violations
            + self.producer_access_violations
            + self.livelocks
    }
}
