//! Loading the next segment of an immutable bucket when its boundary reaches
//! the head of the shared queue, with the metadata-bitmap fallback for an
//! unreadable segment (late, never early, never lost).

use super::{BucketDelayedDeliveryTracker, Inner};
use crate::delayed::error::DelayedError;
use crate::delayed::snapshot::{decode_segment_bitmaps, IndexEntry};

impl BucketDelayedDeliveryTracker {
    /// Loads segment `current + 1` of bucket `start` (or retires the bucket
    /// after its last segment). Returns whether the head may be consumed.
    pub(super) fn load_next_segment(&self, inner: &mut Inner, start: i64) -> bool {
        let Some(bucket) = inner.immutable.get(&start) else {
            return true;
        };
        if bucket.merging {
            return false;
        }
        let next = bucket.current_segment_entry_id + 1;
        let (id, key, last) = (
            bucket.snapshot_id,
            bucket.ctx.key(),
            bucket.last_segment_entry_id,
        );
        if next > last {
            Self::remove_bucket(inner, start);
            let deleted = self.delete_with_retries(inner, id, &key);
            crate::trace::bucket_merge::load_next_segment(self, inner, start, deleted);
            return true;
        }
        match self.read_segment(id, next) {
            Ok(indexes) => {
                if let Some(b) = inner.immutable.get_mut(&start) {
                    b.current_segment_entry_id = next;
                }
                Self::install_segment(inner, start, indexes);
                inner.stats.segment_loads += 1;
                crate::trace::bucket_merge::load_next_segment(self, inner, start, true);
                true
            }
            Err(
                e @ (DelayedError::CorruptSnapshot { .. } | DelayedError::SnapshotNotFound { .. }),
            ) => {
                // The segment can never be read: fall back to its metadata
                // bitmaps and deliver those positions no earlier than the
                // segment's max timestamp (late, never early, never lost).
                tracing::error!(snapshot_id = id, segment = next, error = %e, "unreadable bucket segment");
                match self.storage.get_metadata(id) {
                    Ok(meta) => match meta
                        .metadata_list
                        .get(next as usize - 1)
                        .ok_or_else(|| DelayedError::CorruptSnapshot {
                            snapshot_id: id,
                            reason: "segment metadata missing".into(),
                        })
                        .and_then(|m| {
                            decode_segment_bitmaps(id, m).map(|b| (m.max_schedule_timestamp, b))
                        }) {
                        Ok((ts, bitmaps)) => {
                            let mut indexes: Vec<IndexEntry> = bitmaps
                                .iter()
                                .flat_map(|(l, bm)| {
                                    bm.iter().map(move |e| IndexEntry {
                                        timestamp: ts,
                                        ledger_id: *l,
                                        entry_id: e,
                                    })
                                })
                                .collect();
                            indexes.sort_unstable();
                            if let Some(b) = inner.immutable.get_mut(&start) {
                                b.current_segment_entry_id = next;
                            }
                            Self::install_segment(inner, start, indexes);
                            true
                        }
                        Err(e) => {
                            tracing::error!(snapshot_id = id, error = %e, "bucket metadata unreadable too");
                            inner.stats.segment_load_failures += 1;
                            false
                        }
                    },
                    Err(e) => {
                        tracing::warn!(snapshot_id = id, error = %e, "bucket metadata read failed");
                        inner.stats.segment_load_failures += 1;
                        false
                    }
                }
            }
            Err(e) => {
                tracing::warn!(snapshot_id = id, segment = next, error = %e, "segment load failed; will retry");
                inner.stats.segment_load_failures += 1;
                false
            }
        }
    }

    pub(super) fn read_segment(
        &self,
        id: i64,
        segment: u64,
    ) -> Result<Vec<IndexEntry>, DelayedError> {
        let segs = self.storage.get_segments(id, segment, segment)?;
        let seg = segs
            .into_iter()
            .next()
            .ok_or(DelayedError::CorruptSnapshot {
                snapshot_id: id,
                reason: format!("segment {segment} missing"),
            })?;
        let mut v = seg
            .indexes
            .iter()
            .map(|d| IndexEntry::from_proto(id, d))
            .collect::<Result<Vec<_>, _>>()?;
        v.sort_unstable();
        Ok(v)
    }
}
