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
