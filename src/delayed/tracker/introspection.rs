//! Queries, counters and invariant checks for tests, metrics and reports.

use std::cmp::Reverse;

use super::{validate_position, BucketDelayedDeliveryTracker, TrackerStats};
use crate::delayed::bucket::BucketContext;
use crate::delayed::error::InvariantViolation;
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

    /// Checks the tracker's structural invariants, in this order:
    ///
    /// | check | spec invariant (`specs/BucketMerge.tla`) |
    /// |---|---|
    /// | the counter equals the runtime index's cardinality | `CounterEqualsCardinality` |
    /// | no tracked position has two shared-queue entries (untracked, stale entries are allowed: a pop skips them); not checked after a [`reset_mark_delete`](Self::reset_mark_delete) moved the mark-delete backward, until the next [`clear`](Self::clear): a position acknowledged, then re-added after the reset, sits next to its own stale entry or is queued again by its bucket's later segment (harmless: the pop delivers it once; the spec has no backward reset) | `NoSecondLiveCopy` |
    /// | immutable buckets are disjoint and filed under their start ledger | - |
    /// | each bucket's current segment is in `1..=last` | - |
    /// | every bucket's segment boundary is registered to it, and only those | - |
    ///
    /// Takes the tracker lock for its whole run. Cost: linear in the
    /// runtime index's ledgers, the shared queue's entries (the tracked
    /// entries are sorted) and the buckets; no storage I/O. Cheap
    /// enough to run after every operation in tests and simulations (the
    /// simulator does); an embedder can run it from a health check.
    ///
    /// # Errors
    /// The first violated invariant, as [`InvariantViolation`] (its
    /// [`spec_invariant`](InvariantViolation::spec_invariant) names the
    /// spec's invariant where there is one). Nothing is changed.
    pub fn verify_invariants(&self) -> Result<(), InvariantViolation> {
        let inner = self.inner.lock();
        if !inner.index.check() {
            return Err(InvariantViolation::CounterNotCardinality {
                counter: inner.index.len(),
                cardinality: inner.index.cardinality(),
            });
        }
        let mut live: Vec<(i64, u32)> = if inner.reset_backward {
            Vec::new()
        } else {
            inner
                .shared_queue
                .iter()
                .map(|Reverse(i)| (i.ledger_id, i.entry_id))
                .filter(|&(l, e)| inner.index.contains(l, e))
                .collect()
        };
        live.sort_unstable();
        if let Some(w) = live.windows(2).find(|w| w[0] == w[1]) {
            let (ledger_id, entry_id) = w[0];
            return Err(InvariantViolation::SecondLiveCopy {
                ledger_id,
                entry_id,
                entries: live.iter().filter(|p| **p == w[0]).count(),
            });
        }
        let mut prev_end = i64::MIN;
        for (s, b) in &inner.immutable {
            if *s != b.ctx.start_ledger_id || b.ctx.start_ledger_id <= prev_end {
                return Err(InvariantViolation::BucketOverlap {
                    bucket: b.ctx.key(),
                });
            }
            prev_end = b.ctx.end_ledger_id;
            if b.current_segment_entry_id == 0
                || b.current_segment_entry_id > b.last_segment_entry_id
            {
                return Err(InvariantViolation::SegmentCursor {
                    bucket: b.ctx.key(),
                    current: b.current_segment_entry_id,
                    last: b.last_segment_entry_id,
                });
            }
            if let Some(bd) = b.boundary {
                if inner.boundaries.get(&(bd.ledger_id, bd.entry_id)) != Some(s) {
                    return Err(InvariantViolation::Boundary {
                        ledger_id: bd.ledger_id,
                        entry_id: bd.entry_id,
                        reason: "not registered",
                    });
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
                return Err(InvariantViolation::Boundary {
                    ledger_id: pos.0,
                    entry_id: pos.1,
                    reason: "registered for no bucket",
                });
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
