//! Recovery of the committed buckets at construction: enclosed, missing,
//! expired and corrupt snapshots, and restoring each bucket's bitmap into the
//! runtime index.

use std::collections::BTreeMap;

use roaring::RoaringBitmap;

use super::{BucketDelayedDeliveryTracker, Inner};
use crate::delayed::bucket::{BucketContext, ImmutableBucket};
use crate::delayed::config::RecoveryPolicy;
use crate::delayed::error::DelayedError;
use crate::delayed::snapshot::{decode_segment_bitmaps, parse_bucket_key, IndexEntry};

impl BucketDelayedDeliveryTracker {
    pub(super) fn recover(&self, inner: &mut Inner) -> Result<(), DelayedError> {
        let keys = self.storage.bucket_keys()?;
        let mut ranges: Vec<((i64, i64), String, i64)> = keys
            .into_iter()
            .filter_map(|(k, id)| parse_bucket_key(&k).map(|r| (r, k, id)))
            .collect();
        // Enclosing ranges first: sort by start ascending, end descending.
        ranges.sort_by(|a, b| a.0 .0.cmp(&b.0 .0).then(b.0 .1.cmp(&a.0 .1)));
        let mut kept: Vec<((i64, i64), String, i64)> = Vec::new();
        for r in ranges {
            match kept.last() {
                Some(((_, pe), _, _)) if r.0 .1 <= *pe => {
                    // Enclosed by a kept range: a merge source left behind.
                    self.delete_with_retries(inner, r.2, &r.1);
                    inner.stats.skipped_buckets += 1;
                }
                Some(((_, pe), _, _)) if r.0 .0 <= *pe => {
                    tracing::warn!(bucket = %r.1, "bucket range overlaps another; ignored");
                    inner.stats.skipped_buckets += 1;
                }
                _ => kept.push(r),
            }
        }
        let cutoff = self.cutoff();
        for ((start, end), key, id) in kept {
            match self.recover_bucket(start, end, id, cutoff) {
                Ok(Some((bucket, first_indexes))) => {
                    for (l, bm) in &bucket.frozen_bitmap {
                        inner.index.restore(*l, bm);
                    }
                    inner.immutable.insert(start, bucket);
                    Self::install_segment(inner, start, first_indexes);
                    inner.stats.recovered_buckets += 1;
                }
                Ok(None) => {
                    // Fully expired: its messages are re-read and dispatched.
                    self.delete_with_retries(inner, id, &key);
                    inner.stats.skipped_buckets += 1;
                }
                Err(DelayedError::SnapshotNotFound { .. }) => {
                    tracing::warn!(bucket = %key, snapshot_id = id, "dangling bucket key; removing");
                    self.delete_with_retries(inner, id, &key);
                    inner.stats.skipped_buckets += 1;
                }
                Err(e @ DelayedError::CorruptSnapshot { .. }) => {
                    match self.config.recovery_policy {
                        RecoveryPolicy::Fail => return Err(e),
                        RecoveryPolicy::SkipCorrupt => {
                            tracing::error!(bucket = %key, error = %e, "corrupt bucket snapshot skipped and deleted");
                            self.delete_with_retries(inner, id, &key);
                            inner.stats.skipped_buckets += 1;
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
        crate::trace::bucket_merge::recover(self, inner);
        Ok(())
    }

    /// Reads one bucket: skips leading segments with `max ≤ cutoff`, rebuilds
    /// the bitmap from the rest and loads the first remaining segment.
    #[allow(clippy::type_complexity)]
    pub(super) fn recover_bucket(
        &self,
        start: i64,
        end: i64,
        id: i64,
        cutoff: u64,
    ) -> Result<Option<(ImmutableBucket, Vec<IndexEntry>)>, DelayedError> {
        let meta = self.storage.get_metadata(id)?;
        let n = meta.metadata_list.len() as u64;
        let stored = self.storage.length(id)?;
        if stored != n {
            return Err(DelayedError::CorruptSnapshot {
                snapshot_id: id,
                reason: format!("metadata lists {n} segments, snapshot has {stored}"),
            });
        }
        let ctx = BucketContext {
            start_ledger_id: start,
            end_ledger_id: end,
        };
        let first_remaining = meta
            .metadata_list
            .iter()
            .position(|m| m.max_schedule_timestamp > cutoff);
        let Some(first_remaining) = first_remaining else {
            return Ok(None);
        };
        let mut frozen: BTreeMap<i64, RoaringBitmap> = BTreeMap::new();
        let mut count = 0u64;
        for m in &meta.metadata_list[first_remaining..] {
            for (l, bm) in decode_segment_bitmaps(id, m)? {
                if !ctx.contains(l) {
                    return Err(DelayedError::CorruptSnapshot {
                        snapshot_id: id,
                        reason: format!("ledger {l} outside bucket range [{start}, {end}]"),
                    });
                }
                count += bm.len();
                *frozen.entry(l).or_default() |= bm;
            }
        }
        for bm in frozen.values_mut() {
            bm.optimize();
        }
        let current = first_remaining as u64 + 1;
        let first_indexes = self.read_segment(id, current)?;
        if let Some(bad) = first_indexes.iter().find(|i| !ctx.contains(i.ledger_id)) {
            return Err(DelayedError::CorruptSnapshot {
                snapshot_id: id,
                reason: format!(
                    "segment index ledger {} outside bucket range",
                    bad.ledger_id
                ),
            });
        }
        let bucket = ImmutableBucket {
            ctx,
            snapshot_id: id,
            current_segment_entry_id: current,
            last_segment_entry_id: n,
            number_bucket_delayed_messages: count,
            first_schedule_timestamps: meta
                .metadata_list
                .iter()
                .map(|m| m.min_schedule_timestamp)
                .collect(),
            frozen_bitmap: frozen,
            merging: false,
            boundary: None,
        };
        Ok(Some((bucket, first_indexes)))
    }
}
