//! Snapshot create and delete with Pulsar's bounded retries
//! ([`STORAGE_RETRIES`](super::STORAGE_RETRIES)).

use super::{BucketDelayedDeliveryTracker, Inner, STORAGE_RETRIES};
use crate::delayed::error::DelayedError;
use crate::delayed::snapshot::{SnapshotMetadata, SnapshotSegment};

impl BucketDelayedDeliveryTracker {
    pub(super) fn create_with_retries(
        &self,
        metadata: &SnapshotMetadata,
        segments: &[SnapshotSegment],
        key: &str,
        replaces: &[(i64, String)],
    ) -> Result<i64, DelayedError> {
        let mut last = None;
        for _ in 0..=STORAGE_RETRIES {
            match self.storage.create(metadata, segments, key, replaces) {
                Ok(id) => return Ok(id),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("the loop runs at least once"))
    }

    pub(super) fn delete_with_retries(
        &self,
        inner: &mut Inner,
        snapshot_id: i64,
        key: &str,
    ) -> bool {
        let mut last = None;
        for _ in 0..=STORAGE_RETRIES {
            match self.storage.delete(snapshot_id, key) {
                Ok(()) => {
                    inner.stats.snapshot_deletes += 1;
                    return true;
                }
                Err(e) => last = Some(e),
            }
        }
        inner.stats.snapshot_delete_failures += 1;
        if let Some(e) = last {
            tracing::warn!(snapshot_id, bucket = key, error = %e, "bucket snapshot delete failed");
        }
        false
    }
}
