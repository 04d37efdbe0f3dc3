//! Individual-deletion tracking for a cursor and the lock-free
//! read-scheduling check (seed 004, "Avoid cursor lock for read scheduling
//! hints"; Pulsar's `PositionRangeSet` + the deletion part of
//! `ManagedCursorImpl`).
//!
//! - [`PositionRangeSet`]: the individually deleted ranges above
//!   mark-delete, Pulsar's open-closed `(lower, upper]` semantics, stored as
//!   one [`roaring::RoaringBitmap`] per ledger (each behind the facade's
//!   `RwLock`) in an ordered ledger map, with a published ledger → bitmap
//!   [`DeletionDirectory`] for lock-free readers.
//! - [`CursorDeletionState`]: mark-delete + ranges under one cursor `RwLock`
//!   (grouped [`delete`](CursorDeletionState::delete),
//!   [`mark_delete`](CursorDeletionState::mark_delete),
//!   [`reset`](CursorDeletionState::reset)), the authoritative
//!   [`is_message_deleted`](CursorDeletionState::is_message_deleted) /
//!   [`filter_read_entries`](CursorDeletionState::filter_read_entries), and
//!   the lock-free hint
//!   [`is_deleted_for_read_scheduling`](CursorDeletionState::is_deleted_for_read_scheduling).
//!
//! # The hint and the reset epoch
//!
//! Forward changes (acks, mark-delete advances, trims) are monotone: a
//! lock-free reader mixing old and new values can only miss a deletion (a
//! *stale negative*: one extra read, dropped by the post-I/O filter). Only a
//! reset un-deletes positions, so reset is bracketed by an odd/even epoch
//! (a seqlock whose single writer holds the cursor write lock) and a lookup
//! that overlaps it falls back to the lock. Mark-delete is published as one
//! snapshot, never as two atomics (a torn `(ledger, entry)` pair is a
//! *stale positive*: a message silently skipped).
//!
//! ```
//! use pulsar_core::cursor::{CursorDeletionState, LedgerLayout};
//! use pulsar_core::Position;
//!
//! let ledger = LedgerLayout::new([(1, 10), (2, 10)]);
//! let state = CursorDeletionState::new(Position::new(1, -1)).unwrap();
//! state.delete(&[Position::new(1, 0), Position::new(1, 2)], &ledger).unwrap();
//! assert_eq!(state.mark_delete_position(), Position::new(1, 0));
//! assert!(state.is_deleted_for_read_scheduling(1, 2));
//! assert!(!state.is_deleted_for_read_scheduling(1, 1));
//! state.reset(Position::new(1, 0), &ledger).unwrap(); // mark-delete back to (1,-1)
//! assert!(!state.is_deleted_for_read_scheduling(1, 0));
//! ```
//!
//! # Cost of the hint, and why the bitmaps stay lock-based
//!
//! A lookup loads the epoch and the packed mark-delete (plain atomic loads),
//! then the published ledger count (0 → "not deleted"). The bitmaps of up to
//! four ledgers live in permanent **summary slots** next to the directory:
//! a slot holds the ledger id, a copy of the bitmap's `min..=max` (the usual
//! query, beyond everything acknowledged in its ledger, stops there) and the
//! bitmap itself, so a lookup for a slotted ledger never loads the published
//! cell (an `arc_swap` load is a SeqCst debt-slot store plus its release:
//! as dear as an uncontended `RwLock` read). A slot bitmap is emptied and
//! re-tagged under its write lock when its ledger leaves the map, and the
//! reader checks the tag under the read lock, so reuse never leaks another
//! ledger's bits. Ledgers beyond the slots go through the published cell.
//!
//! The bitmap is read under its own lock **only if that lock is free**
//! (`try_read`): while a grouped ack holds it the hint answers "not
//! deleted" at once. That is a stale negative (an extra read the post-I/O
//! filter drops) instead of queueing the read-scheduling thread behind the
//! writer; with a writer acking continuously into the queried ledger the
//! bench measures ~10 ns per lookup instead of ~300 ns, and reports how
//! many positives it gave up.
//!
//! The copy-on-write alternative (the directory republished with immutable
//! bitmap copies by every grouped ack) removes only the bitmap read lock;
//! each grouped ack then copies the touched bitmap and republishes under
//! the cursor write lock. Measured as a bench-local model
//! (`benches/deletion_lookup.rs`, group `cow_model`) its lookup was no
//! faster than the lock-based hint while a grouped ack of 100 cost far more
//! than the in-place one, so the crate keeps the lock-based bitmaps
//! (Pulsar's structure, and the model the spec and loom/shuttle checks
//! verify: a live bitmap shared by the published directory). Grouped acks
//! take each bitmap's write lock once per group
//! ([`PositionRangeSet::add_entries`]). Numbers are in the README.
//!
//! Checks: `loom-tests/cursor.rs`, `shuttle-tests/cursor.rs`,
//! `tests/cursor_range_set.rs` (proptest against a `BTreeSet` oracle),
//! `specs/DeletionLookup.tla`, bench `benches/deletion_lookup.rs`.

mod deletion;
mod range_set;

pub use deletion::{
    CursorDeletionState, DeleteOutcome, DeletionError, LedgerLayout, LedgerTopology,
    SchedulingLookup,
};
pub use range_set::{DeletionDirectory, PositionRangeSet, RangeSetError};

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests;
