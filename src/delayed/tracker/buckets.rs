//! The bucket map: registering a persisted bucket, finding the bucket of a
//! ledger, and the boundary registry that tells delivery when a loaded
//! segment is exhausted.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use roaring::RoaringBitmap;

use super::{BucketDelayedDeliveryTracker, Inner};
use crate::delayed::bucket::{BucketContext, ImmutableBucket};
use crate::delayed::snapshot::{CutSegment, IndexEntry};

impl BucketDelayedDeliveryTracker {
    /// Registers a persisted bucket (seal or merge result) whose snapshot is
    /// `id`, and loads its segment 1 into the shared queue.
    ///
    /// `segments` must be non-empty (both callers return early otherwise).
    pub(super) fn register_bucket(
        inner: &mut Inner,
        ctx: BucketContext,
        id: i64,
        count: u64,
        frozen_bitmap: BTreeMap<i64, RoaringBitmap>,
        segments: Vec<CutSegment>,
    ) {
        let bucket = ImmutableBucket {
            ctx,
            snapshot_id: id,
            current_segment_entry_id: 1,
            last_segment_entry_id: segments.len() as u64,
            number_bucket_delayed_messages: count,
            first_schedule_timestamps: segments.iter().map(|s| s.min_schedule_timestamp).collect(),
            frozen_bitmap,
            merging: false,
            boundary: None,
        };
        inner.immutable.insert(ctx.start_ledger_id, bucket);
        if let Some(first) = segments.into_iter().next() {
            Self::install_segment(inner, ctx.start_ledger_id, first.indexes);
        }
    }

    pub(super) fn find_bucket(inner: &Inner, ledger_id: i64) -> Option<i64> {
        inner
            .immutable
            .range(..=ledger_id)
            .next_back()
            .filter(|(_, b)| b.ctx.contains(ledger_id))
            .map(|(s, _)| *s)
    }

    /// Whether some immutable bucket starts inside `(start, ledger_id]`.
    /// Whether the ledger range `[start, end]` overlaps any immutable bucket.
    /// Buckets are disjoint and keyed by start, so only the last bucket
    /// starting at or before `end` can overlap.
    pub(super) fn spans_bucket(inner: &Inner, start: i64, end: i64) -> bool {
        start >= 0
            && inner
                .immutable
                .range(..=end)
                .next_back()
                .is_some_and(|(_, b)| b.ctx.end_ledger_id >= start)
    }

    /// Pushes a loaded segment into the shared queue and sets the bucket's
    /// boundary to its last index.
    pub(super) fn install_segment(inner: &mut Inner, bucket_start: i64, indexes: Vec<IndexEntry>) {
        let last = indexes.last().copied();
        inner.shared_queue.extend(indexes.into_iter().map(Reverse));
        Self::set_boundary(inner, bucket_start, last);
    }

    pub(super) fn set_boundary(inner: &mut Inner, bucket_start: i64, last: Option<IndexEntry>) {
        let Some(bucket) = inner.immutable.get_mut(&bucket_start) else {
            return;
        };
        if let Some(old) = bucket.boundary.take() {
            inner.boundaries.remove(&(old.ledger_id, old.entry_id));
        }
        bucket.boundary = last;
        if let Some(b) = last {
            inner
                .boundaries
                .insert((b.ledger_id, b.entry_id), bucket_start);
        }
    }

    pub(super) fn remove_bucket(inner: &mut Inner, bucket_start: i64) -> Option<ImmutableBucket> {
        let bucket = inner.immutable.remove(&bucket_start)?;
        if let Some(b) = bucket.boundary {
            inner.boundaries.remove(&(b.ledger_id, b.entry_id));
        }
        Some(bucket)
    }
}
