//! A cursor over a managed ledger: read position, mark-delete position,
//! individually deleted ranges and properties ([`ManagedCursor`]).
//!
//! # Invariants
//!
//! `specs/LedgerCursor.tla`; trace validation (`specs/TraceLedgerCursor.tla`)
//! replays the proptest model test's operation sequences
//! (`tests/ledger_cursor_model.rs`, fixed seed) recorded by
//! `tests/trace_ledger_cursor.rs` through the hooks of
//! `crate::trace::ledger_cursor` (feature `trace`): `AppendEntry`, `Read`,
//! `ReadRun` and `SkipTo` (reads with skip), `MarkDelete` (also of
//! `persist_deletion_state`, the broker core's persist), `Rewind`,
//! `Reset`, `Recover` (in `ManagedLedger::open_cursor`). Every store write
//! of the cursor info (a new cursor's record, `mark_delete_with_ranges`,
//! `reset`, `persist_deletion_state`) also records a `crate::trace::deletion`
//! `Persist` line: what a recovered `CursorDeletionState` must equal
//! (`RecoveredAsPersisted` in `specs/TraceDeletionLookup.tla`).
//!
//! | spec | invariant | functions | tests |
//! |---|---|---|---|
//! | `LedgerCursor` | `ReadAfterMarkDelete` | [`ManagedCursor::mark_delete_with_ranges`], [`ManagedCursor::rewind`] | `mark_delete_rewind_and_reset`, `cursor_matches_reference_model` |
//! | `LedgerCursor` | `RewindLandsOnNext` | [`ManagedCursor::rewind`], `next_valid_position` | `mark_delete_rewind_and_reset`, `cursor_matches_reference_model` |
//! | `LedgerCursor` | `MarkDeleteConfirmed`, `MarkDeleteMonotone` | [`ManagedCursor::mark_delete_with_ranges`] | `mark_delete_rejects_invalid_positions_and_ranges`, `cursor_matches_reference_model` |
//!
//! `mark_delete_with_ranges` pushes the read position past the mark-delete
//! and refuses a backward or unconfirmed one (`MarkDeleteBackward`,
//! `BeyondLastConfirmed`); `rewind` lands on
//! `next_valid_position(mark_delete)`. The spec's `Read(k)` action, which
//! returns `read..min(read+k-1, lce)`, is [`ManagedCursor::read_entries`]
//! (`tests/ledger.rs`; each trace `Read` line carries the new read
//! position). Trace validation (`.ci/check trace`) covers every row on the
//! model test's 60 cases; `tests/trace_mutants/ledger_cursor_rewind_to_mark_delete.patch`
//! is rejected at `Rewind`.

use std::collections::BTreeMap;

use super::error::LedgerError;
use super::faults::ReadRequest;
use super::managed_ledger::{Entry, ManagedLedger};
use super::store::StoredLedgerInfo;
use crate::deletion::{compact, CursorDeletionState};
use crate::position::Position;
use crate::sync::Mutex;
// `Arc<ManagedLedger>` is an ownership handle: std's Arc in every build.
use std::sync::Arc;

/// What [`ManagedCursor::persist_deletion_state`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PersistedDeletionState {
    /// The persisted mark-delete position.
    pub mark_delete: Position,
    /// Individually deleted entries persisted (entries, not ranges).
    pub deleted_entries: u64,
    /// Partially acknowledged batch entries persisted.
    pub batch_entries: usize,
    /// Size of the compact form in bytes.
    pub bytes: usize,
    /// Number of store rows (chunks) it occupies.
    pub chunks: usize,
}

/// What [`ManagedCursor::read_entries_with_skip_runs`] asks before reading.
pub trait ReadSkip {
    /// Whether `(ledger_id, entry_id)` may be skipped without reading it.
    fn skip(&mut self, ledger_id: i64, entry_id: i64) -> bool;
    /// Asked after [`skip`](Self::skip) answered `true` for `entry_id`: the
    /// last entry id (≥ `entry_id`) of the run of `ledger_id`'s entries
    /// starting there that may all be skipped, if known (`i64::MAX`: the
    /// rest of the ledger). `None` (the default): one entry at a time.
    fn skipped_run_end(&mut self, ledger_id: i64, entry_id: i64) -> Option<i64> {
        let _ = (ledger_id, entry_id);
        None
    }
}

/// A plain predicate as a [`ReadSkip`] (no run ends).
struct SkipFn<F>(F);

impl<F: FnMut(i64, i64) -> bool> ReadSkip for SkipFn<F> {
    fn skip(&mut self, ledger_id: i64, entry_id: i64) -> bool {
        (self.0)(ledger_id, entry_id)
    }
}

#[derive(Debug)]
pub(super) struct CursorState {
    pub(super) read_position: Position,
    pub(super) mark_delete: Position,
    pub(super) individually_deleted: Vec<(Position, Position)>,
    pub(super) closed: bool,
    /// Non-blocking persists queued and not yet durable (`nonblocking.rs`).
    pub(super) in_flight: super::nonblocking::PersistsInFlight,
}

/// A cursor over a [`ManagedLedger`]: a read position that moves forward as
/// entries are read, a persisted mark-delete position (every entry `<=` it is
/// acknowledged) and persisted properties. All methods may be called from any
/// thread; each takes the cursor's lock for its duration.
pub struct ManagedCursor {
    pub(super) ledger: Arc<ManagedLedger>,
    pub(super) name: String,
    /// Shared with the completions of non-blocking persists.
    pub(super) state: Arc<Mutex<CursorState>>,
    /// Serialises non-blocking persists from their checks to their
    /// submission (held without `state`, which their completion takes).
    pub(super) submit_order: Mutex<()>,
    /// `false` for a non-durable cursor (Pulsar's `NonDurableCursorImpl`,
    /// a reader's): its positions live in memory only and no call writes
    /// to the store.
    pub(super) durable: bool,
}

impl std::fmt::Debug for ManagedCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("ManagedCursor")
            .field("ledger", &self.ledger.name)
            .field("name", &self.name)
            .field("read_position", &s.read_position)
            .field("mark_delete", &s.mark_delete)
            .finish()
    }
}

impl ManagedCursor {
    /// A cursor of `ledger` recovered (or created) at `mark_delete`, reading
    /// from `read_position`; called by [`ManagedLedger::open_cursor`].
    pub(super) fn new(
        ledger: Arc<ManagedLedger>,
        name: String,
        read_position: Position,
        mark_delete: Position,
        individually_deleted: Vec<(Position, Position)>,
    ) -> Self {
        Self {
            ledger,
            name,
            state: Arc::new(Mutex::new(CursorState {
                read_position,
                mark_delete,
                individually_deleted,
                closed: false,
                in_flight: Default::default(),
            })),
            submit_order: Mutex::new(()),
            durable: true,
        }
    }

    /// A non-durable cursor of `ledger` at `mark_delete` (Pulsar's
    /// `NonDurableCursorImpl`): nothing about it is ever written to the
    /// store, so it holds no ledger against trimming and is gone after a
    /// restart; called by [`ManagedLedger::open_non_durable_cursor`].
    pub(super) fn non_durable(
        ledger: Arc<ManagedLedger>,
        name: String,
        mark_delete: Position,
    ) -> Self {
        let read_position = ledger.next_valid_position(mark_delete);
        Self {
            ledger,
            name,
            state: Arc::new(Mutex::new(CursorState {
                read_position,
                mark_delete,
                individually_deleted: Vec::new(),
                closed: false,
                in_flight: Default::default(),
            })),
            submit_order: Mutex::new(()),
            durable: false,
        }
    }

    /// Whether the cursor persists its positions (a subscription's); `false`
    /// for a reader's non-durable cursor.
    pub fn is_durable(&self) -> bool {
        self.durable
    }

    /// The cursor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The managed ledger it reads.
    pub fn ledger(&self) -> &Arc<ManagedLedger> {
        &self.ledger
    }

    /// The next position a read starts from.
    pub fn read_position(&self) -> Position {
        self.state.lock().read_position
    }

    /// The mark-delete position.
    pub fn mark_delete_position(&self) -> Position {
        self.state.lock().mark_delete
    }

    /// The individually deleted ranges persisted with the last mark-delete
    /// by [`ManagedCursor::mark_delete_with_ranges`] (empty after
    /// [`ManagedCursor::persist_deletion_state`], whose state is read back
    /// with [`ManagedCursor::recover_deletion_state`]).
    pub fn individually_deleted_ranges(&self) -> Vec<(Position, Position)> {
        self.state.lock().individually_deleted.clone()
    }

    /// Whether an entry exists at or after the read position.
    pub fn has_more_entries(&self) -> bool {
        let read = self.state.lock().read_position;
        read <= self.ledger.last_confirmed_entry()
    }

    /// Number of entries from the read position to the last confirmed entry.
    pub fn number_of_entries_to_read(&self) -> i64 {
        let read = self.state.lock().read_position;
        self.ledger.entries_after(read.previous_in_ledger())
    }

    /// Reads up to `max_entries` entries from the read position and advances
    /// the read position past them. Returns an empty vector when there is
    /// nothing to read.
    ///
    /// Order of checks, as in Pulsar: closed cursor → fenced ledger →
    /// injected fault → data. A ledger whose data is lost fails with
    /// [`LedgerError::LedgerNotExist`] (read position unchanged) unless
    /// auto-skip is on, in which case the read moves on to the next ledger; if
    /// entries were already collected before reaching the lost ledger they are
    /// returned and the failure surfaces on the next read.
    ///
    /// # Errors
    /// [`LedgerError::CursorAlreadyClosed`], [`LedgerError::Fenced`], any
    /// injected [`ReadFailureKind`](super::ReadFailureKind), [`LedgerError::LedgerNotExist`],
    /// [`LedgerError::InvalidArgument`] for `max_entries == 0`,
    /// [`LedgerError::Store`]. On error the read position is unchanged.
    ///
    /// Any `max_entries >= 1` is valid; a huge one (up to `usize::MAX`) reads
    /// everything available.
    pub fn read_entries(&self, max_entries: usize) -> Result<Vec<Entry>, LedgerError> {
        if max_entries == 0 {
            return Err(LedgerError::InvalidArgument(
                "read_entries needs max_entries >= 1".into(),
            ));
        }
        let mut cursor = self.lock_readable(max_entries)?;
        let mut out: Vec<Entry> = Vec::new();
        let (start, ledgers): (Position, Vec<(i64, StoredLedgerInfo)>) = {
            let state = self.ledger.state.lock();
            let start = state.first_valid_at_or_after(cursor.read_position);
            let ledgers = state
                .ledgers
                .range(start.ledger_id..)
                .map(|(k, v)| (*k, *v))
                .collect();
            (start, ledgers)
        };
        // Last position of the last lost ledger skipped with auto-skip on.
        let mut skipped_to: Option<Position> = None;
        // A read that skipped a lost ledger is recorded as the spec's steps
        // in order: `SkipTo` past each lost ledger, `ReadRun` per run.
        let mut steps = crate::trace::ledger_cursor::ReadSteps::new();
        for (id, info) in ledgers {
            if out.len() >= max_entries {
                break;
            }
            let first = if id == start.ledger_id {
                start.entry_id.max(0)
            } else {
                0
            };
            if first >= info.entries {
                continue;
            }
            if info.lost {
                if self.ledger.config.auto_skip_non_recoverable_data {
                    skipped_to = Some(Position::new(id, info.entries - 1));
                    steps.skipped(Position::new(id, info.entries - 1));
                    continue;
                }
                if out.is_empty() {
                    return Err(LedgerError::LedgerNotExist { ledger_id: id });
                }
                break;
            }
            // Saturating: a `max_entries` beyond i64 means "all available".
            let want = i64::try_from(max_entries - out.len()).unwrap_or(i64::MAX);
            // want >= 1 (out.len() < max_entries), so `want - 1` cannot wrap.
            let last = first.saturating_add(want - 1).min(info.entries - 1);
            let rows = self.ledger.store.read(&self.ledger.name, id, first, last)?;
            if rows.len() as i64 != last - first + 1 {
                if out.is_empty() {
                    return Err(LedgerError::NonRecoverableData {
                        position: Position::new(id, first),
                    });
                }
                break;
            }
            steps.returned(Position::new(id, first), Position::new(id, last));
            out.extend(rows.into_iter().map(|(e, data)| Entry {
                position: Position::new(id, e),
                data,
            }));
        }
        if let Some(last) = out.last() {
            cursor.read_position = self.ledger.next_valid_position(last.position);
        } else if let Some(skipped) = skipped_to {
            cursor.read_position = self.ledger.next_valid_position(skipped);
        }
        let (ml, cur, returned) = (&self.ledger.name, &self.name, !out.is_empty());
        let next_valid = |p| self.ledger.next_valid_position(p);
        steps.record(
            ml,
            cur,
            max_entries,
            (skipped_to.is_some(), returned),
            cursor.read_position,
            next_valid,
        );
        Ok(out)
    }

    /// The checks every read makes first, in Pulsar's order: closed cursor,
    /// fenced ledger, injected fault; returns the cursor lock for the read.
    ///
    /// The [`ReadFaults`] policy is user code: it runs with NO lock held (the
    /// cursor lock is released around it and taken again afterwards), so it
    /// may call back into this cursor or the ledger. The closed check is
    /// repeated once the lock is re-taken, as the cursor may have been closed
    /// while the policy ran.
    fn lock_readable(
        &self,
        max_entries: usize,
    ) -> Result<crate::sync::MutexGuard<'_, CursorState>, LedgerError> {
        let from = self.live()?.read_position;
        if self.ledger.is_fenced() {
            return Err(LedgerError::Fenced {
                ledger: self.ledger.name.clone(),
            });
        }
        let req = ReadRequest {
            ledger: &self.ledger.name,
            cursor: &self.name,
            from,
            max_entries,
        };
        if let Some(kind) = self.ledger.faults.next(&req) {
            return Err(self.ledger.fault_error(kind, from, &self.name));
        }
        self.live()
    }

    /// Reads like [`ManagedCursor::read_entries`] but skips positions for
    /// which `skip(ledger_id, entry_id)` is true without reading them
    /// (Pulsar's `readEntriesWithSkip`, used with the lock-free deletion
    /// hint). Within the window `[read, read + max_entries - 1]` (saturating:
    /// a huge `max_entries` is the rest of the ledger) of the current ledger
    /// it reads only the first contiguous run of non-skipped entries; a
    /// window that is entirely skipped moves the read position past it and
    /// the scan continues with the next window. Returns an empty vector
    /// when everything up to the last confirmed entry is skipped or read.
    ///
    /// `skip` is called with this cursor's lock held: it must not call back
    /// into this cursor. A `true` from `skip` means the entry is never read by
    /// this call, so a stale "deleted" answer loses the entry for this pass
    /// (see `cursor::is_deleted_for_read_scheduling` for the contract).
    ///
    /// # Errors
    /// As [`ManagedCursor::read_entries`]. On error the read position keeps
    /// only the progress over windows that were skipped entirely before the
    /// failure (entries `skip` declared deleted), never past an unread entry.
    pub fn read_entries_with_skip(
        &self,
        max_entries: usize,
        skip: impl FnMut(i64, i64) -> bool,
    ) -> Result<Vec<Entry>, LedgerError> {
        self.read_entries_with_skip_runs(max_entries, &mut SkipFn(skip))
    }

    /// As [`ManagedCursor::read_entries_with_skip`], with a [`ReadSkip`]
    /// that may also report where a skipped run ends: after `skip` answers
    /// `true` for entry `e`, [`ReadSkip::skipped_run_end`] is asked once and
    /// the scan jumps past the run it reports (a hop to the end of the
    /// containing deleted range), so a window behind a long
    /// deleted run costs one `skip` and one run query per run instead of
    /// one `skip` per entry. A run that ends beyond the window moves the
    /// read position past the whole run. With
    /// [`SkipDeleted`](crate::deletion::SkipDeleted) the work per call is
    /// O(deleted runs crossed + entries read), each run query a short
    /// deletion-state read lock (never held across the walk).
    ///
    /// # Errors
    /// As [`ManagedCursor::read_entries_with_skip`].
    pub fn read_entries_with_skip_runs(
        &self,
        max_entries: usize,
        skip: &mut dyn ReadSkip,
    ) -> Result<Vec<Entry>, LedgerError> {
        if max_entries == 0 {
            return Err(LedgerError::InvalidArgument(
                "read_entries_with_skip needs max_entries >= 1".into(),
            ));
        }
        let mut cursor = self.lock_readable(max_entries)?;
        let mut pos = cursor.read_position;
        loop {
            let (start, info) = {
                let state = self.ledger.state.lock();
                let start = state.first_valid_at_or_after(pos);
                (start, state.ledgers.get(&start.ledger_id).copied())
            };
            let Some(info) = info.filter(|i| start.entry_id >= 0 && start.entry_id < i.entries)
            else {
                // Past the last confirmed entry.
                crate::trace::ledger_cursor::skip_to_end(
                    &self.ledger.name,
                    &self.name,
                    cursor.read_position,
                    start,
                );
                cursor.read_position = start;
                return Ok(Vec::new());
            };
            // Saturating: a `max_entries` beyond i64 means "all available";
            // max_entries >= 1, so `window - 1` cannot wrap.
            let window = i64::try_from(max_entries).unwrap_or(i64::MAX);
            let window_end = start
                .entry_id
                .saturating_add(window - 1)
                .min(info.entries - 1);
            // The first entry of the window `skip` keeps, hopping over each
            // skipped run as far as `skipped_run_end` reports it.
            let mut e = start.entry_id;
            let mut skipped_through = window_end;
            let run_start = loop {
                if e > window_end {
                    break None;
                }
                if !skip.skip(start.ledger_id, e) {
                    break Some(e);
                }
                // Clamped to the ledger, so `end + 1` cannot overflow.
                let end = skip
                    .skipped_run_end(start.ledger_id, e)
                    .unwrap_or(e)
                    .clamp(e, info.entries - 1);
                skipped_through = skipped_through.max(end);
                e = end + 1;
            };
            let Some(run_start) = run_start else {
                pos = self
                    .ledger
                    .next_valid_position(Position::new(start.ledger_id, skipped_through));
                cursor.read_position = pos;
                crate::trace::ledger_cursor::skip_to(&self.ledger.name, &self.name, pos);
                continue;
            };
            // `run_start` was already asked; the run goes on from the next entry.
            let run_end = (run_start + 1..=window_end)
                .take_while(|e| !skip.skip(start.ledger_id, *e))
                .last()
                .unwrap_or(run_start);
            if info.lost {
                if self.ledger.config.auto_skip_non_recoverable_data {
                    pos = self
                        .ledger
                        .next_valid_position(Position::new(start.ledger_id, info.entries - 1));
                    cursor.read_position = pos;
                    crate::trace::ledger_cursor::skip_to(&self.ledger.name, &self.name, pos);
                    continue;
                }
                return Err(LedgerError::LedgerNotExist {
                    ledger_id: start.ledger_id,
                });
            }
            let rows =
                self.ledger
                    .store
                    .read(&self.ledger.name, start.ledger_id, run_start, run_end)?;
            if rows.len() as i64 != run_end - run_start + 1 {
                return Err(LedgerError::NonRecoverableData {
                    position: Position::new(start.ledger_id, run_start),
                });
            }
            cursor.read_position = self
                .ledger
                .next_valid_position(Position::new(start.ledger_id, run_end));
            crate::trace::ledger_cursor::read_run(
                &self.ledger.name,
                &self.name,
                Position::new(start.ledger_id, run_start),
                Position::new(start.ledger_id, run_end),
                cursor.read_position,
            );
            return Ok(rows
                .into_iter()
                .map(|(e, data)| Entry {
                    position: Position::new(start.ledger_id, e),
                    data,
                })
                .collect());
        }
    }

    /// Persists `state` (mark-delete, every individually deleted entry and
    /// batch ack set) together with `property_updates` (`Some` sets,
    /// `None` removes) in ONE atomic store write, in the crate's compact
    /// form ([`crate::deletion::compact`], chunks of
    /// [`DEFAULT_CHUNK_BYTES`](crate::deletion::compact::DEFAULT_CHUNK_BYTES)):
    /// exact at any number of ranges (no Pulsar-style cap). The snapshot is
    /// taken under the state's read lock, so a grouped ack is wholly in it
    /// or not. Replaces the legacy range record; afterwards
    /// [`ManagedCursor::individually_deleted_ranges`] is empty and the
    /// state is read back with [`ManagedCursor::recover_deletion_state`].
    /// Moves the read position past mark-delete if it fell behind.
    ///
    /// Pulsar's counterpart: `ManagedCursorImpl.persistPositionToLedger`
    /// (mark-delete + `individualDeletedMessages` +
    /// `batchedEntryDeletionIndexInfo` + properties in one `PositionInfo`).
    ///
    /// # Errors
    /// [`LedgerError::CursorAlreadyClosed`]; [`LedgerError::MarkDeleteBackward`]
    /// if the state's mark-delete is below the persisted one (after a
    /// [`CursorDeletionState::reset`] call [`ManagedCursor::reset`] first);
    /// [`LedgerError::InvalidPosition`] for a mark-delete the ledger does not
    /// hold; [`LedgerError::InvalidDeletedRange`] for a deleted entry or
    /// batch position in a ledger it lacks or past its end;
    /// [`LedgerError::Store`]. On error nothing is written.
    ///
    /// # Blocking
    /// Yes: one store commit on the calling thread (with a
    /// [`RedbStore`](super::RedbStore) in `SyncMode::Immediate`, an fsync),
    /// under the cursor's lock; behind queued non-blocking persists of this
    /// cursor it waits for them too. The non-blocking form is
    /// [`ManagedCursor::persist_deletion_state_async`].
    pub fn persist_deletion_state(
        &self,
        state: &CursorDeletionState,
        property_updates: &[(&str, Option<i64>)],
    ) -> Result<PersistedDeletionState, LedgerError> {
        self.persist_deletion_state_chunked(state, property_updates, compact::DEFAULT_CHUNK_BYTES)
    }

    /// As [`ManagedCursor::persist_deletion_state`] with chunks of at most
    /// `chunk_bytes` bytes (≥ 1).
    ///
    /// # Errors
    /// As [`ManagedCursor::persist_deletion_state`].
    ///
    /// # Blocking
    /// As [`ManagedCursor::persist_deletion_state`].
    pub fn persist_deletion_state_chunked(
        &self,
        state: &CursorDeletionState,
        property_updates: &[(&str, Option<i64>)],
        chunk_bytes: usize,
    ) -> Result<PersistedDeletionState, LedgerError> {
        self.persist_state(state, property_updates, chunk_bytes, false)
    }

    /// Persists `state` after a [`CursorDeletionState::reset`] (a seek):
    /// as [`ManagedCursor::persist_deletion_state`], in ONE atomic store
    /// write, but the mark-delete may move backward or forward, and the
    /// read position becomes the first entry after it (Pulsar's
    /// `internalResetCursor`: the reset mark-delete, its cleared ranges and
    /// the reset position's ack set persisted together). A crash shows the
    /// previous state or the reset one, never a mix.
    ///
    /// # Errors
    /// As [`ManagedCursor::persist_deletion_state`] without
    /// `MarkDeleteBackward`. On error nothing is written and the cursor is
    /// unchanged.
    ///
    /// # Blocking
    /// As [`ManagedCursor::persist_deletion_state`]: one store commit on the
    /// calling thread (none for a non-durable cursor), under the cursor's lock.
    pub fn persist_reset_deletion_state(
        &self,
        state: &CursorDeletionState,
    ) -> Result<PersistedDeletionState, LedgerError> {
        self.persist_state(state, &[], compact::DEFAULT_CHUNK_BYTES, true)
    }

    fn persist_state(
        &self,
        state: &CursorDeletionState,
        property_updates: &[(&str, Option<i64>)],
        chunk_bytes: usize,
        reset: bool,
    ) -> Result<PersistedDeletionState, LedgerError> {
        let mut snapshot = state.snapshot();
        let mut cursor = self.live()?;
        if cursor.in_flight.count > 0 {
            // Non-blocking persists are queued: this one goes behind them
            // through the store writer, so the store sees them in order.
            drop(cursor);
            let props = property_updates
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect();
            return self
                .persist_snapshot_queued(snapshot, props, chunk_bytes, reset)
                .wait();
        }
        let md = snapshot.mark_delete;
        self.check_deletion_snapshot(&snapshot, cursor.mark_delete, reset)?;
        let chunks = compact::encode_in_place(&mut snapshot, chunk_bytes);
        if self.durable {
            self.ledger.store.save_deletion_state(
                &self.ledger.name,
                &self.name,
                md,
                &chunks,
                property_updates,
            )?;
        }
        crate::trace::deletion::persist(&self.ledger.name, &self.name, md, snapshot.ranges());
        cursor.mark_delete = md;
        cursor.individually_deleted.clear();
        if reset {
            cursor.read_position = self.ledger.next_valid_position(md);
            crate::trace::ledger_cursor::reset(
                &self.ledger.name,
                &self.name,
                md,
                cursor.read_position,
            );
        } else if cursor.read_position <= md {
            cursor.read_position = self.ledger.next_valid_position(md);
        }
        let (ml, cur) = (&self.ledger.name, &self.name);
        crate::trace::ledger_cursor::mark_delete(ml, cur, md, cursor.read_position);
        Ok(PersistedDeletionState {
            mark_delete: md,
            deleted_entries: snapshot.deleted_entries(),
            batch_entries: snapshot.batch_ack_sets.len(),
            bytes: chunks.iter().map(Vec::len).sum(),
            chunks: chunks.len(),
        })
    }

    /// Checks a deletion-state snapshot against the ledger before it is
    /// persisted over mark-delete `floor` (see
    /// [`ManagedCursor::persist_deletion_state`]'s errors; a `reset` may
    /// go below `floor`).
    pub(super) fn check_deletion_snapshot(
        &self,
        snapshot: &crate::deletion::DeletionSnapshot,
        floor: Position,
        reset: bool,
    ) -> Result<(), LedgerError> {
        let md = snapshot.mark_delete;
        if md < floor && !reset {
            return Err(LedgerError::MarkDeleteBackward {
                current: floor,
                requested: md,
            });
        }
        {
            let ledger_state = self.ledger.state.lock();
            ledger_state.check_mark_delete_position(md)?;
            for (l, bits) in &snapshot.ledgers {
                let (Some(min), Some(max)) = (bits.min(), bits.max()) else {
                    continue;
                };
                let entries = ledger_state.ledgers.get(l).map_or(0, |i| i.entries);
                if i64::from(max) >= entries {
                    return Err(LedgerError::InvalidDeletedRange {
                        lower: Position::new(*l, i64::from(min) - 1),
                        upper: Position::new(*l, i64::from(max)),
                        reason: format!("ledger {l} holds {entries} entries"),
                    });
                }
            }
            for p in snapshot.batch_ack_sets.keys() {
                let entries = ledger_state
                    .ledgers
                    .get(&p.ledger_id)
                    .map_or(0, |i| i.entries);
                if p.entry_id >= entries {
                    return Err(LedgerError::InvalidDeletedRange {
                        lower: p.previous_in_ledger(),
                        upper: *p,
                        reason: format!(
                            "batch position beyond ledger {} ({entries} entries)",
                            p.ledger_id
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The persisted deletion state as a live [`CursorDeletionState`]
    /// (directory published, epoch 0): the compact state written by
    /// [`ManagedCursor::persist_deletion_state`] if the last persisted
    /// mark-delete came with it, else the mark-delete and ranges of
    /// [`ManagedCursor::mark_delete_with_ranges`] (Pulsar's cursor recovery).
    ///
    /// # Errors
    /// [`LedgerError::Store`] (a damaged compact state, or one whose
    /// mark-delete disagrees with the cursor record, is
    /// [`StoreError::Corrupt`](super::StoreError::Corrupt)).
    pub fn recover_deletion_state(&self) -> Result<CursorDeletionState, LedgerError> {
        let md = self.state.lock().mark_delete;
        let corrupt = |what: String| {
            LedgerError::Store(super::StoreError::Corrupt(format!(
                "cursor {} of {}: {what}",
                self.name, self.ledger.name
            )))
        };
        let state = match self
            .ledger
            .store
            .load_deletion_state(&self.ledger.name, &self.name)?
        {
            Some(chunks) => {
                let snapshot = compact::decode(&chunks).map_err(|e| corrupt(e.to_string()))?;
                if snapshot.mark_delete != md {
                    return Err(corrupt(format!(
                        "compact deletion state has mark-delete {}, the cursor record {md}",
                        snapshot.mark_delete
                    )));
                }
                CursorDeletionState::from_snapshot(snapshot).map_err(|e| corrupt(e.to_string()))
            }
            None => {
                let ranges = self.state.lock().individually_deleted.clone();
                CursorDeletionState::recover(md, &ranges).map_err(|e| corrupt(e.to_string()))
            }
        }?;
        crate::trace::deletion::cursor(&state, &self.ledger.name, &self.name);
        Ok(state)
    }

    pub(super) fn closed_error(&self) -> LedgerError {
        LedgerError::CursorAlreadyClosed {
            ledger: self.ledger.name.clone(),
            cursor: self.name.clone(),
        }
    }

    /// Moves the read position back to the first entry after the mark-delete
    /// position (Pulsar's `rewind()`).
    pub fn rewind(&self) {
        let mut cursor = self.state.lock();
        cursor.read_position = self.ledger.next_valid_position(cursor.mark_delete);
        crate::trace::ledger_cursor::rewind(&self.ledger.name, &self.name, cursor.read_position);
    }

    /// Persists a new mark-delete position (and no individually deleted
    /// ranges). Moves the read position forward if it fell behind.
    ///
    /// `position` must be an entry of the managed ledger, or `(L, -1)` ("just
    /// before the first entry of ledger `L`") for a ledger `L` it has.
    ///
    /// # Errors
    /// [`LedgerError::MarkDeleteBackward`] if `position` is below the current
    /// mark-delete; [`LedgerError::BeyondLastConfirmed`] past the last entry
    /// (in position order, so `(1000, -1)` is beyond `(1, 2)` unless ledger
    /// 1000 exists); [`LedgerError::InvalidPosition`] for an entry id below
    /// -1, a position past the end of its ledger or in a ledger that does not
    /// exist; [`LedgerError::CursorAlreadyClosed`]; [`LedgerError::Store`].
    /// On error nothing changes.
    ///
    /// # Blocking
    /// Yes: one store commit on the calling thread, under the cursor's lock
    /// (behind queued non-blocking persists, it waits for them too). The
    /// non-blocking form is [`ManagedCursor::mark_delete_async`].
    pub fn mark_delete(&self, position: Position) -> Result<(), LedgerError> {
        self.mark_delete_with_ranges(position, Vec::new())
    }

    /// As [`ManagedCursor::mark_delete`], also persisting the individually
    /// deleted ranges above it (open-closed `(lower, upper]`, ascending) in the
    /// same atomic write. Every range must be non-empty, start at or above
    /// `position` (lower entry id `>= -1`), end at an existing entry (so not
    /// beyond the last confirmed one), and not overlap the previous range
    /// (adjacent ranges are accepted).
    ///
    /// # Errors
    /// As [`ManagedCursor::mark_delete`], plus
    /// [`LedgerError::InvalidDeletedRange`] for the first range that breaks
    /// the rules above. On error nothing changes.
    ///
    /// # Blocking
    /// As [`ManagedCursor::mark_delete`].
    pub fn mark_delete_with_ranges(
        &self,
        position: Position,
        individually_deleted: Vec<(Position, Position)>,
    ) -> Result<(), LedgerError> {
        let mut cursor = self.state.lock();
        if cursor.closed {
            return Err(self.closed_error());
        }
        if cursor.in_flight.count > 0 {
            // Behind the queued non-blocking persists, in order.
            drop(cursor);
            return self
                .mark_delete_with_ranges_queued(position, individually_deleted)
                .wait();
        }
        if position < cursor.mark_delete {
            return Err(LedgerError::MarkDeleteBackward {
                current: cursor.mark_delete,
                requested: position,
            });
        }
        {
            let state = self.ledger.state.lock();
            state.check_mark_delete_position(position)?;
            state.check_deleted_ranges(position, &individually_deleted)?;
        }
        if self.durable {
            self.ledger.store.save_mark_delete(
                &self.ledger.name,
                &self.name,
                position,
                &individually_deleted,
            )?;
        }
        let (ml, cur, ranges) = (&self.ledger.name, &self.name, individually_deleted.iter());
        crate::trace::deletion::persist(ml, cur, position, ranges.copied());
        cursor.mark_delete = position;
        cursor.individually_deleted = individually_deleted;
        if cursor.read_position <= position {
            cursor.read_position = self.ledger.next_valid_position(position);
        }
        crate::trace::ledger_cursor::mark_delete(
            &self.ledger.name,
            &self.name,
            position,
            cursor.read_position,
        );
        Ok(())
    }

    /// Resets the cursor so that the next read starts at `new_read_position`
    /// (Pulsar's `resetCursor`): the mark-delete becomes the position just
    /// before it and may move backward or forward; individually deleted
    /// ranges are cleared. Any position is accepted: one that holds no entry
    /// moves to the next one that does (an entry id past the end of its
    /// ledger, up to `i64::MAX`, moves to the next ledger), or past the last
    /// confirmed entry when there is none.
    ///
    /// # Errors
    /// [`LedgerError::CursorAlreadyClosed`]; [`LedgerError::Store`] (nothing
    /// changes).
    ///
    /// # Blocking
    /// Yes: one store commit on the calling thread, under the cursor's lock
    /// (behind queued non-blocking persists, it waits for them too).
    pub fn reset(&self, new_read_position: Position) -> Result<(), LedgerError> {
        let mut cursor = self.state.lock();
        if cursor.closed {
            return Err(self.closed_error());
        }
        let read = {
            let state = self.ledger.state.lock();
            state.first_valid_at_or_after(new_read_position)
        };
        let md = read.previous_in_ledger();
        if cursor.in_flight.count > 0 {
            // Behind the queued non-blocking persists, in order.
            drop(cursor);
            self.reset_queued(md, read).wait()?;
            crate::trace::ledger_cursor::reset(&self.ledger.name, &self.name, md, read);
            return Ok(());
        }
        if self.durable {
            self.ledger
                .store
                .save_mark_delete(&self.ledger.name, &self.name, md, &[])?;
        }
        crate::trace::deletion::persist(&self.ledger.name, &self.name, md, []);
        cursor.mark_delete = md;
        cursor.individually_deleted.clear();
        cursor.read_position = read;
        crate::trace::ledger_cursor::reset(&self.ledger.name, &self.name, md, read);
        Ok(())
    }

    /// The cursor's persisted properties (string → i64), read from the store.
    ///
    /// # Errors
    /// [`LedgerError::Store`].
    pub fn properties(&self) -> Result<BTreeMap<String, i64>, LedgerError> {
        if !self.durable {
            return Ok(BTreeMap::new());
        }
        Ok(self
            .ledger
            .store
            .load_cursor(&self.ledger.name, &self.name)?
            .map(|c| c.properties)
            .unwrap_or_default())
    }

    /// Sets one property durably.
    ///
    /// # Errors
    /// [`LedgerError::CursorAlreadyClosed`]; [`LedgerError::Store`].
    ///
    /// # Blocking
    /// Yes: one store commit on the calling thread (an fsync on a
    /// [`RedbStore`](super::RedbStore) in `SyncMode::Immediate`), under the
    /// cursor's lock.
    pub fn set_property(&self, key: &str, value: i64) -> Result<(), LedgerError> {
        let _cursor = self.live()?;
        if !self.durable {
            return Ok(());
        }
        self.ledger
            .store
            .set_cursor_property(&self.ledger.name, &self.name, key, Some(value))?;
        Ok(())
    }

    /// Removes one property durably (no error if absent).
    ///
    /// # Errors
    /// [`LedgerError::CursorAlreadyClosed`]; [`LedgerError::Store`].
    ///
    /// # Blocking
    /// As [`ManagedCursor::set_property`].
    pub fn remove_property(&self, key: &str) -> Result<(), LedgerError> {
        let _cursor = self.live()?;
        if !self.durable {
            return Ok(());
        }
        self.ledger
            .store
            .set_cursor_property(&self.ledger.name, &self.name, key, None)?;
        Ok(())
    }

    pub(super) fn live(&self) -> Result<crate::sync::MutexGuard<'_, CursorState>, LedgerError> {
        let cursor = self.state.lock();
        if cursor.closed {
            return Err(self.closed_error());
        }
        Ok(cursor)
    }

    /// Closes the cursor: every later read, mark-delete or property change
    /// fails with [`LedgerError::CursorAlreadyClosed`]. Idempotent.
    pub fn close(&self) {
        self.state.lock().closed = true;
    }

    /// Whether [`ManagedCursor::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.state.lock().closed
    }
}
