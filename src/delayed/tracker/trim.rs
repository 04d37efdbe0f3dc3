//! Trim: retiring the buckets whose whole range lies below the mark-delete
//! ledger, untracking their frozen bitmaps (Pulsar
//! `asyncTrimAndMergeBuckets`, first half).

use super::{BucketDelayedDeliveryTracker, Inner};
use crate::delayed::error::DelayedError;

impl BucketDelayedDeliveryTracker {
    /// Runs trim then one merge now (Pulsar runs this chain after a seal when
    /// `max_num_buckets` is exceeded; exposed for admin use and tests).
    /// Returns whether a merge committed.
    ///
    /// # Errors
    /// [`DelayedError::Closed`].
    ///
    /// # Blocking
    /// May block: trims and merges buckets, each merge one store commit
    /// (written and its sources deleted atomically), on the calling thread
    /// under the tracker's lock.
    pub fn trim_and_merge(&self) -> Result<bool, DelayedError> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(DelayedError::Closed);
        }
        self.trim(&mut inner);
        let merged = self.merge(&mut inner);
        self.debug_check(&inner);
        Ok(merged)
    }

    /// Deletes, one at a time in ledger order, the buckets whose whole range
    /// lies below the mark-delete ledger; stops at the first delete failure.
    /// Each trimmed bucket's frozen bitmap is untracked bit by bit.
    pub(super) fn trim(&self, inner: &mut Inner) {
        let Some(first_live) = inner.mark_delete.map(|p| p.ledger_id) else {
            return;
        };
        let candidates: Vec<i64> = inner
            .immutable
            .values()
            .filter(|b| b.ctx.end_ledger_id < first_live && !b.merging)
            .map(|b| b.ctx.start_ledger_id)
            .collect();
        for start in candidates {
            let (id, key) = {
                let b = &inner.immutable[&start];
                (b.snapshot_id, b.ctx.key())
            };
            if !self.delete_with_retries(inner, id, &key) {
                break;
            }
            if let Some(b) = Self::remove_bucket(inner, start) {
                for (l, bm) in &b.frozen_bitmap {
                    inner.index.untrack_all(*l, bm);
                }
            }
            inner.stats.trimmed_buckets += 1;
            crate::trace::bucket_merge::trim(self, inner, start);
        }
    }
}
