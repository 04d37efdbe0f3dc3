//! Typed errors of the pending-ack store, its replay and its handle.

use super::record::TxnId;
use crate::ledger::LedgerError;
use crate::position::Position;

/// Errors of the pending-ack log, replay, buffered writer and handle.
///
/// Classification for the retry path ([`PendingAckError::is_retryable`])
/// follows Pulsar's `isRetryableException`: every managed-ledger failure is
/// retryable except a fenced ledger and non-recoverable data; decode errors,
/// interrupts and state errors are not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PendingAckError {
    /// A read of the pending-ack log (or a cursor operation) failed. Carries
    /// the ledger error unwrapped, so classification sees the concrete shape.
    #[error("pending-ack log read failed: {0}")]
    Ledger(#[from] LedgerError),
    /// A pending-ack log entry could not be decoded (corrupt or foreign
    /// bytes). Fails the replay attempt; never retried.
    #[error("cannot decode pending-ack log entry at {position}: {reason}")]
    Decode {
        /// Position of the entry in the pending-ack log.
        position: Position,
        /// What was wrong.
        reason: String,
    },
    /// A pending-ack log entry lacks a field Pulsar's schema requires
    /// (`required`) or that every Pulsar writer sets and its reader needs.
    /// Fails the replay attempt; never retried.
    #[error("pending-ack log entry at {position}: {message}.{field} is missing")]
    MissingField {
        /// Position of the entry in the pending-ack log.
        position: Position,
        /// The protobuf message lacking the field.
        message: &'static str,
        /// The missing field, as named in `TransactionPendingAck.proto`.
        field: &'static str,
    },
    /// A transactional ACK conflicts with the subscription's state (Pulsar's
    /// `TransactionConflictException`): the position (or batch index) is
    /// already acknowledged (`holder` None) or pending in transaction
    /// `holder`. Nothing was changed.
    #[error("txn {txn_id} cannot ack {position}{}: {}", batch_index.map(|i| format!(" batch index {i}")).unwrap_or_default(), holder.map(|h| format!("pending in txn {h}")).unwrap_or_else(|| "already acknowledged".into()))]
    AckConflict {
        /// The acknowledging transaction.
        txn_id: TxnId,
        /// The conflicting position.
        position: Position,
        /// The conflicting batch index, for a batch-index conflict.
        batch_index: Option<u32>,
        /// The transaction whose pending ack it collides with, if any.
        holder: Option<TxnId>,
    },
    /// A record is well-formed protobuf but semantically invalid.
    #[error("invalid pending-ack record: {0}")]
    InvalidRecord(String),
    /// A replay attempt ran out of readable entries before it applied every
    /// record up to the log's last confirmed entry at the attempt's start
    /// (someone moved the shared cursor's read position during the attempt).
    /// Retryable: the next attempt rewinds and reads from the mark-delete.
    #[error("pending-ack replay of {name} stopped at {applied_up_to} short of the log end {last_confirmed} (cursor read position {read_position}); a partial replay is never complete")]
    IncompleteReplay {
        /// Attempt name.
        name: String,
        /// The last entry applied (or the mark-delete if none).
        applied_up_to: Position,
        /// The last confirmed entry when the attempt started.
        last_confirmed: Position,
        /// The cursor's read position when it stopped.
        read_position: Position,
    },
    /// The replay was interrupted (the handle was closed while it ran). An
    /// interrupted replay is never reported complete.
    #[error("pending-ack replay of {name} was interrupted")]
    Interrupted {
        /// Handle name.
        name: String,
    },
    /// The handle gave up initialising (a non-retryable failure); every
    /// waiter gets this (Pulsar: `BrokerServiceException("Failed to init
    /// transaction pending ack.")`).
    #[error("failed to init transaction pending ack {name}: {cause}")]
    InitFailed {
        /// Handle name.
        name: String,
        /// The non-retryable failure that ended initialisation.
        cause: Box<PendingAckError>,
    },
    /// The pending-ack log cursor was closed and could not be reopened
    /// through its managed ledger on `attempts` attempts in a row; the
    /// handle gave up (wrapped in [`PendingAckError::InitFailed`]).
    #[error("pending-ack cursor {cursor} of {name} is closed and could not be reopened ({attempts} attempts): {reason}")]
    CursorClosed {
        /// Handle name.
        name: String,
        /// Cursor name.
        cursor: String,
        /// Attempts in a row that failed to reopen it.
        attempts: u32,
        /// Why the reopen failed.
        reason: String,
    },
    /// The handle is in Error state (Pulsar: `ServiceUnitNotReadyException`).
    #[error("pending ack handle {name} is not ready (state {state})")]
    NotReady {
        /// Handle name.
        name: String,
        /// The state it is in.
        state: &'static str,
    },
    /// The handle was closed; pending waiters and requests fail with this.
    #[error("pending ack handle {name} is closed")]
    Closed {
        /// Handle name.
        name: String,
    },
    /// The buffered writer was closed before the record was flushed
    /// (Pulsar fails unflushed callbacks with a fenced exception).
    #[error("pending-ack buffered writer is closed; the record was not persisted")]
    WriterClosed,
    /// A configuration value is out of range; nothing was created.
    #[error("invalid pending-ack configuration: {0}")]
    InvalidConfig(String),
}

impl PendingAckError {
    /// Pulsar's `isRetryableException` (after unwrapping): `true` for every
    /// managed-ledger failure except [`LedgerError::Fenced`] and the
    /// non-recoverable shapes ([`LedgerError::LedgerNotExist`],
    /// [`LedgerError::NonRecoverableData`]), and for
    /// [`PendingAckError::IncompleteReplay`] (the next attempt rewinds);
    /// `false` for decode/state errors, conflicts and interrupts.
    pub fn is_retryable(&self) -> bool {
        match self {
            PendingAckError::Ledger(e) => {
                !(matches!(e, LedgerError::Fenced { .. }) || e.is_non_recoverable())
            }
            PendingAckError::IncompleteReplay { .. } => true,
            _ => false,
        }
    }
}
