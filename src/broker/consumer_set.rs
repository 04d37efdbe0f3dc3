//! The consumer-set rewind of a Shared / Key_Shared subscription (Pulsar's
//! `PersistentDispatcherMultipleConsumers.addConsumer` on an empty consumer
//! list): the first consumer to attach after every consumer left finds the
//! dispatcher without consumers, so the cursor is rewound to the
//! mark-delete (`cursor.rewind()`) and the redelivery set is cleared
//! (`redeliveryMessages.clear()`): everything unacknowledged is read again,
//! in position order. The bucket delayed tracker keeps what it holds
//! (Pulsar clears only the in-memory tracker: "Don't clean up
//! BucketDelayedDeliveryTracker, otherwise we will lose the bucket
//! snapshot"), so the re-read re-adds delayed entries it still tracks: one
//! not yet due is a duplicate add, one already due an expired re-add (the
//! tracker untracks it and it is dispatched now). Entries acknowledged
//! inside an open transaction stay out of dispatch (`txn_pending`).

use super::subscription::{sub_type, Subscription};

impl Subscription {
    /// Called before a consumer attaches: rewinds when it is the first one
    /// of a Shared / Key_Shared subscription. Returns whether it rewound.
    pub(crate) fn rewind_for_first_consumer(&mut self) -> bool {
        let multi = self.sub_type == sub_type::SHARED || self.sub_type == sub_type::KEY_SHARED;
        if !multi || !self.consumers.is_empty() {
            return false;
        }
        // Nothing is out on a consumer (there is none): what was in flight
        // went to replay when its consumer left, and the cursor covers it.
        self.inflight.clear();
        self.replay.clear();
        self.cursor.rewind();
        self.counters.consumer_set_rewinds += 1;
        tracing::debug!(subscription = %self.name, read_position = %self.cursor.read_position(), "first consumer: rewound to the mark-delete");
        true
    }
}
