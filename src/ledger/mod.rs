//! The managed-ledger substrate: an append-only log split into ledgers that
//! roll over after a configurable number of entries, with cursors that keep a
//! read position, a mark-delete position and properties (Pulsar's
//! `ManagedLedgerImpl` / `ManagedCursorImpl`, reduced to what the four
//! components and the simulator need).
//!
//! - [`ManagedLedger::append`] / [`ManagedLedger::append_batch`] return the new
//!   [`Position`](crate::Position)s; a batch is stored atomically.
//! - [`ManagedCursor::read_entries`] reads forward from the read position;
//!   [`ManagedCursor::rewind`] moves it back to the entry after mark-delete;
//!   [`ManagedCursor::mark_delete`] never moves backward (only
//!   [`ManagedCursor::reset`] may).
//! - Read failures can be injected per call ([`ReadFaults`]) with the shapes
//!   Pulsar distinguishes ([`ReadFailureKind`]); a ledger whose data was lost
//!   ([`ManagedLedger::mark_ledger_lost`]) fails reads with
//!   [`LedgerError::LedgerNotExist`] unless
//!   [`LedgerConfig::auto_skip_non_recoverable_data`] is on.
//! - [`ManagedLedger::trim_consumed_ledgers`] deletes the ledgers every
//!   durable cursor has consumed, under a [`RetentionPolicy`] (Pulsar's
//!   consumed-ledger trimming; what holds a ledger is in `trim.rs`).
//! - Storage is a [`LedgerStore`]: [`RedbStore`] (durable, default) or
//!   [`MemoryStore`] (tests).
//! - Every durable write has a non-blocking form that returns a
//!   [`Completion`] at once ([`ManagedLedger::append_async`],
//!   [`ManagedLedger::append_batch_async`],
//!   [`ManagedCursor::persist_deletion_state_async`],
//!   [`ManagedCursor::mark_delete_async`]); on a [`RedbStore`] it goes
//!   through the store's [`GroupCommitter`] (group commit: the writes that
//!   arrive during a commit share the next transaction and its fsync; each
//!   completes only after its own commit). Each public function with
//!   durable I/O says in `# Blocking` whether it blocks and on what.
//!
//! Concurrency: a `ManagedLedger` and its cursors may be shared between
//! threads (`Arc`); appends are serialised by the ledger's lock and each
//! cursor has its own lock. User code is called as follows:
//!
//! - a [`ReadFaults`] policy runs with no lock held, so it may call any
//!   method of the ledger or its cursors (including the reading cursor);
//! - the `skip` predicate of [`ManagedCursor::read_entries_with_skip`] runs
//!   with that cursor's lock held and must not call back into that cursor.
//!
//! # Invariants
//!
//! | spec | invariant | functions | tests |
//! |---|---|---|---|
//! | `LedgerCursor` | `ReadAfterMarkDelete` | [`ManagedCursor::read_entries`], [`ManagedCursor::mark_delete`] | `mark_delete_rewind_and_reset`, `append_rolls_over_and_reads_in_order`, `cursor_matches_reference_model` |
//! | `LedgerCursor` | `MarkDeleteConfirmed`, `MarkDeleteMonotone` | [`ManagedCursor::mark_delete`] | `mark_delete_rejects_invalid_positions_and_ranges`, `cursor_matches_reference_model` |
//! | `LedgerCursor` | `RewindLandsOnNext` | [`ManagedCursor::rewind`], [`ManagedLedger::open_cursor`] | `mark_delete_rewind_and_reset`, `cursor_matches_reference_model` |
//! | `LedgerCursor` | `MarkDeleteMonotone` | [`ManagedCursor::reset`] | `mark_delete_rewind_and_reset`, `cursor_matches_reference_model` |
//!
//! What the rows mean: the read position stays after the mark-delete
//! (`mark_delete` moves it along); mark-delete lands only on confirmed
//! entries and never moves backward, except through [`ManagedCursor::reset`]
//! (a seek), which moves it to just before the new read position in either
//! direction; rewind and recovery (a cursor reopened by `open_cursor`) land on
//! the entry after the mark-delete. The model test
//! (`tests/ledger_cursor_model.rs`, proptest against a reference model)
//! refuses backward and beyond-the-end mark-deletes with nothing changed,
//! reads after rewinds and resets, and checks reads with skip
//! ([`ManagedCursor::read_entries_with_skip_runs`]: the first run the skip
//! keeps in a window of one ledger, read position after it) against the
//! model's windows.
//!
//! Trace validation: `specs/TraceLedgerCursor.tla` follows
//! `tests/trace_ledger_cursor.rs`'s runs (the model test's cases). `Read` and
//! `MarkDelete` lines pin the read position and the mark-delete; `Rewind`,
//! `Recover` and `Reset` lines the positions they land on (mutant
//! `ledger_cursor_rewind_to_mark_delete` is rejected there and fails the
//! model test; trace-only mutant
//! `ledger_cursor_reset_acknowledges_read_position` is rejected there);
//! `ReadRun` and `SkipTo` check only that reading with skip moves forward and
//! stays within the log (which entries were passed over is not in the
//! trace).
//!
//! ```
//! use std::sync::Arc;
//! use pulsar_core::ledger::{LedgerConfig, ManagedLedger, RedbStore, StoreError};
//! use pulsar_core::Position;
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("store.redb");
//! {
//!     let store = Arc::new(RedbStore::open(&path)?);
//!     let ml = ManagedLedger::open("orders", LedgerConfig::default(), store)?;
//!     ml.append_batch(&[b"a", b"b", b"c"])?;
//!     let cursor = ml.open_cursor("sub")?;
//!     assert_eq!(cursor.read_entries(10)?.len(), 3);
//!     cursor.mark_delete(Position::new(1, 1))?;
//! } // closed
//! let store = Arc::new(RedbStore::open(&path)?);
//! let ml = ManagedLedger::open("orders", LedgerConfig::default(), store)?;
//! let cursor = ml.open_cursor("sub")?;
//! assert_eq!(cursor.mark_delete_position(), Position::new(1, 1));
//! assert_eq!(cursor.read_entries(10)?[0].data, b"c");
//!
//! // A damaged file is a typed error, not a panic.
//! drop((cursor, ml));
//! let mut bytes = std::fs::read(&path)?;
//! bytes.truncate(bytes.len() / 2);
//! let damaged = dir.path().join("damaged.redb");
//! std::fs::write(&damaged, bytes)?;
//! assert!(matches!(RedbStore::open(&damaged), Err(StoreError::Corrupt(_) | StoreError::Backend(_))));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod barrier;
mod committer;
mod completion;
mod cursor;
mod deletion_state;
mod error;
mod faults;
mod managed_ledger;
mod nonblocking;
#[cfg(any(test, feature = "sim"))]
mod read_fault_store;
mod store;
mod store_write;
mod trim;

pub use committer::{
    CommitBackend, FnWrite, GroupCommitConfig, GroupCommitStats, GroupCommitter, StoreWrite,
};
pub use completion::{completion_pair, Callback, Completer, Completion};
pub use cursor::{ManagedCursor, PersistedDeletionState, ReadSkip};
pub use error::{LedgerError, ReadFailureKind, StoreError};
pub use faults::{ReadFaults, ReadRequest};
pub use managed_ledger::{Entry, LedgerConfig, ManagedLedger, PlannedAppend};
#[cfg(any(test, feature = "sim"))]
pub(crate) use read_fault_store::ReadFaultStore;
pub use store::StoreContents;
pub use store::{
    AppendSegment, LedgerStore, MemoryStore, RedbStore, StoredCursor, StoredLedger,
    StoredLedgerInfo, SyncMode, DEFAULT_CACHE_BYTES,
};
pub use store_write::{Admit, LedgerWrite, PendingWrite, RedbCommitBackend, WriteDone};
pub use trim::{RetentionPolicy, TrimOutcome};
