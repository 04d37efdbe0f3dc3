//! [`ObservedStorage`]: the bucket snapshot storage as the simulator sees it
//! from outside the tracker — every committed create (a seal, or a merge
//! replacing its sources) and every delete, with the positions each
//! snapshot persists, logged for [`super::delayed_truth::DelayedTruth`].
//!
//! This is how the checker knows which delayed indexes were sealed into
//! BookKeeper (here: the redb store) without asking the tracker: what a
//! merge wrote must be exactly what the tracker still held of its sources,
//! and what a recovery restores must include every held, persisted index
//! not yet due. A restart's cursor re-read re-adds what a broken merge or
//! recovery lost, so these are the only points at which such a loss is
//! visible.
//!
//! Only calls that returned `Ok` are logged (a failed create or delete wrote
//! nothing: the trait's calls are atomic). The log is drained by the engine
//! after each tracker call; the storage never calls back into the tracker.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use crate::delayed::{BucketSnapshotStorage, DelayedError, SnapshotMetadata, SnapshotSegment};
use crate::position::Position;

/// One committed storage change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotEvent {
    /// Snapshot `id` was written, replacing the snapshots `replaces` (empty
    /// for a seal, the merge sources for a merge).
    Created {
        /// The new snapshot id.
        id: i64,
        /// Every position its segments persist, with its delivery time (ms).
        positions: BTreeSet<(Position, u64)>,
        /// Snapshot ids deleted in the same atomic step.
        replaces: Vec<i64>,
    },
    /// Snapshot `id` was deleted (trim, a retired bucket, recovery cleanup).
    Deleted {
        /// The snapshot id.
        id: i64,
    },
}

/// The shared log one subscription's [`ObservedStorage`] appends to.
pub type SnapshotLog = Arc<Mutex<Vec<SnapshotEvent>>>;

/// Wraps a [`BucketSnapshotStorage`] and logs its committed changes.
#[derive(Debug)]
pub struct ObservedStorage<S> {
    inner: S,
    log: SnapshotLog,
}

impl<S: BucketSnapshotStorage> ObservedStorage<S> {
    /// Wraps `inner`, appending to `log`.
    pub fn new(inner: S, log: SnapshotLog) -> Self {
        Self { inner, log }
    }

    fn push(&self, ev: SnapshotEvent) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(ev);
    }
}

/// Takes every event logged so far.
pub fn drain(log: &SnapshotLog) -> Vec<SnapshotEvent> {
    std::mem::take(&mut *log.lock().unwrap_or_else(|e| e.into_inner()))
}

impl<S: BucketSnapshotStorage> BucketSnapshotStorage for ObservedStorage<S> {
    fn create(
        &self,
        metadata: &SnapshotMetadata,
        segments: &[SnapshotSegment],
        bucket_key: &str,
        replaces: &[(i64, String)],
    ) -> Result<i64, DelayedError> {
        let id = self
            .inner
            .create(metadata, segments, bucket_key, replaces)?;
        let positions = segments
            .iter()
            .flat_map(|s| s.indexes.iter())
            .map(|d| {
                (
                    Position::new(d.ledger_id as i64, d.entry_id as i64),
                    d.timestamp,
                )
            })
            .collect();
        self.push(SnapshotEvent::Created {
            id,
            positions,
            replaces: replaces.iter().map(|(r, _)| *r).collect(),
        });
        Ok(id)
    }

    fn get_metadata(&self, snapshot_id: i64) -> Result<SnapshotMetadata, DelayedError> {
        self.inner.get_metadata(snapshot_id)
    }

    fn get_segments(
        &self,
        snapshot_id: i64,
        first: u64,
        last: u64,
    ) -> Result<Vec<SnapshotSegment>, DelayedError> {
        self.inner.get_segments(snapshot_id, first, last)
    }

    fn length(&self, snapshot_id: i64) -> Result<u64, DelayedError> {
        self.inner.length(snapshot_id)
    }

    fn delete(&self, snapshot_id: i64, bucket_key: &str) -> Result<(), DelayedError> {
        self.inner.delete(snapshot_id, bucket_key)?;
        self.push(SnapshotEvent::Deleted { id: snapshot_id });
        Ok(())
    }

    fn bucket_keys(&self) -> Result<Vec<(String, i64)>, DelayedError> {
        self.inner.bucket_keys()
    }
}
