//! Delivery: [`BucketDelayedDeliveryTracker::get_scheduled_messages`] (Pulsar
//! `getScheduledMessages`) pops due queue entries, delivering a position only
//! if the runtime index still tracked it.

use std::cmp::Reverse;

use super::{BucketDelayedDeliveryTracker, Inner};
use crate::delayed::error::DelayedError;
use crate::position::Position;

impl BucketDelayedDeliveryTracker {
    /// Returns up to `max` positions that are due (Pulsar
    /// `getScheduledMessages`), sorted by `(ledger_id, entry_id)`, and
    /// untracks them. Loads the next segment of a bucket when its boundary
    /// reaches the head of the queue; a failed load keeps the head and stops
    /// (retried on the next call). Queue entries in ledgers below the
    /// mark-delete ledger are discarded without waiting for their time (their
    /// positions are acknowledged, hence no longer tracked nor counted). A
    /// position is returned only if it was still tracked (duplicate and stale
    /// queue entries are skipped), so every counted message is returned once.
    ///
    /// # Errors
    /// [`DelayedError::Closed`].
    ///
    /// # Blocking
    /// May block: loading a bucket's next segment reads the store, and a bucket
    /// whose last segment was delivered is deleted (one store commit), on the
    /// calling thread under the tracker's lock.
    pub fn get_scheduled_messages(&self, max: usize) -> Result<Vec<Position>, DelayedError> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(DelayedError::Closed);
        }
        let cutoff = self.cutoff();
        let first_live = inner.mark_delete.map(|p| p.ledger_id);
        let moved_from = inner.mutable.len();
        {
            let Inner {
                mutable,
                shared_queue,
                ..
            } = &mut *inner;
            mutable.move_due(cutoff, |i| shared_queue.push(Reverse(i)));
        }
        crate::trace::bucket_merge::move_due(self, &inner, inner.mutable.len() != moved_from);
        let mut out = Vec::new();
        let mut n = max;
        while n > 0 {
            let Some(&Reverse(head)) = inner.shared_queue.peek() else {
                break;
            };
            let key = (head.ledger_id, head.entry_id);
            let orphan = first_live.is_some_and(|fl| head.ledger_id < fl);
            if !orphan && head.timestamp > cutoff {
                break;
            }
            if let Some(&start) = inner.boundaries.get(&key) {
                // The loaded segment is exhausted up to its last index: load
                // the next one (or retire the bucket). Also for an orphaned
                // boundary, so later segments are not stranded.
                let segment = |inner: &Inner| {
                    inner
                        .immutable
                        .get(&start)
                        .map(|b| b.current_segment_entry_id)
                };
                let before = segment(&inner);
                if !self.load_next_segment(&mut inner, start) {
                    break;
                }
                // The loop progresses: a load that lets the head go has
                // moved its bucket to a later segment or retired it (so this
                // boundary cannot stop the head again).
                debug_assert!(
                    before.is_some() && segment(&inner).is_none_or(|s| Some(s) > before),
                    "boundary {key:?} of bucket {start}: segment {before:?} -> {:?}",
                    segment(&inner)
                );
                continue;
            }
            inner.shared_queue.pop();
            let tracked = inner.index.untrack(head.ledger_id, head.entry_id);
            let deliver = tracked && !orphan;
            if deliver {
                out.push(Position::new(head.ledger_id, i64::from(head.entry_id)));
                n -= 1;
            }
            crate::trace::bucket_merge::pop(self, &inner, head.ledger_id, orphan, deliver);
        }
        out.sort_unstable();
        self.debug_check(&inner);
        Ok(out)
    }
}
