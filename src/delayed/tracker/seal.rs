//! Sealing the mutable bucket into an immutable, persisted bucket (Pulsar
//! `sealBucketAndAsyncPersistent`).

use std::cmp::Reverse;

use super::{union_bitmaps, BucketDelayedDeliveryTracker, Inner};
use crate::delayed::bucket::BucketContext;
use crate::delayed::snapshot::{cut_segments, CutSegment, SnapshotMetadata, SnapshotSegment};

impl BucketDelayedDeliveryTracker {
    pub(super) fn seal(&self, inner: &mut Inner) {
        let (tracked_range, mut indexes) = inner.mutable.take_sorted();
        // A position acknowledged, then re-added after a backward
        // `reset_mark_delete`, is in the heap twice (same index, adjacent
        // once sorted): persist it once, so a recovered bucket queues one
        // entry per position (`NoSecondLiveCopy`).
        indexes.dedup();
        // The bucket covers the ledgers its indexes actually hold. The
        // mutable range can be wider (its start survives entries that became
        // due and moved to the shared queue); sealing that wider range could
        // overlap an immutable bucket, which recovery cannot tell apart from
        // a half-finished merge (found by tests/delayed_model.rs).
        let (Some(first), Some(last)) = (
            indexes.iter().map(|i| i.ledger_id).min(),
            indexes.iter().map(|i| i.ledger_id).max(),
        ) else {
            return;
        };
        let ctx = BucketContext {
            start_ledger_id: first.max(tracked_range.start_ledger_id),
            end_ledger_id: last,
        };
        if Self::spans_bucket(inner, ctx.start_ledger_id, ctx.end_ledger_id) {
            // Still overlapping: keep these indexes live in the shared queue
            // (never persisted; the dispatcher's re-read rebuilds them).
            inner.shared_queue.extend(indexes.into_iter().map(Reverse));
            crate::trace::bucket_merge::seal_fail(self, inner);
            return;
        }
        let count = indexes.len() as u64;
        let segments = cut_segments(
            indexes,
            self.config.max_time_step_per_bucket_snapshot_segment_ms,
            self.config.max_indexes_per_bucket_snapshot_segment,
        );
        if segments.is_empty() {
            return;
        }
        let metadata = SnapshotMetadata {
            metadata_list: segments.iter().map(CutSegment::to_metadata).collect(),
        };
        let protos: Vec<SnapshotSegment> = segments.iter().map(CutSegment::to_proto).collect();
        let key = ctx.key();
        match self.create_with_retries(&metadata, &protos, &key, &[]) {
            Ok(id) => {
                let frozen = union_bitmaps(&segments);
                let traced = crate::trace::bucket_merge::segments(&segments);
                Self::register_bucket(inner, ctx, id, count, frozen, segments);
                crate::trace::bucket_merge::seal(self, inner, traced);
                inner.stats.seals += 1;
                tracing::debug!(bucket = %key, snapshot_id = id, count, "sealed bucket");
            }
            Err(e) => {
                // Pulsar: on create failure every segment stays in the shared
                // queue and the bucket is dropped; the runtime index still
                // tracks the messages, so they are delivered and counted.
                tracing::warn!(bucket = %key, error = %e, "bucket snapshot create failed; keeping its messages in memory");
                for s in segments {
                    inner
                        .shared_queue
                        .extend(s.indexes.into_iter().map(Reverse));
                }
                inner.stats.seal_failures += 1;
                crate::trace::bucket_merge::seal_fail(self, inner);
            }
        }
    }
}
