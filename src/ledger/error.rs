//! Typed errors of the managed-ledger substrate.

use crate::position::Position;

/// A failure of the storage backend itself (redb I/O, a corrupt record).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The embedded database reported an error (I/O, corruption, lock).
    #[error("embedded store error: {0}")]
    Backend(String),
    /// The store file is damaged (a page checksum, a structure or a stored
    /// record does not verify), found on open or on a read.
    #[error("corrupt store: {0}")]
    Corrupt(String),
    /// The storage cannot serve the request now and may later (BookKeeper's
    /// bookies unavailable, `BKException.BookieHandleNotAvailableException`):
    /// transient, retrying is right. A managed-ledger read reports it as
    /// [`LedgerError::StorageUnavailable`].
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The storage throttles reads (BookKeeper's `TooManyRequestsException`)
    /// or refuses to queue more writes while its writer's queue is full
    /// ([`GroupCommitter::check_capacity`](super::GroupCommitter::check_capacity)):
    /// transient, retrying later is right. A managed-ledger read reports it
    /// as [`LedgerError::TooManyRequests`].
    #[error("storage throttled: {0}")]
    Throttled(String),
}

impl From<redb::Error> for StoreError {
    fn from(e: redb::Error) -> Self {
        match e {
            redb::Error::Corrupted(msg) => StoreError::Corrupt(msg),
            other => StoreError::Backend(other.to_string()),
        }
    }
}

impl From<redb::StorageError> for StoreError {
    fn from(e: redb::StorageError) -> Self {
        match e {
            redb::StorageError::Corrupted(msg) => StoreError::Corrupt(msg),
            other => StoreError::Backend(other.to_string()),
        }
    }
}

/// redb's error types that may wrap a [`redb::StorageError`]: a wrapped
/// `Corrupted` becomes [`StoreError::Corrupt`], anything else `Backend`.
macro_rules! redb_into_store_error {
    ($($t:ident),*) => {$(
        impl From<redb::$t> for StoreError {
            fn from(e: redb::$t) -> Self {
                match e {
                    redb::$t::Storage(s) => StoreError::from(s),
                    other => StoreError::Backend(other.to_string()),
                }
            }
        }
    )*};
}
redb_into_store_error!(DatabaseError, TransactionError, TableError, CommitError);

/// The read-failure shapes Pulsar's managed ledger distinguishes, used for
/// injecting failures ([`crate::ledger::ReadFaults`]) and for classifying the
/// [`LedgerError`] a read returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadFailureKind {
    /// `ManagedLedgerException.LedgerNotExistException`: the ledger's data is
    /// gone (a `NonRecoverableLedgerException`).
    LedgerNotExist,
    /// `NonRecoverableLedgerException`: the data can never be read.
    NonRecoverableData,
    /// `ManagedLedgerFencedException`: another owner took over the ledger.
    Fenced,
    /// `CursorAlreadyClosedException`: the cursor was closed.
    CursorAlreadyClosed,
    /// A plain `ManagedLedgerException` such as BookKeeper's
    /// `BookieHandleNotAvailableException` (-8): transient, retrying is right.
    StorageUnavailable,
    /// `TooManyRequestsException`: read throttling, transient.
    TooManyRequests,
}

/// Errors returned by [`crate::ledger::ManagedLedger`] and
/// [`crate::ledger::ManagedCursor`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The ledger holding the requested position has no data (deleted or
    /// lost). Non-recoverable; skipped only with `auto_skip_non_recoverable_data`.
    #[error("ledger {ledger_id} does not exist (non-recoverable)")]
    LedgerNotExist {
        /// The missing ledger.
        ledger_id: i64,
    },
    /// Data at `position` can never be read. Non-recoverable.
    #[error("non-recoverable data at {position}")]
    NonRecoverableData {
        /// The unreadable position.
        position: Position,
    },
    /// The managed ledger was fenced (taken over by another owner).
    #[error("managed ledger {ledger} is fenced")]
    Fenced {
        /// Managed-ledger name.
        ledger: String,
    },
    /// The cursor was closed before or during the operation.
    #[error("cursor {cursor} of managed ledger {ledger} is already closed")]
    CursorAlreadyClosed {
        /// Managed-ledger name.
        ledger: String,
        /// Cursor name.
        cursor: String,
    },
    /// Storage is temporarily unavailable (e.g. bookies down); retry later.
    #[error("storage temporarily unavailable: {reason}")]
    StorageUnavailable {
        /// What was unavailable.
        reason: String,
    },
    /// Reads are being throttled; retry later.
    #[error("too many requests: reads are throttled")]
    TooManyRequests,
    /// A mark-delete tried to move the mark-delete position backward.
    #[error("mark-delete may not move backward: current {current}, requested {requested}")]
    MarkDeleteBackward {
        /// Current mark-delete position.
        current: Position,
        /// Requested (smaller) position.
        requested: Position,
    },
    /// The position lies after the last confirmed entry.
    #[error("position {position} is beyond the last confirmed entry {last_confirmed}")]
    BeyondLastConfirmed {
        /// The rejected position.
        position: Position,
        /// The ledger's last confirmed entry.
        last_confirmed: Position,
    },
    /// The position cannot be a mark-delete position: its entry id is below
    /// -1, or it lies past the end of its (non-current) ledger, or in a
    /// ledger the managed ledger does not have.
    #[error("invalid position {position}: {reason}")]
    InvalidPosition {
        /// The rejected position.
        position: Position,
        /// Why it was rejected.
        reason: String,
    },
    /// An individually deleted range `(lower, upper]` passed to
    /// `mark_delete_with_ranges` is malformed (empty or inverted, an entry id
    /// out of range, not ascending / overlapping the previous range, starting
    /// below the mark-delete position, or beyond the last confirmed entry).
    #[error("invalid individually deleted range ({lower}, {upper}]: {reason}")]
    InvalidDeletedRange {
        /// Open lower bound of the rejected range.
        lower: Position,
        /// Closed upper bound of the rejected range.
        upper: Position,
        /// Why it was rejected.
        reason: String,
    },
    /// A caller-supplied argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The storage backend failed; nothing was changed.
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for LedgerError {
    /// A transient store failure keeps its Pulsar shape (a read failing as
    /// storage-unavailable or throttled is retried by its caller, as
    /// Pulsar's dispatcher and pending-ack replay retry a
    /// `ManagedLedgerException`); any other is [`LedgerError::Store`].
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(reason) => LedgerError::StorageUnavailable { reason },
            StoreError::Throttled(_) => LedgerError::TooManyRequests,
            other => LedgerError::Store(other),
        }
    }
}

impl LedgerError {
    /// The Pulsar failure shape of this error, if it is one of the read
    /// failure kinds.
    pub fn read_failure_kind(&self) -> Option<ReadFailureKind> {
        Some(match self {
            LedgerError::LedgerNotExist { .. } => ReadFailureKind::LedgerNotExist,
            LedgerError::NonRecoverableData { .. } => ReadFailureKind::NonRecoverableData,
            LedgerError::Fenced { .. } => ReadFailureKind::Fenced,
            LedgerError::CursorAlreadyClosed { .. } => ReadFailureKind::CursorAlreadyClosed,
            LedgerError::StorageUnavailable { .. } => ReadFailureKind::StorageUnavailable,
            LedgerError::TooManyRequests => ReadFailureKind::TooManyRequests,
            _ => return None,
        })
    }

    /// True for `NonRecoverableLedgerException` shapes (ledger not exist,
    /// non-recoverable data): retrying the same read can never succeed.
    pub fn is_non_recoverable(&self) -> bool {
        matches!(
            self,
            LedgerError::LedgerNotExist { .. } | LedgerError::NonRecoverableData { .. }
        )
    }
}
