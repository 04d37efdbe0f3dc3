//! [`AcknowledgedMessages`]: the messages one consumer incarnation has
//! acknowledged, for skipping their redeliveries (Pulsar's ack-grouping
//! tracker's `isDuplicate`), held as compressed bitmaps of entry ids.
//!
//! Membership is exact: [`contains`](AcknowledgedMessages::contains) is true
//! for exactly the `(ledger_id, entry_id, batch_index)` triples passed to
//! [`insert`](AcknowledgedMessages::insert) since the last
//! [`clear`](AcknowledgedMessages::clear). What is compact is the shape:
//!
//! - a non-batched message (`batch_index` -1) is one bit in its ledger's
//!   roaring bitmap of entry ids;
//! - a batched message waits in a per-entry bitmap of batch indexes until
//!   every index `0..batch_size` of its entry is acknowledged, then the
//!   entry becomes one bit in the bitmap of whole entries of its ledger and
//!   batch size, and its per-entry bitmap is dropped;
//! - a batch index that cannot be placed in its batch (no `batch_size`, or
//!   an index outside `0..batch_size`) is kept as an exact triple.
//!
//! So an acknowledged entry costs at most about two bytes (a roaring
//! array), a bit once its ledger's bitmap is dense, and less for dense runs
//! of entry ids, which [`RoaringTreemap::optimize`] (run every
//! [`OPTIMIZE_EVERY`] inserts into a bitmap) run-length encodes; only entries with
//! some but not all messages acknowledged — the consumer's live window —
//! cost a per-entry bitmap (a set of triples would cost ~40 bytes per
//! message for the whole incarnation).

use std::collections::{BTreeMap, BTreeSet};

use roaring::{RoaringBitmap, RoaringTreemap};

/// Inserts into one entry-id bitmap between two run-length compactions.
pub const OPTIMIZE_EVERY: u64 = 16_384;

/// One ledger's (and batch size's) entries, run-length compacted now and then.
#[derive(Debug, Default)]
struct EntryBitmap {
    entries: RoaringTreemap,
    since_optimize: u64,
}

impl EntryBitmap {
    fn insert(&mut self, entry_id: u64) {
        if self.entries.insert(entry_id) {
            self.since_optimize += 1;
            if self.since_optimize >= OPTIMIZE_EVERY {
                self.since_optimize = 0;
                self.entries.optimize();
            }
        }
    }
}

/// The acknowledged messages of one consumer incarnation (see the module
/// docs). Not synchronised: owned by its [`ClientConsumer`](super::ClientConsumer).
#[derive(Debug, Default)]
pub struct AcknowledgedMessages {
    /// ledger_id → entry ids of non-batched messages (`batch_index` -1).
    singles: BTreeMap<u64, EntryBitmap>,
    /// (ledger_id, batch_size) → entries whose batch indexes
    /// `0..batch_size` are all acknowledged.
    whole_batches: BTreeMap<(u64, u32), EntryBitmap>,
    /// (ledger_id, entry_id, batch_size) → the acknowledged batch indexes of
    /// an entry not yet wholly acknowledged.
    partial: BTreeMap<(u64, u64, u32), RoaringBitmap>,
    /// Triples that fit none of the above (kept exactly).
    other: BTreeSet<(u64, u64, i32)>,
}

impl AcknowledgedMessages {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `(ledger_id, entry_id, batch_index)` (`batch_index` -1 for a
    /// non-batched message); `batch_size` is the entry's message count as
    /// carried in the message id (`None` when unknown).
    pub fn insert(
        &mut self,
        ledger_id: u64,
        entry_id: u64,
        batch_index: i32,
        batch_size: Option<i32>,
    ) {
        if batch_index == -1 {
            self.singles.entry(ledger_id).or_default().insert(entry_id);
            return;
        }
        let size = batch_size
            .and_then(|s| u32::try_from(s).ok())
            .filter(|s| *s > 0);
        let index = u32::try_from(batch_index).ok();
        let (Some(size), Some(index)) = (size, index) else {
            self.other.insert((ledger_id, entry_id, batch_index));
            return;
        };
        if index >= size {
            self.other.insert((ledger_id, entry_id, batch_index));
            return;
        }
        if self
            .whole_batches
            .get(&(ledger_id, size))
            .is_some_and(|b| b.entries.contains(entry_id))
        {
            return; // the whole entry is already acknowledged
        }
        let key = (ledger_id, entry_id, size);
        let indexes = self.partial.entry(key).or_default();
        indexes.insert(index);
        if indexes.len() == u64::from(size) {
            // every index 0..size (all are below size): one bit from now on
            self.partial.remove(&key);
            self.whole_batches
                .entry((ledger_id, size))
                .or_default()
                .insert(entry_id);
        }
    }

    /// Whether `(ledger_id, entry_id, batch_index)` was inserted.
    pub fn contains(&self, ledger_id: u64, entry_id: u64, batch_index: i32) -> bool {
        if batch_index == -1 {
            return self
                .singles
                .get(&ledger_id)
                .is_some_and(|b| b.entries.contains(entry_id));
        }
        if self.other.contains(&(ledger_id, entry_id, batch_index)) {
            return true;
        }
        let Ok(index) = u32::try_from(batch_index) else {
            return false;
        };
        // whole entries of any batch size above the index
        let whole = self
            .whole_batches
            .range((ledger_id, index.saturating_add(1))..=(ledger_id, u32::MAX))
            .any(|(_, b)| b.entries.contains(entry_id));
        whole
            || self
                .partial
                .range((ledger_id, entry_id, 0)..=(ledger_id, entry_id, u32::MAX))
                .any(|(_, indexes)| indexes.contains(index))
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.singles.clear();
        self.whole_batches.clear();
        self.partial.clear();
        self.other.clear();
    }

    #[cfg(all(test, not(any(loom, feature = "shuttle"))))]
    /// Entries with some but not all of their messages acknowledged.
    pub fn partial_entries(&self) -> usize {
        self.partial.len()
    }

    #[cfg(all(test, not(any(loom, feature = "shuttle"))))]
    /// Approximate heap bytes held (bitmaps' serialized sizes plus the
    /// per-entry and exact records), for memory reports.
    pub fn approx_bytes(&self) -> u64 {
        let maps: u64 = self
            .singles
            .values()
            .chain(self.whole_batches.values())
            .map(|b| b.entries.serialized_size() as u64 + 64)
            .sum();
        let partial: u64 = self
            .partial
            .values()
            .map(|b| b.serialized_size() as u64 + 64)
            .sum();
        maps + partial + self.other.len() as u64 * 32
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_wholly_acknowledged_batch_keeps_every_index_and_no_other() {
        let mut a = AcknowledgedMessages::new();
        for i in 0..3 {
            a.insert(7, 4, i, Some(3));
        }
        assert_eq!(
            a.partial_entries(),
            0,
            "the entry moved to the whole-entry bitmap"
        );
        for i in 0..3 {
            assert!(a.contains(7, 4, i));
        }
        assert!(!a.contains(7, 4, 3));
        assert!(
            !a.contains(7, 4, -1),
            "a batched entry is not a non-batched message"
        );
        assert!(!a.contains(7, 5, 0));
        assert!(!a.contains(8, 4, 0));
    }

    /// An entry with some of its batch indexes acknowledged is kept as a
    /// per-entry bitmap of them (not as exact triples) until the whole batch
    /// is acknowledged.
    #[test]
    fn a_partly_acknowledged_batch_is_one_per_entry_bitmap() {
        let mut a = AcknowledgedMessages::new();
        a.insert(7, 4, 0, Some(3));
        a.insert(7, 4, 2, Some(3));
        a.insert(7, 5, 1, Some(3));
        assert_eq!(a.partial_entries(), 2);
        assert!(a.contains(7, 4, 0) && a.contains(7, 4, 2) && !a.contains(7, 4, 1));
        a.insert(7, 4, 1, Some(3));
        assert_eq!(a.partial_entries(), 1, "entry 4 is wholly acknowledged");
    }

    #[test]
    fn indexes_without_a_usable_batch_size_are_kept_exactly() {
        let mut a = AcknowledgedMessages::new();
        a.insert(1, 1, 2, None);
        a.insert(1, 1, 5, Some(3));
        a.insert(1, 1, -4, Some(3));
        assert!(a.contains(1, 1, 2) && a.contains(1, 1, 5) && a.contains(1, 1, -4));
        assert!(!a.contains(1, 1, 0) && !a.contains(1, 1, -1));
    }

    #[test]
    fn a_long_dense_run_is_run_length_encoded() {
        let mut a = AcknowledgedMessages::new();
        for e in 0..1_000_000 {
            a.insert(3, e, -1, None);
        }
        assert!(a.contains(3, 999_999, -1) && !a.contains(3, 1_000_000, -1));
        // a plain bitmap would be ~125 KB
        assert!(a.approx_bytes() < 4_096, "{} bytes", a.approx_bytes());
    }

    fn triple() -> impl Strategy<Value = (u64, u64, i32, Option<i32>)> {
        (
            0u64..3,
            0u64..6,
            prop_oneof![Just(-1i32), -2i32..6],
            prop_oneof![Just(None), (0i32..5).prop_map(Some)],
        )
    }

    proptest! {
        /// Membership equals a plain set of triples (the reference model)
        /// for any mix of batched, non-batched and inconsistent ids.
        #[test]
        fn membership_matches_a_set_of_triples(
            ops in proptest::collection::vec(triple(), 0..120),
            clear_at in proptest::option::of(0usize..120),
        ) {
            let mut a = AcknowledgedMessages::new();
            let mut model = BTreeSet::new();
            for (i, (l, e, b, s)) in ops.iter().copied().enumerate() {
                if clear_at == Some(i) {
                    a.clear();
                    model.clear();
                }
                a.insert(l, e, b, s);
                model.insert((l, e, b));
                for l in 0..3 {
                    for e in 0..6 {
                        for b in -2..6 {
                            prop_assert_eq!(a.contains(l, e, b), model.contains(&(l, e, b)), "{:?}", (l, e, b));
                        }
                    }
                }
            }
        }
    }
}
