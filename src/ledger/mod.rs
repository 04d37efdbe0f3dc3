//! The managed-ledger substrate: an append-only log split into ledgers that
//! roll over after a configurable number of entries, with cursors that keep a
//! read position, a mark-delete position and properties (Pulsar's
//! `ManagedLedgerImpl` / `ManagedCursorImpl`, reduced to what the four seed
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
//! - Storage is a [`LedgerStore`]: [`RedbStore`] (durable, default) or
//!   [`MemoryStore`] (tests).
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
//! | spec invariant (`LedgerCursor`) | maintained by | tests | traces |
//! |---|---|---|---|
//! | `ReadAfterMarkDelete`: the read position is after the mark-delete | [`ManagedCursor::read_entries`], [`ManagedCursor::mark_delete`] (moves the read position along) | `tests/ledger.rs` `mark_delete_rewind_and_reset`, `append_rolls_over_and_reads_in_order`; `tests/ledger_cursor_model.rs` `cursor_matches_reference_model` (proptest, reference model) | `specs/TraceLedgerCursor.tla` on `tests/trace_ledger_cursor.rs`'s runs (the model test's cases) (`Read`/`MarkDelete` pin the read position) |
//! | `MarkDeleteConfirmed`, `MarkDeleteMonotone`: mark-delete only on confirmed entries, never backward (except [`ManagedCursor::reset`]) | [`ManagedCursor::mark_delete`] | `tests/ledger.rs` `l2_mark_delete_rejects_invalid_positions_and_ranges`; `tests/ledger_cursor_model.rs` (backward and beyond-the-end mark-deletes refused, nothing changes) | same traces (`MarkDelete` pins the position) |
//! | `RewindLandsOnNext`: rewind and recovery land on the entry after the mark-delete | [`ManagedCursor::rewind`], [`ManagedLedger::open_cursor`] (a recovered cursor) | `tests/ledger.rs` `mark_delete_rewind_and_reset`; `tests/ledger_cursor_model.rs` (reads after a rewind) | same traces (`Rewind`, `Recover`; mutant `ledger_cursor_rewind_to_mark_delete` is rejected there and fails the model test) |
//! | `MarkDeleteMonotone` through a seek: [`ManagedCursor::reset`] moves the mark-delete to just before the new read position, in either direction | [`ManagedCursor::reset`] | `tests/ledger.rs` `mark_delete_rewind_and_reset`; `tests/ledger_cursor_model.rs` (resets, then reads) | same traces (`Reset`; trace-only mutant `ledger_cursor_reset_acknowledges_read_position` is rejected there) |
//! | reads with skip: the first run the skip keeps in a window of one ledger, read position after it | [`ManagedCursor::read_entries_with_skip_runs`] | `tests/ledger_cursor_model.rs` (`ReadSkip` against the model's windows) | same traces (`ReadRun`, `SkipTo`: only that reading moves forward and stays within the log; which entries were passed over is not in the trace) |
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

mod cursor;
mod error;
mod faults;
mod managed_ledger;
mod store;

pub use cursor::{ManagedCursor, PersistedDeletionState, ReadSkip};
pub use error::{LedgerError, ReadFailureKind, StoreError};
pub use faults::{ReadFaults, ReadRequest};
pub use managed_ledger::{Entry, LedgerConfig, ManagedLedger};
pub use store::StoreContents;
pub use store::{
    AppendSegment, LedgerStore, MemoryStore, RedbStore, StoredCursor, StoredLedger,
    StoredLedgerInfo, SyncMode, DEFAULT_CACHE_BYTES,
};
