//! Typed errors of the delayed-delivery module.

use crate::ledger::StoreError;

/// Every failure of the bucket delayed-delivery tracker and its snapshot
/// storage. Operations that return an error leave the tracker's state
/// unchanged (or, for multi-step background work such as seal/merge, in the
/// documented consistent fallback state).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DelayedError {
    /// The entry id does not fit the 32-bit RoaringBitmap the snapshot
    /// format uses for entry ids (Pulsar's format limit), or is negative.
    #[error("entry id {entry_id} of ledger {ledger_id} is outside 0..=4294967295 (bucket bitmaps are 32-bit)")]
    EntryIdOutOfRange {
        /// Ledger id of the rejected position.
        ledger_id: i64,
        /// The rejected entry id.
        entry_id: i64,
    },
    /// A negative ledger id.
    #[error("ledger id {ledger_id} is negative")]
    InvalidLedgerId {
        /// The rejected ledger id.
        ledger_id: i64,
    },
    /// An invalid configuration value.
    #[error("invalid delayed-delivery configuration: {0}")]
    InvalidConfig(String),
    /// The snapshot (or one of its segments) does not exist.
    #[error("bucket snapshot {snapshot_id} does not exist")]
    SnapshotNotFound {
        /// Snapshot id (Pulsar: the BookKeeper ledger id).
        snapshot_id: i64,
    },
    /// The snapshot exists but cannot be decoded or is inconsistent.
    #[error("bucket snapshot {snapshot_id} is corrupt: {reason}")]
    CorruptSnapshot {
        /// Snapshot id.
        snapshot_id: i64,
        /// What is wrong (bad protobuf, bad roaring bytes, count mismatch…).
        reason: String,
    },
    /// The storage backend failed (I/O, database, injected fault).
    #[error("bucket snapshot storage failed during {op}: {reason}")]
    Storage {
        /// The storage operation (create, get_metadata, get_segments, delete…).
        op: &'static str,
        /// Backend message.
        reason: String,
    },
    /// The tracker was closed.
    #[error("delayed delivery tracker is closed")]
    Closed,
}

impl DelayedError {
    pub(crate) fn storage(op: &'static str, e: impl std::fmt::Display) -> Self {
        DelayedError::Storage {
            op,
            reason: e.to_string(),
        }
    }

    pub(crate) fn from_store(op: &'static str, e: StoreError) -> Self {
        Self::storage(op, e)
    }
}

/// A violated structural invariant of the tracker, found by
/// [`BucketDelayedDeliveryTracker::verify_invariants`](super::BucketDelayedDeliveryTracker::verify_invariants).
/// The variants of `specs/BucketMerge.tla`'s invariants carry its name
/// ([`InvariantViolation::spec_invariant`]); the others are this
/// implementation's bookkeeping of buckets and segment boundaries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvariantViolation {
    /// `CounterEqualsCardinality`: the counter differs from the runtime
    /// index's cardinality.
    #[error("CounterEqualsCardinality violated: counter {counter} != runtime index cardinality {cardinality}")]
    CounterNotCardinality {
        /// The counter (`number_of_delayed_messages`).
        counter: u64,
        /// The bitmaps' cardinality, counted from scratch.
        cardinality: u64,
    },
    /// `NoSecondLiveCopy`: a tracked position has more than one entry in
    /// the shared queue.
    #[error("NoSecondLiveCopy violated: tracked position {ledger_id}:{entry_id} has {entries} entries in the shared queue")]
    SecondLiveCopy {
        /// Ledger id of the position.
        ledger_id: i64,
        /// Entry id of the position.
        entry_id: u32,
        /// Its queue entries (≥ 2).
        entries: usize,
    },
    /// Two immutable buckets overlap, or one is filed under another start.
    #[error("bucket {bucket} overlaps another bucket or is misfiled")]
    BucketOverlap {
        /// The bucket's key (`#pulsar.internal.delayed.bucket_<start>_<end>`).
        bucket: String,
    },
    /// A bucket's current segment is outside `1..=last`.
    #[error("bucket {bucket} has segment cursor {current} outside 1..={last}")]
    SegmentCursor {
        /// The bucket's key.
        bucket: String,
        /// Its current segment entry id.
        current: u64,
        /// Its last segment entry id.
        last: u64,
    },
    /// A bucket's segment boundary is not registered, or a registered
    /// boundary belongs to no bucket.
    #[error("segment boundary {ledger_id}:{entry_id} is {reason}")]
    Boundary {
        /// Ledger id of the boundary position.
        ledger_id: i64,
        /// Entry id of the boundary position.
        entry_id: u32,
        /// "not registered" or "registered for no bucket".
        reason: &'static str,
    },
}

impl InvariantViolation {
    /// The name of the violated `specs/BucketMerge.tla` invariant, if it is
    /// one of the spec's (`CounterEqualsCardinality`, `NoSecondLiveCopy`).
    pub fn spec_invariant(&self) -> Option<&'static str> {
        match self {
            Self::CounterNotCardinality { .. } => Some("CounterEqualsCardinality"),
            Self::SecondLiveCopy { .. } => Some("NoSecondLiveCopy"),
            _ => None,
        }
    }
}
