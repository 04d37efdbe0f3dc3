//! The two bucket kinds. There is no `Bucket` base class (as in Pulsar's fixed tracker):
//! [`MutableBucket`] and [`ImmutableBucket`] are independent types that share
//! a small [`BucketContext`] (the ledger range and its cursor-property key).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use roaring::RoaringBitmap;

use super::snapshot::{bucket_key, IndexEntry};

/// What both bucket kinds share: the closed ledger range `[start, end]`
/// (both −1 while a mutable bucket is empty) and the bucket key derived from
/// it (Pulsar `BucketContext`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketContext {
    /// First ledger id of the range (−1 = empty).
    pub start_ledger_id: i64,
    /// Last ledger id of the range (−1 = empty).
    pub end_ledger_id: i64,
}

impl BucketContext {
    /// The empty range `(−1, −1)`.
    pub const EMPTY: BucketContext = BucketContext {
        start_ledger_id: -1,
        end_ledger_id: -1,
    };

    /// Whether `ledger_id` lies in `[start, end]`.
    pub fn contains(&self, ledger_id: i64) -> bool {
        self.start_ledger_id <= ledger_id && ledger_id <= self.end_ledger_id
    }

    /// The cursor-property key `#pulsar.internal.delayed.bucket_<start>_<end>`.
    pub fn key(&self) -> String {
        bucket_key(self.start_ledger_id, self.end_ledger_id)
    }
}

/// The bucket being filled (Pulsar `MutableBucket`): a private min-heap of
/// indexes and the ledger range they cover. The first add after a reset sets
/// `start`; every add sets `end`. It keeps no bitmap (the runtime index is
/// the only dedup state). Lives inside the tracker lock.
#[derive(Debug, Default)]
pub struct MutableBucket {
    ctx: Option<BucketContext>,
    heap: BinaryHeap<Reverse<IndexEntry>>,
}

impl MutableBucket {
    /// An empty bucket with range `(−1, −1)`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The range, `(−1, −1)` when reset.
    pub fn context(&self) -> BucketContext {
        self.ctx.unwrap_or(BucketContext::EMPTY)
    }

    /// Pushes an index and extends the range to its ledger.
    pub fn add(&mut self, idx: IndexEntry) {
        let ctx = self.ctx.get_or_insert(BucketContext {
            start_ledger_id: idx.ledger_id,
            end_ledger_id: idx.ledger_id,
        });
        ctx.end_ledger_id = idx.ledger_id;
        self.heap.push(Reverse(idx));
    }

    /// Number of indexes in the heap (due ones already moved out are not
    /// counted).
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether the heap is empty.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// The ledgers of the heap's indexes, ascending (for the trace hooks).
    #[cfg(feature = "trace")]
    pub(crate) fn ledgers(&self) -> Vec<i64> {
        let mut v: Vec<i64> = self.heap.iter().map(|r| r.0.ledger_id).collect();
        v.sort_unstable();
        v
    }

    /// The earliest index, if any.
    pub fn peek(&self) -> Option<IndexEntry> {
        self.heap.peek().map(|r| r.0)
    }

    /// Pops every index with `timestamp <= cutoff_ms` into `out`.
    pub fn move_due(&mut self, cutoff_ms: u64, mut out: impl FnMut(IndexEntry)) {
        while let Some(Reverse(top)) = self.heap.peek() {
            if top.timestamp > cutoff_ms {
                break;
            }
            let Reverse(top) = self.heap.pop().expect("peeked Some above");
            out(top);
        }
    }

    /// Takes all indexes in ascending order and resets the range to (−1, −1)
    /// (the seal step).
    pub fn take_sorted(&mut self) -> (BucketContext, Vec<IndexEntry>) {
        let ctx = self.context();
        let heap = std::mem::take(&mut self.heap);
        let mut v: Vec<IndexEntry> = heap.into_vec().into_iter().map(|r| r.0).collect();
        v.sort_unstable();
        self.ctx = None;
        (ctx, v)
    }

    /// Resets the range to (−1, −1) (the heap is kept).
    pub fn reset_range(&mut self) {
        self.ctx = None;
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.heap = BinaryHeap::new();
        self.ctx = None;
    }

    /// Bytes reserved by the heap.
    pub fn heap_capacity_bytes(&self) -> usize {
        self.heap.capacity() * std::mem::size_of::<IndexEntry>()
    }
}

/// A sealed bucket whose contents live in a snapshot (Pulsar
/// `ImmutableBucket`). Only one segment at a time is loaded into the shared
/// queue; the frozen bitmap (union of all its segments' bitmaps, fixed at
/// build or recovery) is used only for snapshot writes, merge composition,
/// trim and recovery — never for runtime dedup or counting.
#[derive(Debug, Clone)]
pub struct ImmutableBucket {
    /// Range and key.
    pub ctx: BucketContext,
    /// Snapshot id once persisted (Pulsar `bucketId`).
    pub snapshot_id: i64,
    /// The segment currently loaded into the shared queue (from 1).
    pub current_segment_entry_id: u64,
    /// Number of segments (Pulsar `lastSegmentEntryId`).
    pub last_segment_entry_id: u64,
    /// Number of indexes in the snapshot at build/recovery.
    pub number_bucket_delayed_messages: u64,
    /// Minimum timestamp (ms) of each segment, 0-based (segment `i + 1`).
    pub first_schedule_timestamps: Vec<u64>,
    /// Ledger → entry ids of the whole snapshot (frozen).
    pub frozen_bitmap: BTreeMap<i64, RoaringBitmap>,
    /// Set while a merge that selected this bucket runs.
    pub merging: bool,
    /// Last index of the loaded segment (the boundary: when it reaches the
    /// head of the shared queue the next segment loads); `None` once the
    /// bucket is exhausted.
    pub boundary: Option<IndexEntry>,
}

impl ImmutableBucket {
    /// Timestamp (ms) of the next unloaded segment, `u64::MAX` if none.
    pub fn next_unloaded_timestamp(&self) -> u64 {
        self.first_schedule_timestamps
            .get(self.current_segment_entry_id as usize)
            .copied()
            .unwrap_or(u64::MAX)
    }

    /// Bytes held by the frozen bitmap (serialized size, a close proxy).
    pub fn frozen_bitmap_bytes(&self) -> usize {
        self.frozen_bitmap
            .values()
            .map(RoaringBitmap::serialized_size)
            .sum()
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    #[test]
    fn mutable_bucket_tracks_range_and_moves_due() {
        let mut b = MutableBucket::new();
        assert_eq!(b.context(), BucketContext::EMPTY);
        for (ts, l) in [(30, 1), (10, 2), (20, 3)] {
            b.add(IndexEntry {
                timestamp: ts,
                ledger_id: l,
                entry_id: 0,
            });
        }
        assert_eq!(b.context().start_ledger_id, 1);
        assert_eq!(b.context().end_ledger_id, 3);
        let mut due = Vec::new();
        b.move_due(20, |i| due.push(i.timestamp));
        assert_eq!(due, vec![10, 20]);
        let (ctx, rest) = b.take_sorted();
        assert_eq!(ctx.key(), "#pulsar.internal.delayed.bucket_1_3");
        assert_eq!(rest.len(), 1);
        assert_eq!(b.context(), BucketContext::EMPTY);
    }
}
