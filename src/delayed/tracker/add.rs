//! Tracking a message: [`BucketDelayedDeliveryTracker::add_message`] (Pulsar
//! `addMessage`): validation, the already-due and acknowledged cases, and the
//! choice between the mutable bucket and the shared queue.

use std::cmp::Reverse;

use super::{validate_position, BucketDelayedDeliveryTracker, Inner};
use crate::delayed::bucket::BucketContext;
use crate::delayed::error::DelayedError;
use crate::delayed::snapshot::IndexEntry;
use crate::position::Position;

impl BucketDelayedDeliveryTracker {
    /// Tracks message `(ledger_id, entry_id)` to be delivered at
    /// `deliver_at_ms` (Pulsar `addMessage`).
    ///
    /// Returns `Ok(false)` if the message is not tracked as delayed: it is
    /// already due (`deliver_at_ms < 0` or `≤ cutoff`; it is untracked if it
    /// was tracked, and the caller dispatches it now), or it is at or below
    /// the mark-delete recorded by
    /// [`update_mark_delete`](Self::update_mark_delete) (already
    /// acknowledged: it is neither counted nor ever scheduled; the
    /// dispatcher's deletion check drops it, as Pulsar's does after a read).
    /// Returns `Ok(true)` if it is tracked (or already was: a duplicate is
    /// not counted twice). So the count always equals what
    /// [`get_scheduled_messages`](Self::get_scheduled_messages) will deliver. May seal the mutable bucket (and
    /// then trim + merge) synchronously; a snapshot failure there never fails
    /// the add (the sealed messages stay in memory and are still delivered).
    ///
    /// # Errors
    /// [`DelayedError::EntryIdOutOfRange`] (entry id outside `0..=u32::MAX`),
    /// [`DelayedError::InvalidLedgerId`], [`DelayedError::Closed`]; state
    /// unchanged.
    ///
    /// # Blocking
    /// May block: sealing the mutable bucket writes its snapshot (one store
    /// commit, with retries) on the calling thread, under the tracker's lock.
    /// [`RedbSnapshotStorage::create_async`](crate::delayed::RedbSnapshotStorage::create_async)
    /// is the storage's non-blocking write.
    pub fn add_message(
        &self,
        ledger_id: i64,
        entry_id: i64,
        deliver_at_ms: i64,
    ) -> Result<bool, DelayedError> {
        let entry = validate_position(ledger_id, entry_id)?;
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(DelayedError::Closed);
        }
        let cutoff = self.cutoff();
        let acknowledged = inner
            .mark_delete
            .is_some_and(|md| Position::new(ledger_id, entry_id) <= md);
        if acknowledged || deliver_at_ms < 0 || deliver_at_ms as u64 <= cutoff {
            // An expired re-add must not leave its bit behind. A
            // position at or below the mark-delete is never tracked (nothing
            // tracked lies there: `update_mark_delete` untracked it), so the
            // count only holds what will be delivered.
            inner.index.untrack(ledger_id, entry);
            crate::trace::bucket_merge::add(self, &inner, ledger_id, deliver_at_ms, true);
            self.debug_check(&inner);
            return Ok(false);
        }
        if inner.index.contains(ledger_id, entry) {
            crate::trace::bucket_merge::add(self, &inner, ledger_id, deliver_at_ms, false);
            return Ok(true);
        }
        let idx = IndexEntry {
            timestamp: deliver_at_ms as u64,
            ledger_id,
            entry_id: entry,
        };
        let exist_bucket = Self::find_bucket(&inner, ledger_id).is_some();
        let mctx = inner.mutable.context();
        if !exist_bucket && ledger_id > mctx.end_ledger_id && !inner.mutable.is_empty() {
            if inner.mutable.len() as u64 >= self.config.min_index_count_per_bucket {
                self.seal(&mut inner);
                if self.config.max_num_buckets > 0
                    && inner.immutable.len() as i64 > self.config.max_num_buckets
                {
                    self.trim(&mut inner);
                    self.merge(&mut inner);
                }
            } else if Self::spans_bucket(&inner, mctx.start_ledger_id, ledger_id) {
                // Deviation from Pulsar (which would seal overlapping ranges):
                // extending the mutable range past an immutable bucket would
                // enclose it, so hand the small heap to the shared queue
                // (never persisted, rebuilt by the dispatcher's re-read).
                let Inner {
                    mutable,
                    shared_queue,
                    ..
                } = &mut *inner;
                let (_, rest) = mutable.take_sorted();
                shared_queue.extend(rest.into_iter().map(Reverse));
                crate::trace::bucket_merge::seal_fail(self, &inner);
            }
        } else if !exist_bucket
            && ledger_id > mctx.end_ledger_id
            && inner.mutable.is_empty()
            && mctx != BucketContext::EMPTY
            && Self::spans_bucket(&inner, mctx.start_ledger_id, ledger_id)
        {
            inner.mutable.reset_range();
        }
        let mctx = inner.mutable.context();
        if ledger_id >= mctx.end_ledger_id && !exist_bucket {
            inner.mutable.add(idx);
        } else {
            inner.shared_queue.push(Reverse(idx));
        }
        inner.index.track(ledger_id, entry);
        crate::trace::bucket_merge::add(self, &inner, ledger_id, deliver_at_ms, false);
        self.debug_check(&inner);
        Ok(true)
    }
}
