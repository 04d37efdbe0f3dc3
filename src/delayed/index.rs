//! The runtime index: the single source of truth for "is this position
//! tracked" and for the delayed-message count.

use std::collections::BTreeMap;

use roaring::RoaringBitmap;

/// Pulsar's `BucketDelayedMessageIndex`: ledger id → RoaringBitmap of
/// tracked entry ids, owned together with a counter equal to the total
/// cardinality.
///
/// * [`track`](Self::track) is idempotent and counts a position once;
/// * [`untrack`](Self::untrack) returns whether the position was tracked and
///   decrements only then (this is what makes duplicate queue entries
///   harmless);
/// * [`restore`](Self::restore) tracks every bit of a bitmap.
///
/// The counter equals the cardinality after every method (checked by
/// [`check`](Self::check), which debug builds run from the tracker at every
/// public boundary). Empty per-ledger bitmaps are dropped, so memory follows
/// the live set. Not synchronised: it lives inside the tracker lock.
#[derive(Debug, Default, Clone)]
pub struct BucketDelayedMessageIndex {
    bitmaps: BTreeMap<i64, RoaringBitmap>,
    count: u64,
}

impl BucketDelayedMessageIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tracks `(ledger_id, entry_id)`; returns `true` if it was not tracked.
    pub fn track(&mut self, ledger_id: i64, entry_id: u32) -> bool {
        let added = self.bitmaps.entry(ledger_id).or_default().insert(entry_id);
        if added {
            self.count += 1;
        }
        added
    }

    /// Untracks `(ledger_id, entry_id)`; returns `true` (and decrements the
    /// counter) only if it was tracked.
    pub fn untrack(&mut self, ledger_id: i64, entry_id: u32) -> bool {
        let Some(bm) = self.bitmaps.get_mut(&ledger_id) else {
            return false;
        };
        let removed = bm.remove(entry_id);
        if removed {
            self.count -= 1;
            if bm.is_empty() {
                self.bitmaps.remove(&ledger_id);
            }
        }
        removed
    }

    /// Whether `(ledger_id, entry_id)` is tracked (Pulsar `containsMessage`).
    pub fn contains(&self, ledger_id: i64, entry_id: u32) -> bool {
        self.bitmaps
            .get(&ledger_id)
            .is_some_and(|bm| bm.contains(entry_id))
    }

    /// Tracks every entry id of `bitmap` in ledger `ledger_id`; returns how
    /// many were newly tracked (already tracked ones are not counted again).
    pub fn restore(&mut self, ledger_id: i64, bitmap: &RoaringBitmap) -> u64 {
        if bitmap.is_empty() {
            return 0;
        }
        let bm = self.bitmaps.entry(ledger_id).or_default();
        let before = bm.len();
        *bm |= bitmap;
        let added = bm.len() - before;
        self.count += added;
        added
    }

    /// Untracks every entry id of `bitmap` in ledger `ledger_id`; returns how
    /// many were tracked (only those decrement the counter).
    pub fn untrack_all(&mut self, ledger_id: i64, bitmap: &RoaringBitmap) -> u64 {
        let Some(bm) = self.bitmaps.get_mut(&ledger_id) else {
            return 0;
        };
        let before = bm.len();
        *bm -= bitmap;
        let removed = before - bm.len();
        self.count -= removed;
        if bm.is_empty() {
            self.bitmaps.remove(&ledger_id);
        }
        removed
    }

    /// Untracks every position `<= (ledger_id, entry_id)` (acknowledged by
    /// mark-delete); returns how many were tracked.
    pub fn untrack_up_to(&mut self, ledger_id: i64, entry_id: i64) -> u64 {
        let below: Vec<i64> = self.bitmaps.range(..ledger_id).map(|(l, _)| *l).collect();
        let mut removed = 0;
        for l in below {
            if let Some(bm) = self.bitmaps.remove(&l) {
                removed += bm.len();
            }
        }
        if entry_id >= 0 {
            if let Some(bm) = self.bitmaps.get_mut(&ledger_id) {
                let hi = u32::try_from(entry_id).unwrap_or(u32::MAX);
                removed += bm.remove_range(..=hi);
                if bm.is_empty() {
                    self.bitmaps.remove(&ledger_id);
                }
            }
        }
        self.count -= removed;
        removed
    }

    /// The ledgers of the tracked positions, one per position, ascending
    /// (for the trace hooks).
    #[cfg(feature = "trace")]
    pub(crate) fn ledgers(&self) -> Vec<i64> {
        self.bitmaps
            .iter()
            .flat_map(|(l, bm)| std::iter::repeat_n(*l, bm.len() as usize))
            .collect()
    }

    /// Number of tracked positions (Pulsar `getNumberOfDelayedMessages`).
    pub fn len(&self) -> u64 {
        self.count
    }

    /// Whether nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Sum of the bitmaps' cardinalities, computed from scratch.
    pub fn cardinality(&self) -> u64 {
        self.bitmaps.values().map(RoaringBitmap::len).sum()
    }

    /// Moves the counter off the bitmaps' cardinality (tests of the checks
    /// that must report it).
    #[cfg(all(test, not(any(loom, feature = "shuttle"))))]
    pub(crate) fn skew_counter_for_test(&mut self, delta: i64) {
        self.count = self.count.wrapping_add_signed(delta);
    }

    /// Whether the counter equals the cardinality (the index invariant).
    pub fn check(&self) -> bool {
        self.count == self.cardinality()
    }

    /// Removes everything.
    pub fn clear(&mut self) {
        self.bitmaps.clear();
        self.count = 0;
    }

    /// Iterates `(ledger_id, bitmap)` in ledger order.
    pub fn iter(&self) -> impl Iterator<Item = (i64, &RoaringBitmap)> {
        self.bitmaps.iter().map(|(l, b)| (*l, b))
    }

    /// Run-length-compresses the bitmaps (less memory for dense ledgers).
    pub fn optimize(&mut self) {
        for bm in self.bitmaps.values_mut() {
            bm.optimize();
        }
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    #[test]
    fn track_is_idempotent_and_untrack_reports_presence() {
        let mut idx = BucketDelayedMessageIndex::new();
        assert!(idx.track(1, 5));
        assert!(!idx.track(1, 5));
        assert_eq!(idx.len(), 1);
        assert!(idx.untrack(1, 5));
        assert!(!idx.untrack(1, 5));
        assert!(!idx.untrack(9, 9));
        assert_eq!(idx.len(), 0);
        assert!(idx.check());
    }

    #[test]
    fn restore_and_untrack_all_count_only_changes() {
        let mut idx = BucketDelayedMessageIndex::new();
        idx.track(2, 1);
        let bm: RoaringBitmap = [1u32, 2, 3].into_iter().collect();
        assert_eq!(idx.restore(2, &bm), 2);
        assert_eq!(idx.len(), 3);
        idx.untrack(2, 2);
        assert_eq!(idx.untrack_all(2, &bm), 2);
        assert_eq!(idx.len(), 0);
        assert!(idx.check());
        assert_eq!(idx.iter().count(), 0);
    }

    /// `is_empty` and `iter` follow the tracked positions; `check` fails
    /// when the counter and the bitmaps disagree.
    #[test]
    fn emptiness_iteration_and_the_counter_check() {
        let mut idx = BucketDelayedMessageIndex::new();
        assert!(idx.is_empty());
        idx.track(3, 1);
        idx.track(5, 2);
        idx.track(5, 4);
        assert!(!idx.is_empty());
        let seen: Vec<(i64, Vec<u32>)> = idx.iter().map(|(l, b)| (l, b.iter().collect())).collect();
        assert_eq!(seen, vec![(3, vec![1]), (5, vec![2, 4])]);
        assert!(idx.check());
        idx.count += 1;
        assert!(!idx.check(), "counter ahead of the bitmaps");
    }

    /// `optimize` run-length encodes a dense ledger's bitmap (same members,
    /// far fewer bytes).
    #[test]
    fn optimize_run_length_encodes_dense_bitmaps() {
        let mut idx = BucketDelayedMessageIndex::new();
        for e in 0..60_000 {
            idx.track(1, e);
        }
        let bytes = |idx: &BucketDelayedMessageIndex| {
            idx.iter().map(|(_, b)| b.serialized_size()).sum::<usize>()
        };
        let before = bytes(&idx);
        idx.optimize();
        assert!(bytes(&idx) * 10 < before, "{} -> {}", before, bytes(&idx));
        assert_eq!(idx.len(), 60_000);
        assert!(idx.check());
    }
}
