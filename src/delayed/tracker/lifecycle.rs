//! [`BucketDelayedDeliveryTracker::clear`] (Pulsar `clear`) and
//! [`BucketDelayedDeliveryTracker::close`] (Pulsar `close`).

use std::collections::BinaryHeap;

use super::BucketDelayedDeliveryTracker;
use crate::delayed::error::DelayedError;

impl BucketDelayedDeliveryTracker {
    /// Deletes every bucket snapshot and forgets every tracked message
    /// (Pulsar `clear`, e.g. on clear-backlog or a cursor reset) **and the
    /// recorded mark-delete**: give the cursor's current mark-delete again
    /// with [`update_mark_delete`](Self::update_mark_delete) (any position is
    /// accepted after a clear, also one below the previous mark-delete), so
    /// messages the dispatcher re-reads after a reset are delivered.
    ///
    /// # Errors
    /// [`DelayedError::Storage`] if a snapshot delete fails after retries:
    /// buckets deleted so far are removed (their bits untracked, so the
    /// counter stays equal to the runtime index's cardinality:
    /// `CounterEqualsCardinality`, checked by
    /// [`verify_invariants`](Self::verify_invariants)), the rest, the
    /// in-memory messages and the recorded mark-delete are kept; a later
    /// `clear` (or a mark-delete and trim past them) removes the rest;
    /// [`DelayedError::Closed`].
    ///
    /// # Blocking
    /// Yes: deletes every bucket snapshot (one store commit each) on the
    /// calling thread, under the tracker's lock.
    pub fn clear(&self) -> Result<(), DelayedError> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(DelayedError::Closed);
        }
        let starts: Vec<i64> = inner.immutable.keys().copied().collect();
        for s in starts {
            let (id, key) = {
                let b = &inner.immutable[&s];
                (b.snapshot_id, b.ctx.key())
            };
            if !self.delete_with_retries(&mut inner, id, &key) {
                return Err(DelayedError::storage(
                    "delete",
                    format!("clearing bucket {key}"),
                ));
            }
            if let Some(b) = Self::remove_bucket(&mut inner, s) {
                for (l, bm) in &b.frozen_bitmap {
                    inner.index.untrack_all(*l, bm);
                }
            }
        }
        inner.index.clear();
        inner.shared_queue = BinaryHeap::new();
        inner.boundaries.clear();
        inner.mutable.clear();
        // Pulsar reads the mark-delete live from the cursor; a stale one kept
        // here would make every re-added message below it an orphan
        // (counted, then dropped undelivered).
        inner.mark_delete = None;
        inner.reset_backward = false;
        Ok(())
    }

    /// Closes the tracker (Pulsar `close`): frees the heaps and the index,
    /// keeps every snapshot for the next recovery. Later calls fail with
    /// [`DelayedError::Closed`] (queries return empty/zero). Idempotent.
    pub fn close(&self) {
        let mut inner = self.inner.lock();
        inner.closed = true;
        inner.shared_queue = BinaryHeap::new();
        inner.mutable.clear();
        inner.index.clear();
        inner.immutable.clear();
        inner.boundaries.clear();
    }
}
