//! Individual-deletion tracking for a cursor and the lock-free
//! read-scheduling check without the cursor lock (Pulsar's `PositionRangeSet` + the deletion part of
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
//! - Persistence: [`DeletionSnapshot`] (taken by
//!   [`CursorDeletionState::snapshot`] under the read lock, installed by
//!   [`CursorDeletionState::from_snapshot`] / [`CursorDeletionState::restore`],
//!   the latter inside the reset epoch bracket because it may un-delete);
//!   [`position_info`]: Pulsar's `PositionInfo` bytes in both forms (caps
//!   reported as [`position_info::PositionInfoError::CapExceeded`], never
//!   applied silently); [`compact`]: the crate's exact, chunked Roaring form,
//!   persisted atomically with the cursor's properties by
//!   [`ManagedCursor::persist_deletion_state`](crate::ledger::ManagedCursor::persist_deletion_state)
//!   and read back by
//!   [`ManagedCursor::recover_deletion_state`](crate::ledger::ManagedCursor::recover_deletion_state).
//! - Batch indexes ([`CursorDeletionState::delete_batch_indexes`],
//!   [`CursorDeletionState::filter_read_entries_with_ack_sets`]) and
//!   position arithmetic ([`CursorDeletionState::skip_entries`],
//!   [`CursorDeletionState::nth_undeleted`],
//!   [`CursorDeletionState::cardinality_between`],
//!   [`CursorDeletionState::range_containing`],
//!   [`CursorDeletionState::deleted_run_end`]); [`SkipDeleted`] is the
//!   read-scheduling predicate that hops over deleted runs in
//!   [`ManagedCursor::read_entries_with_skip_runs`](crate::ledger::ManagedCursor::read_entries_with_skip_runs).
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
//! use pulsar_core::deletion::{CursorDeletionState, LedgerLayout};
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
//! # Cost of the hint: no lock, no read-modify-write
//!
//! A lookup loads the epoch and the packed mark-delete (plain atomic loads)
//! and compares the query with the packed word as one u64 key
//! (`ledger_id << 32 | entry_id` against `L << 32 | (E + 1)`, when both ids
//! of the query fit in 32 bits), then loads the published ledger count
//! (0 → "not deleted"). The bitmaps of up to
//! four ledgers live in permanent **summary slots** next to the directory:
//! a slot holds the ledger id, a copy of the bitmap's `min..=max` (the usual
//! query, beyond everything acknowledged in its ledger, stops there) and the
//! bitmap itself, so a lookup for a slotted ledger never loads the published
//! cell (an `arc_swap` load is a SeqCst debt-slot store plus its release:
//! as dear as an uncontended `RwLock` read). A slot bitmap is emptied and
//! re-tagged when its ledger leaves the map, and the reader validates the
//! tag, so reuse never leaks another ledger's bits. Ledgers beyond the
//! slots go through the published cell. A bounds word is `min << 32 |
//! (max - min)`, tested with one wrapping subtraction and one compare; a
//! slotted ledger's bitmap is not filtered a second time by its own copy.
//! The mirror read is inlined into the caller; the roaring read above the
//! mirror (with the lock's code) is out of line. Instructions per lookup
//! (callgrind, `benches/deletion_lookup_ir.rs`):
//! `docs/measurements/deletion-lookup-callgrind.toml`.
//!
//! Each ledger bitmap is a roaring bitmap behind its own `RwLock` (the
//! authoritative bits) plus a lock-free **mirror** of its entries below
//! 65,536 (`bit_mirror.rs`: lazily allocated 512-byte chunks of atomic
//! words, written inside the same write sections). The hint reads one
//! mirror word between two loads of the bitmap's seqlock version (odd
//! while a clear or a re-tag runs; setting bits needs no bracket, since
//! it only adds deletions) and never takes the bitmap's lock, so a
//! grouped ack that only adds deletions to the queried ledger (out-of-order
//! acks) neither delays the lookup nor turns it into a stale negative; a
//! lookup that overlaps a clear of that bitmap (a trim below mark-delete,
//! as in-order acks cause, a re-tag, a reset) answers "not deleted". Bit
//! sets are Release stores, so a re-tag by one writer thread and a set by
//! the next are seen in that order by a validating reader.
//! Above the mirror the roaring bitmap is read only if its lock is free
//! (`try_read`), answering "not deleted" while a writer holds it.
//!
//! The copy-on-write alternative (the directory republished with immutable
//! bitmap copies by every grouped ack) was measured as a bench-local model
//! (`benches/deletion_lookup.rs`, group `cow_model`): no faster lookups,
//! and every grouped ack copies the touched bitmap. The mirror costs each
//! grouped ack one extra word store per entry (under the write lock it
//! already holds) and each touched 4,096-entry span 512 bytes. Grouped acks
//! take each bitmap's write lock once per group
//! ([`PositionRangeSet::add_entries`]). Numbers: `docs/measurements/deletion-lookup-*.toml`.
//!
//! Checks: `loom-tests/cursor.rs`, `shuttle-tests/cursor.rs`,
//! `tests/cursor_range_set.rs` (proptest against a `BTreeSet` oracle),
//! `specs/DeletionLookup.tla`, bench `benches/deletion_lookup.rs`.
//!
//! # Invariants
//!
//! `specs/DeletionLookup.tla`; trace validation (`specs/TraceDeletionLookup.tla`)
//! replays shuttle schedules of this code recorded by `tests/trace_deletion.rs`,
//! the proptest model cases of `tests/trace_deletion_model.rs` and the
//! simulator's deletion states (`pulsar-core simulate --trace-dir`)
//! through the hooks of `crate::trace::deletion` (feature `trace`), one per
//! spec action: `Open` (the initial state), `Ack`, `MarkDelete` (an
//! explicit mark-delete, with the `Advance` it causes), `Advance`, `ResetBegin`..`ResetEnd`, `RStart`,
//! `RMarkDelete`, `RLookup` (= `RDirectory` + `RBits`), `RRecheck`,
//! `RLocked`, `RFinish`; and `Persist`, recorded by src/ledger where a
//! cursor commits its cursor info (mark-delete + individually deleted
//! ranges) to the store, which the simulator files in the run of the
//! cursor's current state (joined by a `Cursor` line): a state recovered
//! after a restart names its cursor's previous state (`pred`) and must
//! open as that state last persisted.
//!
//! | spec | invariant | functions | tests |
//! |---|---|---|---|
//! | `DeletionLookup` | `NoStalePositive` | [`CursorDeletionState::read_scheduling_lookup`], [`CursorDeletionState::reset`], [`CursorDeletionState::restore`] | `epoch_recheck_no_positive_after_a_completed_reset`, `negative_control_lookup_without_epoch_recheck`, `control_model_with_epoch_recheck_passes`, `restore_replaces_the_state_inside_the_reset_epoch_bracket`, `record_deletion_lookup_traces` |
//! | `DeletionLookup` | `NoStalePositive` | `BitMirror::contains_validated`, `BitMirror::clear_range`, `BitMirror::clear_all_and`, `LedgerBitmap::reassign` | `summary_slot_reuse_inside_old_bounds_never_leaks_another_ledgers_bits`, `summary_slot_reuse_by_two_writer_threads_never_leaks_another_ledgers_bits`, `summary_slot_reuse_never_leaks_another_ledgers_bits`, `negative_control_mirror_read_without_version_validation`, `negative_control_mirror_read_without_acquire_fence`, `negative_control_mirror_set_relaxed_in_another_writer_thread`, `range_set_matches_btreeset_oracle` |
//! | `DeletionLookup` | `NoStalePositive` | `PublishedMarkDelete::load` | `hint_never_stale_positive_with_backward_reset_unpacked_mark_delete`, `mark_delete_across_ledger_boundary`, `negative_control_mark_delete_as_two_atomics`, `negative_control_mark_delete_as_two_atomics_is_caught` |
//! | `DeletionLookup` | `EpochOddIffResetting` | [`CursorDeletionState::reset`] | `record_deletion_lookup_traces`, `record_deletion_lookup_model_traces` |
//! | `DeletionLookup` | `Deleted` | [`CursorDeletionState::is_message_deleted`], [`CursorDeletionState::delete`] | `range_set_matches_btreeset_oracle`, `record_deletion_lookup_model_traces` |
//! | `DeletionLookup` | `Deleted` | [`CursorDeletionState::skip_entries`], [`CursorDeletionState::nth_undeleted`], [`CursorDeletionState::cardinality_between`], [`CursorDeletionState::range_containing`], [`CursorDeletionState::deleted_run_end`] | `skip_apis_agree_with_the_oracle` |
//! | `TraceDeletionLookup` | `TraceFollowed`, `MarkDeleteAdvanced` | [`CursorDeletionState::delete`], [`CursorDeletionState::mark_delete`], `advance_locked` | `range_set_matches_btreeset_oracle`, `record_deletion_lookup_model_traces` |
//! | `TraceDeletionLookup` | `RecoveredAsPersisted` | [`ManagedCursor::mark_delete_with_ranges`](crate::ledger::ManagedCursor::mark_delete_with_ranges), [`ManagedCursor::reset`](crate::ledger::ManagedCursor::reset), [`ManagedCursor::persist_deletion_state`](crate::ledger::ManagedCursor::persist_deletion_state), [`ManagedLedger::open_cursor`](crate::ledger::ManagedLedger::open_cursor), [`CursorDeletionState::recover`], [`ManagedCursor::recover_deletion_state`](crate::ledger::ManagedCursor::recover_deletion_state) | `random_acks_with_more_than_10k_ranges_survive_a_restart_through_managed_cursor` |
//!
//! What the rows say:
//!
//! - `NoStalePositive`: a "deleted" hint is deleted when it is returned.
//!   `read_scheduling_lookup` re-checks the reset epoch, which `reset` makes
//!   odd around its writes; `restore` (a restore that moves mark-delete
//!   backward) shares the reset bracket. Only a test that observes the
//!   instant the lookup returns sees this property: the shuttle test
//!   `epoch_recheck_no_positive_after_a_completed_reset` (scenario
//!   `epoch_recheck_observed`, whose negative control is the seed mutant
//!   `cursor_no_epoch_recheck`) and the loom model controls. The loom and
//!   shuttle tests `hint_never_stale_positive_with_backward_reset` and the
//!   shuttle `hint_random_schedules` / `hint_pct_depth3_schedules` check a
//!   weaker property (every positive true just before or just after the
//!   reset; a positive confirmed when no reset overlapped the lookup): their
//!   scenario file, `tests/scenarios/cursor.rs`, says why deleting the epoch
//!   re-check passes them.
//! - The lock-free bitmap read reports a bit only if no clear or re-tag of
//!   that bitmap overlapped it (a reused summary slot reads as empty: the
//!   spec's fresh bitmap ids): `contains_validated` is a seqlock read,
//!   `clear_range` / `clear_all_and` write inside version brackets, and
//!   `reassign` re-tags inside the bracket. The loom tests fail with the
//!   version re-check removed (`..._inside_old_bounds_...`) or with Relaxed
//!   bit sets (`..._by_two_writer_threads_...`); the negative-control models
//!   run under loom and shuttle (version validation) or loom only (acquire
//!   fence, Relaxed set in another writer thread); `tests/cursor_range_set.rs`
//!   checks that the directory equals the set, entries across the mirror's
//!   word, chunk and end boundaries.
//! - `RMarkDelete` is one atomic step: `PublishedMarkDelete::load` reads one
//!   `AtomicU64` or one published cell.
//! - `EpochOddIffResetting`: `reset` is the only epoch writer, under the
//!   write lock; trace validation checks it (`ResetBegin`/`ResetEnd` lines
//!   carry the epoch written).
//! - `Deleted(p)` = `p <= md \/ InMap(p)` is the authoritative check:
//!   `is_message_deleted`, and `delete` (`Ack`, `Advance`); checked against a
//!   `BTreeSet` by `tests/cursor_range_set.rs` and, after every step of its
//!   traced cases (mark-delete, individually deleted ranges,
//!   `is_message_deleted`, `filter_read_entries`), by
//!   `tests/trace_deletion_model.rs`; trace validation requires `RLocked`
//!   answers to equal the spec's `Deleted(q)`. Skip, nth, cardinality and
//!   range agree with it (`tests/cursor_skip.rs`, proptest vs `BTreeSet`).
//! - The mark-delete moves only through deleted entries (`Advance`:
//!   `RunEndFrom(md, c)`), or from an explicit mark-delete's position through
//!   the deleted run after it (`MarkDelete(t, c)`).
//! - `RecoveredAsPersisted`: a cursor recovered after a restart holds exactly
//!   the mark-delete and individually deleted ranges it last persisted
//!   (Pulsar's `ManagedCursorImpl` recovery of `markDeletePosition` +
//!   `individualDeletedMessages`; nothing lost, nothing not yet persisted).
//!   `mark_delete_with_ranges`, `reset` and `persist_deletion_state` write the
//!   record; `open_cursor`, `recover` and `recover_deletion_state` read it
//!   back.
//!
//! Guarantees no spec models:
//!
//! - Restore = the acknowledged set: every persisted form restores the
//!   snapshot exactly, or fails typed ([`CursorDeletionState::snapshot`],
//!   [`CursorDeletionState::from_snapshot`], [`compact::encode`] /
//!   [`compact::decode`], [`position_info::encode_position_info`] /
//!   [`position_info::decode_position_info`]; `tests/cursor_persist.rs`:
//!   restart through `ManagedCursor` on redb, > 10 k ranges, 50 M-entry
//!   backlogs; `tests/cursor_position_info.rs`: golden bytes, proptest of
//!   both forms; `tests/cursor_batch.rs`).
//! - No silent cap: a form that cannot hold the state refuses it
//!   ([`position_info::to_message`], `CapExceeded`;
//!   `exceeding_pulsars_cap_is_reported_not_truncated`, `tests/cursor_persist.rs`).
//! - The skip scan works per deleted run, not per deleted entry
//!   ([`ManagedCursor::read_entries_with_skip_runs`](crate::ledger::ManagedCursor::read_entries_with_skip_runs)
//!   with [`SkipDeleted`]; `a_300k_deleted_run_behind_a_pinned_mark_delete_is_one_hop`:
//!   a 300 k-entry run costs 1 run query and 4 hint lookups).
//! - A batch ack never un-acknowledges an index; an empty ack set deletes the
//!   entry ([`CursorDeletionState::delete_batch_indexes`]; `tests/cursor_batch.rs`).
//!
//! Trace validation (`.ci/check trace`): 400 shuttle random schedules and 60
//! PCT schedules of a mark-delete crossing the ledger boundary, and 100
//! sequential proptest cases (248 runs: recoveries and restarts start new
//! ones) whose every hint answer also equals a `BTreeSet` reference model's
//! (`tests/trace_deletion_model.rs`). Rejected there: the seed mutant
//! `cursor_no_epoch_recheck` at `RRecheck`; the seed mutants
//! `cursor_torn_mark_delete`, `cursor_torn_mark_delete_read_order` and
//! `tests/trace_mutants/deletion_torn_mark_delete.patch` at `RMarkDelete`
//! (the PCT boundary schedules);
//! `tests/trace_mutants/deletion_advance_over_unacked_sim.patch` at
//! `Advance`, by the simulator's deletion states (six simulate runs,
//! `.ci/trace`) or the proptest model cases (out-of-order acks, explicit
//! mark-deletes through deleted runs, an empty ledger between two) alone;
//! `deletion_mark_delete_dropped_sim.patch` at `MarkDeleteAdvanced`;
//! `tests/trace_mutants/deletion_recovery_drops_ranges_sim.patch` (recovery
//! keeps the mark-delete, drops the ranges) at the recovered `Open`, by the
//! simulator's restarts (35 recovered states linked to their predecessor
//! runs in five of its six simulate runs: `txn-outage`, `failover`,
//! `delayed`, `fanout`, `permit-churn`; 9 of them with individually deleted
//! ranges).

mod bit_mirror;
pub mod compact;
pub mod position_info;
mod range_set;
mod read_skip;
mod snapshot;
mod state;

pub use range_set::{DeletionDirectory, PositionRangeSet, RangeSetError};
pub use read_skip::SkipDeleted;
pub use snapshot::DeletionSnapshot;
pub use state::{
    BatchAckOutcome, CursorDeletionState, DeleteOutcome, DeletionError, LedgerLayout,
    LedgerTopology, SchedulingLookup, SkipMode,
};

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests;
