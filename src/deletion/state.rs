//! [`CursorDeletionState`]: mark-delete + individually deleted ranges under one
//! cursor lock, with the lock-free read-scheduling hint.

use std::collections::BTreeMap;

use crate::position::Position;
use crate::sync::hook::{self, Point};
use crate::sync::{fence, AtomicU64, CachePadded, Ordering, Published, RwLock};
use crate::trace::deletion as trace;

/// `packed` value meaning "mark-delete does not pack; read `full`".
const UNPACKABLE: u64 = u64::MAX;

/// Order-preserving packing of a position into one u64:
/// `ledger_id << 32 | (entry_id + 1)`, for `ledger_id` in `0..2^31` and
/// `entry_id` in `-1..u32::MAX` (so never [`UNPACKABLE`]).
fn pack(p: Position) -> Option<u64> {
    let ledger = u64::try_from(p.ledger_id)
        .ok()
        .filter(|l| *l < 0x8000_0000)?; // 2^31
    let entry = u64::try_from(p.entry_id.checked_add(1)?)
        .ok()
        .filter(|e| *e <= u64::from(u32::MAX))?;
    Some((ledger << 32) | entry)
}

fn unpack(x: u64) -> Position {
    Position::new((x >> 32) as i64, (x & 0xffff_ffff) as i64 - 1)
}

/// A mark-delete snapshot as a lock-free lookup read it (one atomic step,
/// [`PublishedMarkDelete::load`]): the packed word, or [`UNPACKABLE`] and
/// the position itself.
#[derive(Debug, Clone, Copy)]
struct MarkDeleteSeen {
    packed: u64,
    /// The position when `packed` is [`UNPACKABLE`] (unused otherwise).
    full: Position,
}

impl MarkDeleteSeen {
    #[inline(always)]
    fn packed(x: u64) -> Self {
        Self {
            packed: x,
            full: Position::EARLIEST,
        }
    }

    #[inline(always)]
    fn unpackable(md: Position) -> Self {
        Self {
            packed: UNPACKABLE,
            full: md,
        }
    }

    #[inline(always)]
    fn position(self) -> Position {
        if self.packed != UNPACKABLE {
            unpack(self.packed)
        } else {
            self.full
        }
    }

    /// Whether `(ledger_id, entry_id)` is at or below this mark-delete. A
    /// query whose ids both lie in `0..2^32` is compared as one u64 key,
    /// `ledger_id << 32 | entry_id`, against the packed word
    /// `L << 32 | (E + 1)`: lexicographic order of the halves, and
    /// `entry_id <= E` iff `entry_id < E + 1` (the packed halves are below
    /// 2^31 and 2^32). Every other query (negative or wider ids) and an
    /// unpackable mark-delete take `Position`'s order.
    #[inline(always)]
    fn covers(self, ledger_id: i64, entry_id: i64) -> bool {
        if self.packed != UNPACKABLE && (ledger_id as u64 | entry_id as u64) >> 32 == 0 {
            ((ledger_id as u64) << 32 | entry_id as u64) < self.packed
        } else {
            Position::new(ledger_id, entry_id) <= self.position()
        }
    }
}

impl From<Position> for MarkDeleteSeen {
    fn from(md: Position) -> Self {
        match pack(md) {
            Some(x) => Self::packed(x),
            None => Self::unpackable(md),
        }
    }
}

/// `(ledger_id, entry_id) <= md` as the lookup computes it, for a
/// mark-delete read as published (packed if it packs).
#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
pub(super) fn hint_covers_for_test(md: Position, ledger_id: i64, entry_id: i64) -> bool {
    let seen = MarkDeleteSeen::from(md);
    assert_eq!(seen.position(), md, "the snapshot reads back as {md}");
    seen.covers(ledger_id, entry_id)
}

/// Mark-delete published for lock-free readers as ONE atomic snapshot:
/// normally a single `AtomicU64` holding the packed position (one load);
/// for a position that does not pack (ledger id ≥ 2^31 or entry id
/// u32::MAX), `packed` holds [`UNPACKABLE`] and the position is in the
/// [`Published`] cell `full`, itself one atomic snapshot. A reader therefore
/// always gets a whole (ledger, entry) pair that was published, never a
/// torn one.
struct PublishedMarkDelete {
    packed: AtomicU64,
    full: Published<Position>,
}

impl PublishedMarkDelete {
    fn new(md: Position) -> Self {
        let cell = Self {
            packed: AtomicU64::new(UNPACKABLE),
            full: Published::new(md),
        };
        if let Some(x) = pack(md) {
            cell.packed.store(x, Ordering::Release);
        }
        cell
    }

    /// Writer side (under the cursor write lock).
    fn store(&self, md: Position) {
        match pack(md) {
            Some(x) => self.packed.store(x, Ordering::Release),
            None => {
                // `full` first: a reader that sees UNPACKABLE then reads a
                // `full` at least this new.
                self.full.store(md);
                self.packed.store(UNPACKABLE, Ordering::Release);
            }
        }
    }

    #[inline]
    fn load(&self) -> MarkDeleteSeen {
        let x = self.packed.load(Ordering::Acquire);
        if x != UNPACKABLE {
            MarkDeleteSeen::packed(x)
        } else {
            MarkDeleteSeen::unpackable(self.full.with(|m| *m))
        }
    }
}

/// The fields lock-free readers load, on their own cache lines.
struct ReadSide {
    /// Even = stable, odd = reset in progress. Written only under the write
    /// lock, only by reset.
    reset_epoch: AtomicU64,
    /// Mark-delete as one published snapshot (never two atomics: a torn
    /// (ledger, entry) pair would be a stale positive).
    mark_delete: PublishedMarkDelete,
    directory: DeletionDirectory,
}

use super::range_set::{DeletionDirectory, PositionRangeSet, RangeSetError};

/// What the deletion state needs to know about the ledger it tracks: the
/// last confirmed entry (acks beyond it are rejected) and which positions
/// hold entries (mark-delete may jump over positions that hold none).
///
/// Implemented by [`ManagedLedger`](crate::ledger::ManagedLedger) (live topology, in
/// `src/ledger/deletion_state.rs`; the cursor calls it
/// while holding its own write lock, so the lock order is cursor → ledger)
/// and by [`LedgerLayout`] (a fixed layout value).
pub trait LedgerTopology {
    /// The last confirmed (appended) entry.
    fn last_confirmed_entry(&self) -> Position;
    /// The first position strictly after `p` that holds an entry, or the
    /// position just past the last confirmed entry.
    fn next_valid_position(&self, p: Position) -> Position;
    /// Every ledger as `(ledger_id, entries)` (entries `0..entries`),
    /// ascending by ledger id; used to count positions (skip, nth entry).
    fn ledger_entries(&self) -> Vec<(i64, i64)>;
}

/// A fixed ledger layout: ledger id → number of entries (entries `0..n`).
/// A plain value (no synchronisation) for embedding the deletion state
/// without a [`ManagedLedger`](crate::ledger::ManagedLedger), and for the models in `loom-tests/` and
/// `shuttle-tests/`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerLayout {
    ledgers: BTreeMap<i64, u32>,
}

impl LedgerLayout {
    /// A layout from `(ledger_id, entries)` pairs.
    pub fn new(ledgers: impl IntoIterator<Item = (i64, u32)>) -> Self {
        Self {
            ledgers: ledgers.into_iter().collect(),
        }
    }

    /// Sets the entry count of `ledger_id` (adding the ledger if absent).
    pub fn set_entries(&mut self, ledger_id: i64, entries: u32) {
        self.ledgers.insert(ledger_id, entries);
    }
}

impl LedgerTopology for LedgerLayout {
    fn last_confirmed_entry(&self) -> Position {
        self.ledgers
            .iter()
            .rev()
            .find(|(_, n)| **n > 0)
            .map(|(l, n)| Position::new(*l, i64::from(*n) - 1))
            .unwrap_or_else(|| {
                let first = self.ledgers.keys().next().copied().unwrap_or(-1);
                Position::new(first, -1)
            })
    }

    fn next_valid_position(&self, p: Position) -> Position {
        if let Some(n) = self.ledgers.get(&p.ledger_id) {
            if p.entry_id.saturating_add(1) < i64::from(*n) {
                return Position::new(p.ledger_id, p.entry_id.max(-1) + 1);
            }
        }
        for (l, n) in self.ledgers.range(p.ledger_id.saturating_add(1)..) {
            if *n > 0 {
                return Position::new(*l, 0);
            }
        }
        self.last_confirmed_entry().next_in_ledger()
    }

    fn ledger_entries(&self) -> Vec<(i64, i64)> {
        self.ledgers
            .iter()
            .map(|(l, n)| (*l, i64::from(*n)))
            .collect()
    }
}

/// Why a deletion-state operation was rejected. The state is unchanged
/// whenever one of these is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeletionError {
    /// A position to delete is after the ledger's last confirmed entry.
    #[error("position {position} is beyond the last confirmed entry {last_confirmed}")]
    BeyondLastConfirmed {
        /// The rejected position.
        position: Position,
        /// The last confirmed entry at the time of the call.
        last_confirmed: Position,
    },
    /// A reset asked to read from beyond the end: the furthest read
    /// position is just after the last confirmed entry.
    #[error(
        "cannot reset to read from {requested}: the last confirmed entry is {last_confirmed}, \
         so the furthest read position is the one right after it"
    )]
    ResetBeyondEnd {
        /// The requested read position.
        requested: Position,
        /// The last confirmed entry at the time of the call.
        last_confirmed: Position,
    },
    /// An explicit mark-delete would move mark-delete backward (only reset
    /// may do that).
    #[error("mark-delete cannot move backward from {current} to {requested}")]
    MarkDeleteBackward {
        /// The current mark-delete position.
        current: Position,
        /// The rejected position.
        requested: Position,
    },
    /// A position's entry id cannot be tracked (outside u32, or negative).
    #[error(transparent)]
    RangeSet(#[from] RangeSetError),
}

/// The result of a grouped delete ([`CursorDeletionState::delete`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteOutcome {
    /// Positions that became deleted by this call (entries).
    pub newly_deleted: usize,
    /// Positions skipped because they were already deleted (at or below
    /// mark-delete, or in an individually deleted range).
    pub already_deleted: usize,
    /// Mark-delete after the call.
    pub mark_delete: Position,
    /// Whether the call moved mark-delete forward.
    pub mark_delete_advanced: bool,
}

/// How one [`CursorDeletionState::read_scheduling_lookup`] was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulingLookup {
    /// The answer (see the contract on
    /// [`CursorDeletionState::is_deleted_for_read_scheduling`]).
    pub deleted: bool,
    /// `true` if the lock-free attempt overlapped a reset (odd or changed
    /// epoch) and the answer came from the locked, authoritative check.
    pub fell_back: bool,
    /// The mark-delete snapshot the lock-free attempt read, if it got that
    /// far (`None` when the epoch was odd on entry).
    pub mark_delete_seen: Option<Position>,
    /// The reset epoch read on entry.
    pub epoch: u64,
}

struct Inner {
    mark_delete: Position,
    ranges: PositionRangeSet,
    /// Partially acknowledged batch entries above mark-delete: position →
    /// ack-set words (set bit = batch index not yet acknowledged).
    batch_ack_sets: BTreeMap<Position, Vec<i64>>,
}

/// A cursor's deletion state: the mark-delete position and the individually
/// deleted ranges above it ([`PositionRangeSet`]), guarded together by one
/// cursor `RwLock` (Pulsar's `ManagedCursorImpl` lock around
/// `markDeletePosition` + `individualDeletedMessages`), plus what lock-free
/// readers need: the mark-delete published as **one** snapshot
/// ([`Published<Position>`]), the range set's published
/// [`DeletionDirectory`], and the reset epoch.
///
/// - [`delete`](Self::delete): grouped ack in one write section.
/// - [`mark_delete`](Self::mark_delete): explicit forward advance.
/// - [`reset`](Self::reset): moves mark-delete anywhere (also backward) and
///   clears the ranges, bracketed by the reset epoch.
/// - [`is_message_deleted`](Self::is_message_deleted) /
///   [`filter_read_entries`](Self::filter_read_entries): authoritative,
///   under the read lock.
/// - [`is_deleted_for_read_scheduling`](Self::is_deleted_for_read_scheduling):
///   the lock-free hint.
///
/// Concurrency: share it (`Arc`) between ack, reset and read-scheduling
/// threads; every method may be called from any thread at any time.
pub struct CursorDeletionState {
    inner: CachePadded<RwLock<Inner>>,
    read_side: CachePadded<ReadSide>,
    /// The `ds` of this state's trace lines (zero-sized without the
    /// `trace` feature).
    trace_id: trace::Id,
}

impl std::fmt::Debug for CursorDeletionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.inner.read();
        f.debug_struct("CursorDeletionState")
            .field("mark_delete", &g.mark_delete)
            .field("individually_deleted", &g.ranges)
            .field(
                "reset_epoch",
                &self.read_side.reset_epoch.load(Ordering::Relaxed),
            )
            .finish()
    }
}

fn validate_entry(p: Position) -> Result<(), DeletionError> {
    if u32::try_from(p.entry_id).is_err() {
        return Err(RangeSetError::EntryIdOutOfRange {
            ledger_id: p.ledger_id,
            entry_id: p.entry_id,
        }
        .into());
    }
    Ok(())
}

fn validate_bound(p: Position) -> Result<(), DeletionError> {
    if p.entry_id != -1 && u32::try_from(p.entry_id).is_err() {
        return Err(RangeSetError::BoundOutOfRange {
            ledger_id: p.ledger_id,
            entry_id: p.entry_id,
        }
        .into());
    }
    Ok(())
}

impl CursorDeletionState {
    /// A state with mark-delete at `mark_delete` (e.g. `(first ledger, -1)`
    /// for a new cursor) and no individually deleted ranges.
    ///
    /// # Errors
    /// [`RangeSetError::BoundOutOfRange`] if `mark_delete.entry_id` is not
    /// `-1` or a u32.
    pub fn new(mark_delete: Position) -> Result<Self, DeletionError> {
        Self::recover(mark_delete, &[])
    }

    /// A recovered state: mark-delete plus persisted open-closed ranges (the
    /// shape of [`PositionRangeSet::to_ranges`]); parts at or below
    /// mark-delete are trimmed.
    ///
    /// # Errors
    /// [`DeletionError::RangeSet`] for an invalid mark-delete (an entry id
    /// other than -1 or a u32) or range (inverted, an entry id out of range,
    /// or an upper bound in a negative ledger id).
    pub fn recover(
        mark_delete: Position,
        ranges: &[(Position, Position)],
    ) -> Result<Self, DeletionError> {
        validate_bound(mark_delete)?;
        let mut set = PositionRangeSet::from_ranges(ranges)?;
        set.remove_at_most(mark_delete.ledger_id, mark_delete.entry_id)?;
        Ok(Self::with_ranges(mark_delete, set))
    }

    /// The state of `mark_delete` (a valid bound) and `set` (every entry
    /// above it), its directory published.
    fn with_ranges(mark_delete: Position, mut set: PositionRangeSet) -> Self {
        let trace_id = trace::open(mark_delete, &mut set);
        let directory = set.directory();
        Self {
            inner: CachePadded::new(RwLock::new(Inner {
                mark_delete,
                ranges: set,
                batch_ack_sets: BTreeMap::new(),
            })),
            read_side: CachePadded::new(ReadSide {
                reset_epoch: AtomicU64::new(0),
                mark_delete: PublishedMarkDelete::new(mark_delete),
                directory,
            }),
            trace_id,
        }
    }

    /// This state's id in its trace lines (`ds`; the simulator joins a
    /// cursor's states across restarts by it,
    /// [`crate::trace::deletion::cursor`]).
    #[cfg(feature = "trace")]
    pub fn trace_id(&self) -> u64 {
        self.trace_id
    }

    /// The current mark-delete position (read lock).
    pub fn mark_delete_position(&self) -> Position {
        self.inner.read().mark_delete
    }

    /// The individually deleted ranges `(lower, upper]`, ascending (read lock).
    pub fn individually_deleted_ranges(&self) -> Vec<(Position, Position)> {
        self.inner.read().ranges.ranges()
    }

    /// Number of individually deleted entries above mark-delete (read lock).
    pub fn individually_deleted_count(&self) -> u64 {
        self.inner.read().ranges.cardinality()
    }

    /// Number of individually deleted ranges (the length of
    /// [`individually_deleted_ranges`](Self::individually_deleted_ranges)),
    /// counted without collecting them (read lock).
    pub fn individually_deleted_range_count(&self) -> usize {
        self.inner.read().ranges.range_count()
    }

    /// Runs `f` with a check that answers exactly as
    /// [`is_message_deleted`](Self::is_message_deleted), under ONE cursor
    /// read lock held for the whole of `f` instead of one per position: for
    /// settling many positions at once. `f` must not call a method of this
    /// state that writes (it would wait for the read lock `f` holds).
    pub fn with_deleted_check<R>(&self, f: impl FnOnce(&dyn Fn(Position) -> bool) -> R) -> R {
        let g = self.inner.read();
        f(&|p| Self::deleted_locked(&g, p))
    }

    /// The reset epoch: even when no reset is in progress; `2 × resets` once
    /// they completed.
    pub fn reset_epoch(&self) -> u64 {
        self.read_side.reset_epoch.load(Ordering::Acquire)
    }

    /// Grouped delete/ack (Pulsar's `asyncDelete(Iterable<Position>)`): one
    /// write-lock section for the whole group. Already-deleted positions are
    /// skipped; each other position `p` adds `(p-1, p]`. Then mark-delete
    /// advances if no entry lies between it and the first range; it extends
    /// through contiguous ranges and the set is trimmed.
    ///
    /// The whole group is validated before anything changes.
    ///
    /// # Errors
    /// [`DeletionError::BeyondLastConfirmed`] for a position after the
    /// ledger's last confirmed entry, [`DeletionError::RangeSet`] for a
    /// negative ledger id or an entry id outside `0..=u32::MAX`; nothing is
    /// applied.
    pub fn delete(
        &self,
        positions: &[Position],
        ledger: &dyn LedgerTopology,
    ) -> Result<DeleteOutcome, DeletionError> {
        for &p in positions {
            super::range_set::member_entry(p)?;
        }
        let mut g = self.inner.write();
        let last_confirmed = ledger.last_confirmed_entry();
        if let Some(&p) = positions.iter().find(|p| **p > last_confirmed) {
            return Err(DeletionError::BeyondLastConfirmed {
                position: p,
                last_confirmed,
            });
        }
        let before = g.mark_delete;
        let mut newly_deleted = 0;
        let mut candidates: Vec<u32> = Vec::with_capacity(positions.len());
        // One bitmap write section per run of same-ledger positions.
        for run in positions.chunk_by(|a, b| a.ledger_id == b.ledger_id) {
            candidates.clear();
            candidates.extend(run.iter().filter(|p| **p > before).map(|p| {
                // Cannot fail: every entry id was validated as a u32 above.
                u32::try_from(p.entry_id).expect("validated entry id")
            }));
            // Cannot fail: every ledger id was validated as >= 0 above.
            newly_deleted += g
                .ranges
                .add_entries(run[0].ledger_id, &candidates)
                .expect("validated ledger id");
        }
        let already_deleted = positions.len() - newly_deleted;
        if !g.batch_ack_sets.is_empty() {
            // A whole-entry ack supersedes a partial batch ack.
            for p in positions {
                g.batch_ack_sets.remove(p);
            }
        }
        if let Some((lower, upper)) = g.ranges.first_range() {
            let md = g.mark_delete;
            // Every range lies above mark-delete: each move of it trims the
            // set, and positions at or below it were filtered out above.
            debug_assert!(
                lower >= md,
                "range ({lower}, {upper}] below mark-delete {md}"
            );
            // No entry between mark-delete and the first range (it starts
            // at mark-delete, or only positions without entries lie
            // between): mark-delete moves through it.
            if ledger.next_valid_position(md) > lower {
                self.advance_locked(&mut g, upper, ledger);
            }
        }
        let mark_delete = g.mark_delete;
        Ok(DeleteOutcome {
            newly_deleted,
            already_deleted,
            mark_delete,
            mark_delete_advanced: mark_delete > before,
        })
    }

    fn trim(&self, g: &mut Inner) {
        let md = g.mark_delete;
        // Cannot fail: mark-delete entry ids are always -1 or a u32 (every
        // assignment is validated or comes from the set itself).
        g.ranges
            .remove_at_most(md.ledger_id, md.entry_id)
            .expect("mark-delete is a valid bound");
        if g.batch_ack_sets
            .first_key_value()
            .is_some_and(|(p, _)| *p <= md)
        {
            g.batch_ack_sets = g.batch_ack_sets.split_off(&md.next_in_ledger());
        }
    }

    /// Moves mark-delete to `candidate` (≥ current), extended through
    /// contiguous deleted ranges; publishes it before trimming the set.
    fn advance_locked(&self, g: &mut Inner, candidate: Position, ledger: &dyn LedgerTopology) {
        let mut md = candidate;
        loop {
            // `next` is past md unless md is at or past the topology's last
            // entry (ranges recovered beyond it, a layout that shrank):
            // extend only while the run ends past md, so the loop ends.
            let next = ledger.next_valid_position(md);
            match g.ranges.run_end_from(next) {
                Some(end) if end > md => md = end,
                _ => break,
            }
        }
        self.publish_advance(g, md);
        self.trim(g);
    }

    /// Publishes `md` as the mark-delete if it moved forward.
    fn publish_advance(&self, g: &mut Inner, md: Position) {
        if md > g.mark_delete {
            tracing::trace!(from = %g.mark_delete, to = %md, "mark-delete advanced");
            g.mark_delete = md;
            self.read_side.mark_delete.store(md);
            trace::advance(self.trace_id, md);
        }
    }

    /// Explicit mark-delete (Pulsar's `asyncMarkDelete` /
    /// `setAcknowledgedPosition`): moves mark-delete forward to `position`,
    /// then through any contiguous deleted ranges after it, and trims the set.
    /// Returns the new mark-delete.
    ///
    /// # Errors
    /// [`DeletionError::MarkDeleteBackward`] if `position` is below the
    /// current mark-delete, [`DeletionError::BeyondLastConfirmed`] if it is
    /// after the last confirmed entry, [`DeletionError::RangeSet`] for an
    /// entry id that is not `-1` or a u32. Unchanged on error.
    pub fn mark_delete(
        &self,
        position: Position,
        ledger: &dyn LedgerTopology,
    ) -> Result<Position, DeletionError> {
        validate_bound(position)?;
        let mut g = self.inner.write();
        let last_confirmed = ledger.last_confirmed_entry();
        if position > last_confirmed {
            return Err(DeletionError::BeyondLastConfirmed {
                position,
                last_confirmed,
            });
        }
        if position < g.mark_delete {
            return Err(DeletionError::MarkDeleteBackward {
                current: g.mark_delete,
                requested: position,
            });
        }
        trace::mark_delete(self.trace_id, position, g.mark_delete);
        self.advance_locked(&mut g, position, ledger);
        Ok(g.mark_delete)
    }

    /// Resets the cursor to read from `new_read_position`: mark-delete
    /// becomes the position just before it (`(L, e-1)`; backward or
    /// forward) and every individually deleted range is cleared (Pulsar's
    /// `internalResetCursor` align step). Returns the new mark-delete.
    ///
    /// A position that holds no entry (a ledger the topology lacks, an
    /// entry id past its ledger's end) is moved to the next position that
    /// does, or to just past the last confirmed entry, as Pulsar's
    /// `asyncResetCursor` does with `getNextValidPosition`; a negative
    /// ledger id (before every ledger) therefore means "from the first
    /// entry".
    ///
    /// Under the write lock: epoch → odd, release fence, directory
    /// invalidated, mark-delete published, ranges cleared, epoch → even
    /// (release). A lock-free lookup overlapping any part of this falls back
    /// to the locked check, which waits for the reset to finish.
    ///
    /// # Errors
    /// [`DeletionError::RangeSet`] if `new_read_position.entry_id` is not a
    /// u32; [`DeletionError::ResetBeyondEnd`] if the new mark-delete
    /// would be after the last confirmed entry. Unchanged on error.
    pub fn reset(
        &self,
        new_read_position: Position,
        ledger: &dyn LedgerTopology,
    ) -> Result<Position, DeletionError> {
        validate_entry(new_read_position)?;
        let requested_md = new_read_position.previous_in_ledger();
        let mut g = self.inner.write();
        let last_confirmed = ledger.last_confirmed_entry();
        if requested_md > last_confirmed {
            return Err(DeletionError::ResetBeyondEnd {
                requested: new_read_position,
                last_confirmed,
            });
        }
        // The first position at or after the requested one that holds an
        // entry (or just past the last confirmed one).
        let new_md = ledger
            .next_valid_position(requested_md)
            .previous_in_ledger();
        let old = self.replace_under_reset_epoch(&mut g, new_md, |ranges| {
            ranges.clear();
            Ok(())
        })?;
        tracing::debug!(from = %old, to = %new_md, epoch = self.reset_epoch(), "cursor reset");
        Ok(new_md)
    }

    /// The reset bracket (Pulsar's `internalResetCursor` align step), shared
    /// by [`reset`](Self::reset) and [`restore`](Self::restore), the two
    /// operations that may un-delete positions. Under the write lock `g`:
    /// epoch → odd, release fence, directory invalidated, mark-delete
    /// published, `fill` replaces the ranges (after they are cleared),
    /// batch ack sets cleared, epoch → even (release). Returns the old
    /// mark-delete.
    ///
    /// `fill` must not fail after changing anything: it runs with the set
    /// already cleared, and an error from it leaves the set empty with the
    /// new mark-delete (callers validate before calling).
    fn replace_under_reset_epoch(
        &self,
        g: &mut Inner,
        new_md: Position,
        fill: impl FnOnce(&mut PositionRangeSet) -> Result<(), RangeSetError>,
    ) -> Result<Position, DeletionError> {
        // Single writer: the epoch is only written here, under the write lock.
        let epoch = self.read_side.reset_epoch.load(Ordering::Relaxed);
        let (odd, even) = (epoch + 1, epoch + 2);
        self.read_side.reset_epoch.store(odd, Ordering::Relaxed);
        trace::reset_begin(self.trace_id, odd);
        // Orders the odd epoch before every data write below for readers
        // that observe any of them (pairs with the reader's acquire fence).
        fence(Ordering::Release);
        g.ranges.invalidate_directory();
        trace::reset_invalidate(self.trace_id);
        let old = g.mark_delete;
        g.mark_delete = new_md;
        self.read_side.mark_delete.store(new_md);
        trace::reset_mark_delete(self.trace_id, new_md);
        g.ranges.clear();
        g.batch_ack_sets.clear();
        let filled = fill(&mut g.ranges);
        trace::reset_clear(self.trace_id);
        hook::at(Point::ResetBeforeEnd);
        self.read_side.reset_epoch.store(even, Ordering::Release);
        trace::reset_end(self.trace_id, even);
        filled?;
        Ok(old)
    }

    /// Authoritative check (Pulsar's `isMessageDeleted`): `position` is at or
    /// below mark-delete or in an individually deleted range. Takes the
    /// cursor read lock (waits for a concurrent grouped ack or reset).
    pub fn is_message_deleted(&self, position: Position) -> bool {
        Self::deleted_locked(&self.inner.read(), position)
    }

    fn deleted_locked(g: &Inner, position: Position) -> bool {
        position <= g.mark_delete || g.ranges.contains(position.ledger_id, position.entry_id)
    }

    /// The lock-free read-scheduling hint (Pulsar's
    /// `isMessageDeletedForReadScheduling`): whether `(ledger_id, entry_id)`
    /// may be skipped before I/O.
    ///
    /// **Contract.** It may answer `false` for a deleted position (a stale
    /// negative: an ack or mark-delete advance racing the call; the cost is
    /// one extra read, dropped later by
    /// [`filter_read_entries`](Self::filter_read_entries)). It never answers
    /// `true` for a position that is not deleted after a reset that
    /// completed before the call began; more strongly, a `true` answer was
    /// computed entirely between two reads of the same even reset epoch, so
    /// no reset overlapped it, and since only a reset can un-delete a
    /// position, the position is still deleted when the call returns unless
    /// a reset started after that.
    ///
    /// **How.** Reads the reset epoch (acquire; odd → locked check), the
    /// mark-delete as one published snapshot, then the ledger's bitmap (a
    /// summary slot, else the published ledger → bitmap directory) without
    /// its lock: one word of the bitmap's lock-free mirror, validated by the
    /// bitmap's seqlock version (a read that overlaps a clear answers "not
    /// deleted"; above entry 65,535 the roaring bitmap, only if its lock is
    /// free); then an acquire fence and the epoch again. Odd or changed →
    /// [`is_message_deleted`](Self::is_message_deleted) under the cursor
    /// read lock. No cursor lock is taken otherwise, and the call never
    /// waits for a grouped ack.
    ///
    /// Concurrency: any thread, concurrently with every other method.
    #[inline]
    pub fn is_deleted_for_read_scheduling(&self, ledger_id: i64, entry_id: i64) -> bool {
        self.read_scheduling_lookup(ledger_id, entry_id).deleted
    }

    /// The same lookup as
    /// [`is_deleted_for_read_scheduling`](Self::is_deleted_for_read_scheduling),
    /// also reporting how it was answered (fallback taken, the mark-delete
    /// snapshot and the epoch it read): for metrics and for the loom/shuttle
    /// checks of the contract.
    #[inline]
    pub fn read_scheduling_lookup(&self, ledger_id: i64, entry_id: i64) -> SchedulingLookup {
        let position = Position::new(ledger_id, entry_id);
        let rs = &*self.read_side;
        let epoch = rs.reset_epoch.load(Ordering::Acquire);
        trace::r_start(self.trace_id, position, epoch);
        let mut mark_delete_seen = None;
        if epoch & 1 == 0 {
            let md = rs.mark_delete.load();
            trace::r_mark_delete(self.trace_id, md.position());
            mark_delete_seen = Some(md.position());
            hook::at(Point::SchedulingLookupAfterMarkDelete);
            let deleted =
                md.covers(ledger_id, entry_id) || rs.directory.contains(ledger_id, entry_id);
            trace::r_lookup(self.trace_id, deleted);
            // Seqlock read side: every load above happens before the re-read.
            fence(Ordering::Acquire);
            if rs.reset_epoch.load(Ordering::Relaxed) == epoch {
                trace::r_recheck(self.trace_id, "done");
                trace::r_finish(self.trace_id);
                return SchedulingLookup {
                    deleted,
                    fell_back: false,
                    mark_delete_seen,
                    epoch,
                };
            }
            trace::r_recheck(self.trace_id, "locked");
        }
        let g = self.inner.read();
        let deleted = Self::deleted_locked(&g, position);
        // Recorded under the read lock: no writer acts in between.
        trace::r_locked(self.trace_id, deleted);
        trace::r_finish(self.trace_id);
        drop(g);
        SchedulingLookup {
            deleted,
            fell_back: true,
            mark_delete_seen,
            epoch,
        }
    }

    /// Post-I/O filter (Pulsar's `filterReadEntries`), the correctness
    /// boundary after a read scheduled with the hint: drops every entry
    /// whose position is deleted (at or below mark-delete or in a range),
    /// keeping order. Under one cursor read lock. A single-ledger ascending
    /// batch above mark-delete with no deleted entry in its span is returned
    /// untouched after one `contains_any` probe. Unlike Pulsar (which
    /// consults only the ranges), mark-delete is also checked.
    pub fn filter_read_entries<T>(
        &self,
        mut entries: Vec<T>,
        position_of: impl Fn(&T) -> Position,
    ) -> Vec<T> {
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return entries;
        };
        let (first, last) = (position_of(first), position_of(last));
        let g = self.inner.read();
        // Strictly ascending with the first and last in one ledger: every
        // entry is in that ledger.
        let single_ledger_ascending = first.ledger_id == last.ledger_id
            && entries
                .windows(2)
                .all(|w| position_of(&w[0]) < position_of(&w[1]));
        if single_ledger_ascending
            && first > g.mark_delete
            && !g
                .ranges
                .contains_any(first.ledger_id, first.entry_id, last.entry_id)
        {
            return entries;
        }
        entries.retain(|e| {
            let p = position_of(e);
            !(p <= g.mark_delete || g.ranges.contains(p.ledger_id, p.entry_id))
        });
        entries
    }
}

mod batch;
mod skip;
mod state_io;

pub use batch::BatchAckOutcome;
pub use skip::SkipMode;
