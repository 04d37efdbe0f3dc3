//! Queries, counters and invariant checks for tests, metrics and reports.

use super::{validate_position, BucketDelayedDeliveryTracker, TrackerStats};
use crate::delayed::bucket::BucketContext;
use crate::delayed::snapshot::IndexEntry;

impl BucketDelayedDeliveryTracker {
    /// Number of tracked delayed messages (the runtime index's counter).
    pub fn number_of_delayed_messages(&self) -> u64 {
        self.inner.lock().index.len()
    }

    /// Whether `(ledger_id, entry_id)` is tracked (Pulsar `containsMessage`);
    /// `false` for positions that cannot be tracked.
    pub fn contains_message(&self, ledger_id: i64, entry_id: i64) -> bool {
        match validate_position(ledger_id, entry_id) {
            Ok(e) => self.inner.lock().index.contains(ledger_id, e),
            Err(_) => false,
        }
    }

    /// Background-work counters.
    pub fn stats(&self) -> TrackerStats {
        self.inner.lock().stats
    }

    /// The immutable buckets as `(range, snapshot id, current segment, last
    /// segment)`, in ledger order.
    pub fn buckets(&self) -> Vec<(BucketContext, i64, u64, u64)> {
        self.inner
            .lock()
            .immutable
            .values()
            .map(|b| {
                (
                    b.ctx,
                    b.snapshot_id,
                    b.current_segment_entry_id,
                    b.last_segment_entry_id,
                )
            })
            .collect()
    }

    /// Entries in the shared queue (including duplicates not yet skipped).
    pub fn shared_queue_len(&self) -> usize {
        self.inner.lock().shared_queue.len()
    }

    /// Checks the internal invariants: counter == cardinality, bucket ranges
    /// disjoint, every boundary maps to its bucket, `1 ≤ current ≤ last`.
    ///
    /// # Errors
    /// A description of the first violated invariant.
    pub fn verify_invariants(&self) -> Result<(), String> {
        let inner = self.inner.lock();
        if !inner.index.check() {
            return Err(format!(
                "counter {} != cardinality {}",
                inner.index.len(),
                inner.index.cardinality()
            ));
        }
        let mut prev_end = i64::MIN;
        for (s, b) in &inner.immutable {
            if *s != b.ctx.start_ledger_id || b.ctx.start_ledger_id <= prev_end {
                return Err(format!("bucket {} overlaps or is misfiled", b.ctx.key()));
            }
            prev_end = b.ctx.end_ledger_id;
            if b.current_segment_entry_id == 0
                || b.current_segment_entry_id > b.last_segment_entry_id
            {
                return Err(format!("bucket {} has bad segment cursor", b.ctx.key()));
            }
            if let Some(bd) = b.boundary {
                if inner.boundaries.get(&(bd.ledger_id, bd.entry_id)) != Some(s) {
                    return Err(format!("bucket {} boundary not registered", b.ctx.key()));
                }
            }
        }
        for (pos, s) in &inner.boundaries {
            let ok = inner
                .immutable
                .get(s)
                .and_then(|b| b.boundary)
                .is_some_and(|b| (b.ledger_id, b.entry_id) == *pos);
            if !ok {
                return Err(format!("stale boundary {pos:?}"));
            }
        }
        Ok(())
    }

    /// Approximate bytes held by the tracker's in-memory structures (heaps'
    /// capacity, bitmaps' serialized size, boundary map), for reports.
    pub fn approx_memory_bytes(&self) -> usize {
        let inner = self.inner.lock();
        let q = inner.shared_queue.capacity() * std::mem::size_of::<IndexEntry>();
        let idx: usize = inner
            .index
            .iter()
            .map(|(_, b)| b.serialized_size() + 48)
            .sum();
        let frozen: usize = inner
            .immutable
            .values()
            .map(|b| b.frozen_bitmap_bytes() + 128)
            .sum();
        q + idx + frozen + inner.mutable.heap_capacity_bytes() + inner.boundaries.capacity() * 24
    }
}
