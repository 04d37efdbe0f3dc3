//! Merge: selecting adjacent buckets (Pulsar `asyncMergeBucketSnapshot`) and
//! replacing them by one snapshot that keeps segment 1, persists only what is
//! still tracked and gives no position a second live queue entry.

use super::{union_bitmaps, BucketDelayedDeliveryTracker, Inner, MAX_MERGE_NUM};
use crate::delayed::bucket::{BucketContext, ImmutableBucket};
use crate::delayed::error::DelayedError;
use crate::delayed::snapshot::{
    cut_segments, CutSegment, IndexEntry, SnapshotMetadata, SnapshotSegment,
};

impl BucketDelayedDeliveryTracker {
    /// Pulsar's merge selection: windows of `k = min(4, n)` adjacent buckets
    /// (then `k − 1` down to 2); eligible if every bucket has an unloaded
    /// segment and none is merging (and, here, the merged range would not
    /// enclose the mutable bucket's range); the winner has the smallest
    /// message sum (ties to the right) among windows whose earliest next
    /// segment timestamp improves on the running minimum.
    pub(super) fn select_merge(&self, inner: &Inner) -> Option<Vec<i64>> {
        let buckets: Vec<&ImmutableBucket> = inner.immutable.values().collect();
        let n = buckets.len();
        if n < 2 {
            return None;
        }
        let mctx = inner.mutable.context();
        // Window sizes from the largest down to 2 (a bounded loop).
        for k in (2..=MAX_MERGE_NUM.min(n)).rev() {
            let mut best: Option<usize> = None;
            let mut min_sum = u64::MAX;
            let mut min_ts = u64::MAX;
            for i in 0..=(n - k) {
                let w = &buckets[i..i + k];
                let eligible = w
                    .iter()
                    .all(|b| b.last_segment_entry_id > b.current_segment_entry_id && !b.merging);
                let lo = w[0].ctx.start_ledger_id;
                let hi = w[k - 1].ctx.end_ledger_id;
                let encloses_mutable = mctx != BucketContext::EMPTY
                    && mctx.start_ledger_id <= hi
                    && lo <= mctx.end_ledger_id;
                if !eligible || encloses_mutable {
                    continue;
                }
                let sum: u64 = w.iter().map(|b| b.number_bucket_delayed_messages).sum();
                let ts = w
                    .iter()
                    .map(|b| b.next_unloaded_timestamp())
                    .min()
                    .unwrap_or(u64::MAX);
                if sum <= min_sum && ts < min_ts {
                    min_sum = sum;
                    min_ts = ts;
                    best = Some(i);
                }
            }
            if let Some(i) = best {
                return Some(
                    buckets[i..i + k]
                        .iter()
                        .map(|b| b.ctx.start_ledger_id)
                        .collect(),
                );
            }
        }
        None
    }

    /// Merge execution: read segments 1..=last of each
    /// source (plus tracked queued positions in the range's gaps), keep only
    /// indexes still in the runtime index, build one snapshot over
    /// `[first.start, last.end]`, commit it replacing the sources atomically,
    /// then replace the queue entries of its positions by its first segment
    /// (no second live entry). Any storage failure aborts the merge with the
    /// sources unchanged.
    pub(super) fn merge(&self, inner: &mut Inner) -> bool {
        let Some(sources) = self.select_merge(inner) else {
            return false;
        };
        for s in &sources {
            if let Some(b) = inner.immutable.get_mut(s) {
                b.merging = true;
            }
        }
        let result = self.merge_sources(inner, &sources);
        for s in &sources {
            if let Some(b) = inner.immutable.get_mut(s) {
                b.merging = false;
            }
        }
        match result {
            Ok(()) => {
                inner.stats.merges += 1;
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "bucket merge aborted; sources unchanged");
                inner.stats.merge_failures += 1;
                false
            }
        }
    }

    pub(super) fn merge_sources(
        &self,
        inner: &mut Inner,
        sources: &[i64],
    ) -> Result<(), DelayedError> {
        let mut kept: Vec<IndexEntry> = Vec::new();
        let mut replaces = Vec::with_capacity(sources.len());
        for s in sources {
            let b = &inner.immutable[s];
            let segs = self
                .storage
                .get_segments(b.snapshot_id, 1, b.last_segment_entry_id)?;
            if segs.len() as u64 != b.last_segment_entry_id {
                return Err(DelayedError::CorruptSnapshot {
                    snapshot_id: b.snapshot_id,
                    reason: format!(
                        "expected {} segments, read {}",
                        b.last_segment_entry_id,
                        segs.len()
                    ),
                });
            }
            for seg in &segs {
                for d in &seg.indexes {
                    let idx = IndexEntry::from_proto(b.snapshot_id, d)?;
                    // Nothing already dispatched is persisted again (no duplicate delivery).
                    if inner.index.contains(idx.ledger_id, idx.entry_id) {
                        kept.push(idx);
                    }
                }
            }
            replaces.push((b.snapshot_id, b.ctx.key()));
        }
        let ctx = BucketContext {
            start_ledger_id: inner.immutable[&sources[0]].ctx.start_ledger_id,
            end_ledger_id: inner.immutable[&sources[sources.len() - 1]]
                .ctx
                .end_ledger_id,
        };
        // Tracked positions queued inside the merged range but in no source
        // snapshot (gaps between the sources: failed seals, late adds) are
        // persisted too, so the merged snapshot covers its whole range.
        let in_source = |l: i64, e: u32| {
            sources.iter().any(|s| {
                inner.immutable[s]
                    .frozen_bitmap
                    .get(&l)
                    .is_some_and(|bm| bm.contains(e))
            })
        };
        kept.extend(inner.shared_queue.iter().map(|r| r.0).filter(|i| {
            ctx.contains(i.ledger_id)
                && inner.index.contains(i.ledger_id, i.entry_id)
                && !in_source(i.ledger_id, i.entry_id)
        }));
        kept.sort_unstable();
        kept.dedup();
        let count = kept.len() as u64;
        let segments = cut_segments(
            kept,
            self.config.max_time_step_per_bucket_snapshot_segment_ms,
            self.config.max_indexes_per_bucket_snapshot_segment,
        );
        if segments.is_empty() {
            // Everything was dispatched: just retire the sources.
            for (s, (id, key)) in sources.iter().zip(&replaces) {
                if !self.delete_with_retries(inner, *id, key) {
                    return Err(DelayedError::storage(
                        "delete",
                        "merge source delete failed",
                    ));
                }
                Self::remove_bucket(inner, *s);
            }
            crate::trace::bucket_merge::merge_retired(self, inner, sources);
            return Ok(());
        }
        let metadata = SnapshotMetadata {
            metadata_list: segments.iter().map(CutSegment::to_metadata).collect(),
        };
        let protos: Vec<SnapshotSegment> = segments.iter().map(CutSegment::to_proto).collect();
        let key = ctx.key();
        let id = self.create_with_retries(&metadata, &protos, &key, &replaces)?;
        // Committed: the merged bucket replaces its sources. Its positions
        // are live again only through its first segment: drop their queue
        // entries (the sources' loaded segments, gap entries) and queue
        // segment 1, so no position gets a second live entry.
        for s in sources {
            Self::remove_bucket(inner, *s);
        }
        let frozen = union_bitmaps(&segments);
        inner.shared_queue.retain(|r| {
            !frozen
                .get(&r.0.ledger_id)
                .is_some_and(|bm| bm.contains(r.0.entry_id))
        });
        let traced = crate::trace::bucket_merge::segments(&segments);
        Self::register_bucket(inner, ctx, id, count, frozen, segments);
        crate::trace::bucket_merge::merge(self, inner, sources, traced);
        tracing::debug!(bucket = %key, snapshot_id = id, count, "merged buckets");
        Ok(())
    }
}
