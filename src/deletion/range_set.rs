//! [`PositionRangeSet`]: the individually deleted ranges of a cursor, one
//! roaring bitmap per ledger, plus the published ledger → bitmap directory
//! ([`DeletionDirectory`]) that lock-free readers use.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::RangeInclusive;

use roaring::RoaringBitmap;

use super::bit_mirror::{BitMirror, MIRROR_ENTRIES};
use crate::position::Position;
use crate::sync::{Arc, AtomicI64, AtomicU64, AtomicUsize, Ordering, Published, RwLock};

/// Why a [`PositionRangeSet`] operation rejected its input. The set is left
/// unchanged whenever one of these is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeSetError {
    /// An entry id that must name a stored entry is outside `0..=u32::MAX`
    /// (entry ids are stored as 32-bit bitmap indices per ledger, which is
    /// safe because Pulsar's max-entries-per-ledger setting is an int).
    #[error(
        "entry id {entry_id} of ledger {ledger_id} is outside 0..=4294967295 \
         (entry ids are stored as u32 bitmap indices)"
    )]
    EntryIdOutOfRange {
        /// Ledger id of the rejected position.
        ledger_id: i64,
        /// The rejected entry id.
        entry_id: i64,
    },
    /// An open lower bound (or an "at most" bound) whose entry id is neither
    /// `-1` ("before the first entry of the ledger") nor a u32.
    #[error(
        "bound entry id {entry_id} of ledger {ledger_id} must be -1 (before the first entry) \
         or in 0..=4294967295"
    )]
    BoundOutOfRange {
        /// Ledger id of the rejected bound.
        ledger_id: i64,
        /// The rejected entry id.
        entry_id: i64,
    },
    /// A position that must name an entry has a negative ledger id. No
    /// ledger has one (Pulsar uses `-1` only in the `EARLIEST` sentinel,
    /// which may appear as an open lower bound), so such a position cannot
    /// be in the set.
    #[error(
        "position {ledger_id}:{entry_id} has a negative ledger id: only entries of real \
         ledgers (ledger id >= 0) can be in the set"
    )]
    NegativeLedgerId {
        /// The rejected ledger id.
        ledger_id: i64,
        /// Its entry id.
        entry_id: i64,
    },
    /// A range whose lower bound is not below its upper bound.
    #[error("empty or inverted range: lower {lower} is not below upper {upper}")]
    InvalidRange {
        /// The rejected lower bound.
        lower: Position,
        /// The rejected upper bound.
        upper: Position,
    },
}

/// Validates a position that must name an entry (a member of the set): a
/// ledger id >= 0 and a u32 entry id.
pub(crate) fn member_entry(p: Position) -> Result<u32, RangeSetError> {
    if p.ledger_id < 0 {
        return Err(RangeSetError::NegativeLedgerId {
            ledger_id: p.ledger_id,
            entry_id: p.entry_id,
        });
    }
    u32::try_from(p.entry_id).map_err(|_| RangeSetError::EntryIdOutOfRange {
        ledger_id: p.ledger_id,
        entry_id: p.entry_id,
    })
}

/// Validates an open-closed range `(lower, upper]` for
/// [`PositionRangeSet::add_open_closed`]: returns the lower bound's entry
/// (`None` for -1) and the upper entry.
fn validate_range(lower: Position, upper: Position) -> Result<(Option<u32>, u32), RangeSetError> {
    let up = member_entry(upper)?;
    let lo = bound_entry(lower)?;
    if lower >= upper {
        return Err(RangeSetError::InvalidRange { lower, upper });
    }
    Ok((lo, up))
}

/// Validates an open/at-most bound: `-1` → `None` (before entry 0), else a u32.
fn bound_entry(p: Position) -> Result<Option<u32>, RangeSetError> {
    if p.entry_id == -1 {
        return Ok(None);
    }
    u32::try_from(p.entry_id)
        .map(Some)
        .map_err(|_| RangeSetError::BoundOutOfRange {
            ledger_id: p.ledger_id,
            entry_id: p.entry_id,
        })
}

/// One ledger's deleted entries: bit `n` set ⇔ `(ledger, n)` is deleted.
///
/// Thread-safe on its own, like Pulsar's `ConcurrentRoaringBitmap`: the
/// authoritative bits are a [`RoaringBitmap`] behind the facade's
/// [`RwLock`], which the cursor mutates under the cursor write lock; a
/// [`BitMirror`] holds the same bits for entries below
/// [`MIRROR_ENTRIES`], written inside the same write sections, which
/// lock-free readers (through a [`DeletionDirectory`]) read without any
/// lock. Every mutation goes through the methods below, which update both
/// under one write lock.
pub(crate) struct LedgerBitmap {
    bits: RwLock<RoaringBitmap>,
    /// The lock-free copy of `bits` below [`MIRROR_ENTRIES`].
    mirror: BitMirror,
    /// The ledger whose entries `bits` holds ([`NO_LEDGER`] for a free
    /// summary-slot bitmap). Written only while holding the `bits` write
    /// lock and inside a mirror version bracket, so a reader holding the
    /// read lock, or a validated mirror read, sees the owner that matches
    /// the bits: a summary-slot bitmap reassigned to another ledger is never
    /// read as the old one.
    owner: AtomicI64,
    /// `min..=max` of `bits` as [`encode_bounds`] stores it
    /// ([`EMPTY_BOUNDS`] when empty), stored under the write lock after
    /// every mutation. A filter only ([`admits`]): a query outside
    /// `min..=max` answers "not contained" without reading the bits. A stale value can only give a stale "not contained" (to a
    /// lock-free reader) or a needless read; every positive comes from the
    /// bits.
    bounds: AtomicU64,
}

/// Bounds value of an empty bitmap: `min = u32::MAX`, span 0, which
/// [`admits`] only entry `u32::MAX` (for that entry of an empty bitmap a
/// needless read of the bits, which answer "not contained").
pub(super) const EMPTY_BOUNDS: u64 = (u32::MAX as u64) << 32;

/// The bounds word of a bitmap whose entries lie in `min..=max`
/// (`min <= max`): `min << 32 | (max - min)`, the form [`admits`] tests
/// with one subtraction and one compare.
pub(super) fn encode_bounds(min: u32, max: u32) -> u64 {
    debug_assert!(min <= max);
    (u64::from(min) << 32) | u64::from(max - min)
}

/// Whether `entry` lies in the bounds `b` ([`encode_bounds`]):
/// `min <= entry <= min + span` iff `entry - min` (wrapping) `<= span`,
/// since `min + span <= u32::MAX` (an entry below `min` wraps above
/// `u32::MAX - min >= span`). Branch-free: one subtraction and one
/// compare, where testing `min` and `max` separately takes two compares
/// and the `or` of their results.
#[inline(always)]
pub(super) fn admits(b: u64, entry: u32) -> bool {
    entry.wrapping_sub((b >> 32) as u32) <= b as u32
}

impl LedgerBitmap {
    fn new(owner: i64) -> Self {
        Self {
            bits: RwLock::new(RoaringBitmap::new()),
            mirror: BitMirror::new(),
            owner: AtomicI64::new(owner),
            bounds: AtomicU64::new(EMPTY_BOUNDS),
        }
    }

    /// Empties the bitmap and hands it to `owner`, in one write section
    /// (the mirror's clear and the owner change in one version bracket).
    fn reassign(&self, owner: i64) {
        let mut bits = self.bits.write();
        bits.clear();
        self.mirror
            .clear_all_and(|| self.owner.store(owner, Ordering::Relaxed));
        self.bounds.store(EMPTY_BOUNDS, Ordering::Release);
    }

    /// Republishes the bounds of `bits` (under its write lock).
    fn publish_bounds(&self, bits: &RoaringBitmap) {
        let bounds = match (bits.min(), bits.max()) {
            (Some(min), Some(max)) => encode_bounds(min, max),
            _ => EMPTY_BOUNDS,
        };
        self.bounds.store(bounds, Ordering::Release);
    }

    /// Inserts the range `pick` chooses from the current bits (`None`:
    /// nothing), in both forms, under one write lock.
    fn insert_range_with(&self, pick: impl FnOnce(&RoaringBitmap) -> Option<RangeInclusive<u32>>) {
        let mut bits = self.bits.write();
        if let Some(range) = pick(&bits) {
            bits.insert_range(range.clone());
            self.mirror.set_range(range);
        }
        self.publish_bounds(&bits);
    }

    fn insert_range(&self, range: RangeInclusive<u32>) {
        self.insert_range_with(|_| Some(range));
    }

    /// Inserts single entries under one write lock; `inserted` runs for
    /// each entry that was not already set, before its mirror bit is set.
    /// Returns how many were inserted.
    fn insert_entries(&self, entries: &[u32], mut inserted: impl FnMut(u32)) -> usize {
        let mut bits = self.bits.write();
        let mut n = 0;
        for &e in entries {
            if bits.insert(e) {
                inserted(e);
                self.mirror.set(e);
                n += 1;
            }
        }
        self.publish_bounds(&bits);
        n
    }

    /// Removes the range `pick` chooses from the current bits (`None`:
    /// nothing), in both forms, under one write lock. The mirror is cleared
    /// only from the first to the last set bit inside the range, so a trim
    /// below mark-delete costs the span it removes, not the ledger's whole
    /// prefix, and a removal of nothing opens no version bracket
    /// (concurrent lookups keep their answers).
    fn remove_range_with(&self, pick: impl FnOnce(&RoaringBitmap) -> Option<RangeInclusive<u32>>) {
        let mut bits = self.bits.write();
        if let Some(range) = pick(&bits) {
            let mut set = bits.range(range.clone());
            if let Some(first) = set.next() {
                let last = set.next_back().unwrap_or(first);
                self.mirror.clear_range(first..=last);
            }
            bits.remove_range(range);
        }
        self.publish_bounds(&bits);
    }

    fn remove_range(&self, range: RangeInclusive<u32>) {
        self.remove_range_with(|_| Some(range));
    }

    /// Replaces the bits with `new`.
    fn assign(&self, new: RoaringBitmap) {
        let mut bits = self.bits.write();
        self.mirror.clear_all_and(|| {});
        for e in new.range(..MIRROR_ENTRIES) {
            self.mirror.set(e);
        }
        *bits = new;
        self.publish_bounds(&bits);
    }

    #[inline]
    fn contains(&self, entry: u32) -> bool {
        if !admits(self.bounds.load(Ordering::Acquire), entry) {
            return false;
        }
        self.bits.read().contains(entry)
    }

    /// [`contains`](Self::contains) for lock-free readers: never waits for a
    /// writer and takes no lock below [`MIRROR_ENTRIES`] (a validated
    /// [`BitMirror`] read, which answers "not contained" if a clear or an
    /// owner change overlapped it). Above the mirror, the roaring bitmap is
    /// read only if its lock is free: while a grouped ack holds (or, with
    /// std's writer-preferring lock, waits for) it, "not contained". Both
    /// are stale negatives, which the hint's contract allows (one extra read
    /// that the post-I/O filter drops). `ledger_id` is checked against the
    /// owner inside the validated window or under the read lock (a
    /// summary-slot bitmap may have been reassigned since the caller found
    /// it).
    #[inline]
    fn contains_without_waiting(&self, ledger_id: i64, entry: u32) -> bool {
        if !admits(self.bounds.load(Ordering::Acquire), entry) {
            return false;
        }
        self.contains_unfiltered_without_waiting(ledger_id, entry)
    }

    /// [`contains_without_waiting`](Self::contains_without_waiting) without
    /// its bounds filter, for a caller that has just filtered by a copy of
    /// the bounds (a summary slot's). The filter only turns reads into
    /// "not contained"; every positive comes from the validated bits, so
    /// leaving it out can only cost a read, never give a positive.
    #[inline]
    fn contains_unfiltered_without_waiting(&self, ledger_id: i64, entry: u32) -> bool {
        match self
            .mirror
            .contains_validated(entry, || self.owner.load(Ordering::Relaxed) == ledger_id)
        {
            Some(set) => set,
            None => self.contains_above_mirror(ledger_id, entry),
        }
    }

    /// The roaring bitmap's answer for an entry beyond the mirror, only if
    /// its lock is free. Out of line: it holds the lock's code, which would
    /// otherwise keep the mirror path above from being inlined into the
    /// lookup.
    #[cold]
    #[inline(never)]
    fn contains_above_mirror(&self, ledger_id: i64, entry: u32) -> bool {
        self.bits.try_read().is_some_and(|bits| {
            self.owner.load(Ordering::Relaxed) == ledger_id && bits.contains(entry)
        })
    }
}

/// The published, immutable ledger → bitmap directory: a sorted copy of the
/// authoritative map's *keys*, sharing the live bitmaps (not their bits).
#[derive(Default)]
pub(crate) struct DirectorySnapshot {
    ledgers: Vec<(i64, Arc<LedgerBitmap>)>,
}

impl DirectorySnapshot {
    #[inline]
    fn get(&self, ledger_id: i64) -> Option<&LedgerBitmap> {
        // A cursor's set usually spans few ledgers: a linear scan of a short
        // sorted vector beats hashing; binary search for long ones.
        if self.ledgers.len() <= 8 {
            self.ledgers
                .iter()
                .find(|(l, _)| *l == ledger_id)
                .map(|(_, b)| &**b)
        } else {
            self.ledgers
                .binary_search_by_key(&ledger_id, |(l, _)| *l)
                .ok()
                .map(|i| &*self.ledgers[i].1)
        }
    }
}

/// A handle on a [`PositionRangeSet`]'s published ledger → bitmap directory,
/// readable without the cursor lock (Pulsar's published primitive directory
/// in `PositionRangeSet`).
///
/// The directory is republished (a new immutable snapshot in a
/// [`Published`] cell) only when a ledger gains or loses its bitmap (Pulsar
/// republishes only on gain; republishing on the rare removal keeps the
/// empty-directory filter effective), and replaced by an empty one by [`PositionRangeSet::invalidate_directory`] /
/// [`PositionRangeSet::clear`] / [`PositionRangeSet::rebuild`]. Acks into an
/// existing ledger mutate the shared bitmap in place, so a lookup always
/// sees bits at least as new as the directory it loaded, but possibly a
/// directory missing a newly added ledger (a stale "not deleted").
///
/// Concurrency: any thread, any time, concurrently with every mutation of
/// the set. On its own the answer is only "was deleted at some instant
/// during the call" for forward-only changes; use it through
/// [`crate::deletion::CursorDeletionState::is_deleted_for_read_scheduling`],
/// which adds the reset-epoch guard.
#[derive(Clone)]
pub struct DeletionDirectory {
    shared: Arc<DirectoryCell>,
}

/// Summary slots kept next to the directory (see [`SummarySlot`]). One under
/// loom, to keep the model's state space small while still exercising both
/// the summarised and the non-summarised ledger paths.
#[cfg(not(loom))]
const SUMMARY_SLOTS: usize = 4;
#[cfg(loom)]
const SUMMARY_SLOTS: usize = 1;
/// `SummarySlot::ledger` value of an unused slot.
const NO_LEDGER: i64 = i64::MIN;

/// A summary slot: a permanent bitmap that serves as the map's bitmap of
/// one ledger at a time, found by lock-free readers without loading the
/// published cell (so the common lookup costs no `arc_swap` load).
///
/// The first [`SUMMARY_SLOTS`] ledgers that gain a bitmap while a slot is
/// free live in a slot: `ledger` holds the ledger id ([`NO_LEDGER`] when
/// free) and `bounds` a copy of the bitmap's bounds word, refreshed
/// after every mutation (a lookup outside them answers "not contained"
/// without the bitmap lock: the usual read-scheduling case, a read beyond
/// everything acknowledged in its ledger). When the ledger leaves the map
/// the slot is freed (`ledger` first) and its bitmap emptied and untagged
/// in one write section (one mirror version bracket). The atomics are
/// read separately and may be stale or mismatched: that can only give a
/// "not contained" (a stale negative, allowed by the hint's contract);
/// every positive comes from the bitmap, read with its owner checked inside
/// the mirror's validated window (or under its lock, above the mirror).
struct SummarySlot {
    ledger: AtomicI64,
    bounds: AtomicU64,
    bitmap: Arc<LedgerBitmap>,
}

struct DirectoryCell {
    summary: [SummarySlot; SUMMARY_SLOTS],
    cell: Published<DirectorySnapshot>,
    /// Ledger count of the last published snapshot, stored after it: a
    /// filter only (0 → answer "not contained" without loading the cell).
    /// A stale value can only cause a stale "not contained" or a needless
    /// cell load, never a positive.
    published_ledgers: AtomicUsize,
    /// Ledgers of the map whose bitmap is not in a summary slot (written by
    /// the set's owner only). 0 → a ledger found in no slot has no bitmap:
    /// answer "not contained" without loading the cell. A stale value can
    /// only cause a stale negative (a ledger added during the lookup) or a
    /// needless cell load.
    unslotted: AtomicUsize,
}

impl DeletionDirectory {
    fn new() -> Self {
        Self {
            shared: Arc::new(DirectoryCell {
                summary: std::array::from_fn(|_| SummarySlot {
                    ledger: AtomicI64::new(NO_LEDGER),
                    bounds: AtomicU64::new(EMPTY_BOUNDS),
                    bitmap: Arc::new(LedgerBitmap::new(NO_LEDGER)),
                }),
                cell: Published::new(DirectorySnapshot::default()),
                published_ledgers: AtomicUsize::new(0),
                unslotted: AtomicUsize::new(0),
            }),
        }
    }

    fn store(&self, snapshot: DirectorySnapshot) {
        let n = snapshot.ledgers.len();
        self.shared.cell.store(snapshot);
        self.shared.published_ledgers.store(n, Ordering::Release);
    }

    /// A bitmap for a ledger entering the map (writer side): a free summary
    /// slot's bitmap, handed to `ledger_id` (empty), or a new one.
    fn new_bitmap(&self, ledger_id: i64) -> Arc<LedgerBitmap> {
        // NO_LEDGER is negative and members have ledger ids >= 0, so a
        // ledger id never equals the free marker.
        debug_assert!(ledger_id != NO_LEDGER);
        let free = self
            .shared
            .summary
            .iter()
            .find(|s| s.ledger.load(Ordering::Relaxed) == NO_LEDGER);
        match free {
            Some(slot) => {
                slot.bitmap.reassign(ledger_id);
                slot.bounds.store(EMPTY_BOUNDS, Ordering::Release);
                slot.ledger.store(ledger_id, Ordering::Release);
                Arc::clone(&slot.bitmap)
            }
            None => {
                let n = self.shared.unslotted.load(Ordering::Relaxed);
                self.shared.unslotted.store(n + 1, Ordering::Release);
                Arc::new(LedgerBitmap::new(ledger_id))
            }
        }
    }

    /// A bitmap leaving the map (writer side). A summary slot is freed and
    /// its bitmap emptied and untagged (a reader that found the slot before
    /// then gets "not contained"); another bitmap is left as it is for
    /// readers still holding a snapshot that lists it.
    fn retire_bitmap(&self, bitmap: &Arc<LedgerBitmap>) {
        match self
            .shared
            .summary
            .iter()
            .find(|s| Arc::ptr_eq(&s.bitmap, bitmap))
        {
            Some(slot) => {
                slot.ledger.store(NO_LEDGER, Ordering::Release);
                slot.bounds.store(EMPTY_BOUNDS, Ordering::Release);
                slot.bitmap.reassign(NO_LEDGER);
            }
            None => {
                let n = self.shared.unslotted.load(Ordering::Relaxed);
                self.shared
                    .unslotted
                    .store(n.saturating_sub(1), Ordering::Release);
            }
        }
    }

    /// Copies `bitmap`'s bounds into the summary slot of `ledger_id`, if it
    /// has one (writer side, after a mutation).
    fn refresh(&self, ledger_id: i64, bitmap: &LedgerBitmap) {
        if let Some(slot) = self
            .shared
            .summary
            .iter()
            .find(|s| s.ledger.load(Ordering::Relaxed) == ledger_id)
        {
            slot.bounds
                .store(bitmap.bounds.load(Ordering::Acquire), Ordering::Release);
        }
    }

    /// Whether the published directory has a bitmap for `ledger_id` with
    /// `entry_id` set. Entry ids outside `0..=u32::MAX` are never contained.
    /// Takes no lock below entry 65,536: for a ledger in a summary slot,
    /// the slot's atomics; otherwise one published-cell load; then one
    /// validated word of the bitmap's lock-free mirror (a read that a clear
    /// or a re-tag overlapped answers "not contained"). Above the mirror,
    /// the bitmap's read lock, only if it is free (a bitmap being written
    /// answers "not contained" rather than waiting).
    #[inline]
    pub fn contains(&self, ledger_id: i64, entry_id: i64) -> bool {
        let Ok(entry) = u32::try_from(entry_id) else {
            return false;
        };
        let published = self.shared.published_ledgers.load(Ordering::Acquire);
        if published == 0 {
            return false;
        }
        for slot in &self.shared.summary {
            if slot.ledger.load(Ordering::Acquire) == ledger_id {
                if !admits(slot.bounds.load(Ordering::Acquire), entry) {
                    return false;
                }
                // Filtered by the slot's copy of the bounds: the bitmap's
                // own copy is not loaded again.
                return slot
                    .bitmap
                    .contains_unfiltered_without_waiting(ledger_id, entry);
            }
        }
        if self.shared.unslotted.load(Ordering::Acquire) == 0 {
            // Every bitmap of the map is in a slot and none is this ledger's.
            return false;
        }
        self.shared.cell.with(|d| {
            d.get(ledger_id)
                .is_some_and(|b| b.contains_without_waiting(ledger_id, entry))
        })
    }

    /// Number of ledgers in the currently published directory (diagnostics).
    pub fn ledger_count(&self) -> usize {
        self.shared.cell.with(|d| d.ledgers.len())
    }
}

impl fmt::Debug for DeletionDirectory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeletionDirectory")
            .field("ledgers", &self.ledger_count())
            .finish()
    }
}

/// The individually deleted positions of a cursor, as Pulsar's
/// `PositionRangeSet` (`individualDeletedMessages`): an ordered map ledger id →
/// [`RoaringBitmap`] of entry ids, each bitmap behind the sync facade's
/// `RwLock`.
///
/// Semantics are Pulsar's **open-closed** ranges `(lower, upper]`:
/// acknowledging entry `e` of ledger `L` adds `(L:e-1, L:e]`, so adjacent acks
/// coalesce into one range. Ranges are never reported across ledgers; a
/// ledger whose first deleted entry is 0 reports its lower bound as
/// `(L, -1)`. The legacy cross-ledger behaviours are reproduced on purpose
/// (see [`PositionRangeSet::add_open_closed`] and
/// [`PositionRangeSet::remove_closed`]).
///
/// Entry ids are stored as u32; a member entry id outside `0..=u32::MAX`, or a
/// bound other than `-1` or a u32, is a [`RangeSetError`] and leaves the set
/// unchanged.
///
/// Concurrency: the map structure is **not** thread-safe (`&mut self`
/// mutations); the owning cursor's lock guards it. Only the
/// [`DeletionDirectory`] obtained from [`PositionRangeSet::directory`] may be
/// read from other threads without that lock.
pub struct PositionRangeSet {
    ledgers: BTreeMap<i64, Arc<LedgerBitmap>>,
    directory: DeletionDirectory,
    /// The `ds` of the owning deletion state's `Ack` trace lines.
    pub(crate) trace_id: crate::trace::deletion::Id,
}

impl Default for PositionRangeSet {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for PositionRangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut l = f.debug_list();
        for (lo, up) in self.ranges() {
            l.entry(&format_args!("({lo}, {up}]"));
        }
        l.finish()
    }
}

impl PositionRangeSet {
    /// Creates an empty set with an empty published directory.
    pub fn new() -> Self {
        Self {
            ledgers: BTreeMap::new(),
            directory: DeletionDirectory::new(),
            trace_id: Default::default(),
        }
    }

    /// Builds a set from open-closed ranges (the persisted shape, see
    /// [`PositionRangeSet::to_ranges`]).
    ///
    /// # Errors
    /// The first invalid range, as [`PositionRangeSet::add_open_closed`].
    pub fn from_ranges(ranges: &[(Position, Position)]) -> Result<Self, RangeSetError> {
        let mut set = Self::new();
        set.rebuild(ranges)?;
        Ok(set)
    }

    /// The handle lock-free readers use (shares this set's directory cell).
    pub fn directory(&self) -> DeletionDirectory {
        self.directory.clone()
    }

    fn publish_directory(&self) {
        let snapshot = DirectorySnapshot {
            ledgers: self
                .ledgers
                .iter()
                .map(|(l, b)| (*l, Arc::clone(b)))
                .collect(),
        };
        self.directory.store(snapshot);
    }

    /// Publishes an empty directory (lock-free readers then find no bitmap)
    /// without touching the authoritative map. Reset calls this before it
    /// moves mark-delete.
    pub fn invalidate_directory(&self) {
        self.directory.store(DirectorySnapshot::default());
    }

    fn bitmap_or_create(&mut self, ledger_id: i64) -> (Arc<LedgerBitmap>, bool) {
        if let Some(b) = self.ledgers.get(&ledger_id) {
            return (Arc::clone(b), false);
        }
        let b = self.directory.new_bitmap(ledger_id);
        self.ledgers.insert(ledger_id, Arc::clone(&b));
        (b, true)
    }

    /// Drops a whole ledger from the map and republishes the directory. A
    /// bitmap outside the summary slots keeps its bits for readers still
    /// holding an older directory snapshot: every bit was in the set when
    /// such a reader's call began (the directory's contract for forward
    /// changes), and in the cursor a ledger is dropped only once it lies
    /// below mark-delete. A slot bitmap is emptied and untagged by
    /// `retire_bitmap`.
    fn drop_ledger(&mut self, ledger_id: i64) {
        if let Some(b) = self.ledgers.remove(&ledger_id) {
            self.directory.retire_bitmap(&b);
            self.publish_directory();
        }
    }

    fn drop_if_empty(&mut self, ledger_id: i64) {
        let empty = self
            .ledgers
            .get(&ledger_id)
            .is_some_and(|b| b.bits.read().is_empty());
        if empty {
            // Unlike Pulsar, removal republishes too (removal is rare: a
            // ledger fully below mark-delete), keeping the directory tight
            // for the empty-directory filter. A reader still holding the old
            // snapshot sees the emptied bitmap: at worst "not deleted".
            if let Some(b) = self.ledgers.remove(&ledger_id) {
                self.directory.retire_bitmap(&b);
            }
            self.publish_directory();
        }
    }

    /// Adds the open-closed range `(lower, upper]`.
    ///
    /// - Same ledger: entries `lower.entry_id + 1 ..= upper.entry_id`
    ///   (`lower.entry_id == -1` starts at entry 0).
    /// - Across ledgers `(A:x, B:y]`: ledger `A` is extended from `x + 1` up
    ///   to its highest deleted entry only if `A` already has a bitmap whose
    ///   highest entry is above `x` (nothing is invented for a ledger with no
    ///   deletions); ledger `B` gets `0..=y`; ledgers strictly between are
    ///   untouched. These are Pulsar's (tested) legacy behaviours.
    ///
    /// Republishes the directory when a bitmap is created for a ledger.
    ///
    /// # Errors
    /// [`RangeSetError::NegativeLedgerId`] for `upper.ledger_id < 0`,
    /// [`RangeSetError::EntryIdOutOfRange`] for `upper.entry_id` outside
    /// u32, [`RangeSetError::BoundOutOfRange`] for a `lower.entry_id` that is
    /// not `-1` or a u32, [`RangeSetError::InvalidRange`] unless
    /// `lower < upper`. The set is unchanged on error.
    pub fn add_open_closed(
        &mut self,
        lower: Position,
        upper: Position,
    ) -> Result<(), RangeSetError> {
        let (lo, up) = validate_range(lower, upper)?;
        if lower.ledger_id == upper.ledger_id {
            // lo < up here, so lo + 1 cannot overflow.
            let first = lo.map_or(0, |x| x + 1);
            let (b, created) = self.bitmap_or_create(upper.ledger_id);
            b.insert_range(first..=up);
            self.directory.refresh(upper.ledger_id, &b);
            if created {
                self.publish_directory();
            }
            return Ok(());
        }
        if let Some(a) = self.ledgers.get(&lower.ledger_id) {
            a.insert_range_with(|bits| {
                let max = bits.max()?;
                // max > x, so x + 1 cannot overflow (x may be u32::MAX).
                match lo {
                    None => Some(0..=max),
                    Some(x) if max > x => Some(x + 1..=max),
                    Some(_) => None,
                }
            });
            self.directory.refresh(lower.ledger_id, a);
        }
        let (b, created) = self.bitmap_or_create(upper.ledger_id);
        b.insert_range(0..=up);
        self.directory.refresh(upper.ledger_id, &b);
        if created {
            self.publish_directory();
        }
        Ok(())
    }

    /// Adds the single position `p` (the range `(p-1, p]`).
    ///
    /// # Errors
    /// [`RangeSetError::EntryIdOutOfRange`] for an entry id outside u32.
    pub fn add(&mut self, p: Position) -> Result<(), RangeSetError> {
        member_entry(p)?;
        self.add_open_closed(p.previous_in_ledger(), p)
    }

    /// Adds single entries of one ledger under ONE bitmap write lock (the
    /// grouped-ack path: a reader of that bitmap waits at most once per
    /// group, not once per entry). Returns how many were not already in
    /// the set. Entries need not be sorted.
    ///
    /// # Errors
    /// [`RangeSetError::NegativeLedgerId`] for `ledger_id < 0`; unchanged.
    pub fn add_entries(&mut self, ledger_id: i64, entries: &[u32]) -> Result<usize, RangeSetError> {
        member_entry(Position::new(ledger_id, 0))?;
        if entries.is_empty() {
            return Ok(0);
        }
        let (b, created) = self.bitmap_or_create(ledger_id);
        let ds = self.trace_id;
        // The Ack line of an entry is written before its mirror bit is set:
        // a lock-free reader cannot see the deletion before its line.
        let added = b.insert_entries(entries, |e| crate::trace::deletion::ack(ds, ledger_id, e));
        self.directory.refresh(ledger_id, &b);
        if created {
            self.publish_directory();
        }
        Ok(added)
    }

    /// Removes the closed range `[lower, upper]`.
    ///
    /// - Same ledger: entries `lower.entry_id ..= upper.entry_id`.
    /// - Across ledgers: ledger `lower.ledger_id` is cleared from
    ///   `lower.entry_id` up to but **excluding** its highest deleted entry
    ///   (Pulsar's legacy half-open clear, kept on purpose), ledgers strictly
    ///   between are dropped, ledger `upper.ledger_id` is cleared `0..=upper`.
    ///
    /// Bitmaps that become empty are dropped from the map.
    ///
    /// # Errors
    /// [`RangeSetError::EntryIdOutOfRange`] for an entry id outside u32,
    /// [`RangeSetError::InvalidRange`] if `lower > upper`. Unchanged on error.
    pub fn remove_closed(&mut self, lower: Position, upper: Position) -> Result<(), RangeSetError> {
        let lo = member_entry(lower)?;
        let up = member_entry(upper)?;
        if lower > upper {
            return Err(RangeSetError::InvalidRange { lower, upper });
        }
        if lower.ledger_id == upper.ledger_id {
            if let Some(b) = self.ledgers.get(&lower.ledger_id) {
                b.remove_range(lo..=up);
                self.directory.refresh(lower.ledger_id, b);
            }
            self.drop_if_empty(lower.ledger_id);
            return Ok(());
        }
        if let Some(a) = self.ledgers.get(&lower.ledger_id) {
            // Up to but excluding the highest deleted entry (Pulsar's legacy
            // half-open clear); nothing when that entry is lo itself.
            a.remove_range_with(|bits| {
                let max = bits.max()?;
                (lo < max).then(|| lo..=max - 1)
            });
            self.directory.refresh(lower.ledger_id, a);
        }
        let between: Vec<i64> = self
            .ledgers
            .range(lower.ledger_id + 1..upper.ledger_id)
            .map(|(l, _)| *l)
            .collect();
        for l in between {
            self.drop_ledger(l);
        }
        if let Some(b) = self.ledgers.get(&upper.ledger_id) {
            b.remove_range(0..=up);
            self.directory.refresh(upper.ledger_id, b);
        }
        self.drop_if_empty(lower.ledger_id);
        self.drop_if_empty(upper.ledger_id);
        Ok(())
    }

    /// Removes every position `<= (ledger_id, entry_id)`: whole ledgers below
    /// `ledger_id` and entries `0..=entry_id` of `ledger_id` (none for
    /// `entry_id == -1`). Bitmaps that become empty are dropped. Used to trim
    /// the set after mark-delete advances.
    ///
    /// # Errors
    /// [`RangeSetError::BoundOutOfRange`] for an entry id that is not `-1` or
    /// a u32. Unchanged on error.
    pub fn remove_at_most(&mut self, ledger_id: i64, entry_id: i64) -> Result<(), RangeSetError> {
        let bound = bound_entry(Position::new(ledger_id, entry_id))?;
        let below: Vec<i64> = self.ledgers.range(..ledger_id).map(|(l, _)| *l).collect();
        for l in below {
            self.drop_ledger(l);
        }
        if let (Some(e), Some(b)) = (bound, self.ledgers.get(&ledger_id)) {
            b.remove_range(0..=e);
            self.directory.refresh(ledger_id, b);
            self.drop_if_empty(ledger_id);
        }
        Ok(())
    }

    /// Empties the set. The directory is invalidated first (an empty one is
    /// published), then the map is cleared: summary-slot bitmaps are emptied
    /// and freed, other bitmaps keep their bits for any reader still holding
    /// an older directory snapshot (either way such a reader is inside a
    /// reset's epoch window, or sees at worst bits that were deleted).
    pub fn clear(&mut self) {
        self.invalidate_directory();
        for b in std::mem::take(&mut self.ledgers).into_values() {
            self.directory.retire_bitmap(&b);
        }
    }

    /// Replaces the whole content with `ranges` (open-closed; Pulsar's
    /// `build` after recovery): the directory is invalidated, the map
    /// replaced, and the new directory published.
    ///
    /// # Errors
    /// The first invalid range (as [`PositionRangeSet::add_open_closed`]);
    /// the set is unchanged on error.
    pub fn rebuild(&mut self, ranges: &[(Position, Position)]) -> Result<(), RangeSetError> {
        for &(lo, up) in ranges {
            validate_range(lo, up)?;
        }
        self.clear();
        for &(lo, up) in ranges {
            // Cannot fail: every range was validated above with the checks
            // add_open_closed makes (validate_range).
            self.add_open_closed(lo, up)
                .expect("ranges validated before the set changed");
        }
        self.publish_directory();
        Ok(())
    }

    /// Whether `(ledger_id, entry_id)` is in the set. Entry ids outside u32
    /// are never contained.
    pub fn contains(&self, ledger_id: i64, entry_id: i64) -> bool {
        let Ok(e) = u32::try_from(entry_id) else {
            return false;
        };
        self.ledgers.get(&ledger_id).is_some_and(|b| b.contains(e))
    }

    /// Whether any entry `first..=last` of `ledger_id` is in the set (Pulsar's
    /// `containsAny`: next present bit in the window). The window is clamped
    /// to `0..=u32::MAX`; an empty window gives `false`.
    pub fn contains_any(&self, ledger_id: i64, first: i64, last: i64) -> bool {
        let first = first.max(0);
        let last = last.min(i64::from(u32::MAX));
        if first > last {
            return false;
        }
        let (Ok(f), Ok(l)) = (u32::try_from(first), u32::try_from(last)) else {
            return false;
        };
        self.ledgers
            .get(&ledger_id)
            .is_some_and(|b| b.bits.read().range(f..=l).next().is_some())
    }

    /// Number of deleted entries in the set (entries, not ranges).
    pub fn cardinality(&self) -> u64 {
        self.ledgers.values().map(|b| b.bits.read().len()).sum()
    }

    /// Whether the set holds no entry.
    pub fn is_empty(&self) -> bool {
        self.ledgers.values().all(|b| b.bits.read().is_empty())
    }

    /// Number of ledgers with a bitmap in the authoritative map.
    pub fn ledger_count(&self) -> usize {
        self.ledgers.len()
    }

    /// The lowest range `(lower, upper]`, or `None` when empty.
    pub fn first_range(&self) -> Option<(Position, Position)> {
        self.ledgers.iter().find_map(|(l, b)| {
            let bits = b.bits.read();
            let run = bits.iter().next_range()?;
            Some(run_to_range(*l, run))
        })
    }

    /// The highest range `(lower, upper]`, or `None` when empty.
    pub fn last_range(&self) -> Option<(Position, Position)> {
        self.ledgers.iter().rev().find_map(|(l, b)| {
            let bits = b.bits.read();
            let run = bits.iter().next_range_back()?;
            Some(run_to_range(*l, run))
        })
    }

    /// Number of maximal ranges (runs of consecutive entries per ledger),
    /// counted without collecting them.
    pub fn range_count(&self) -> usize {
        let mut n = 0;
        for b in self.ledgers.values() {
            let bits = b.bits.read();
            let mut it = bits.iter();
            while it.next_range().is_some() {
                n += 1;
            }
        }
        n
    }

    /// Every maximal range `(lower, upper]` in ascending order, never
    /// spanning ledgers.
    pub fn ranges(&self) -> Vec<(Position, Position)> {
        self.ranges_limited(usize::MAX)
    }

    /// The persistence shape: the first `max_ranges` ranges in ascending order
    /// (Pulsar's `toRanges` / `managedLedgerMaxUnackedRangesToPersist`;
    /// ranges beyond the cap are only in memory). Rebuild with
    /// [`PositionRangeSet::from_ranges`] / [`PositionRangeSet::rebuild`].
    pub fn to_ranges(&self, max_ranges: usize) -> Vec<(Position, Position)> {
        self.ranges_limited(max_ranges)
    }

    fn ranges_limited(&self, max: usize) -> Vec<(Position, Position)> {
        let mut out = Vec::new();
        for (l, b) in &self.ledgers {
            let bits = b.bits.read();
            let mut it = bits.iter();
            while out.len() < max {
                let Some(run) = it.next_range() else { break };
                out.push(run_to_range(*l, run));
            }
            if out.len() >= max {
                break;
            }
        }
        out
    }

    /// If `p` is in the set, the upper bound (last entry) of the run of
    /// consecutive deleted entries that contains it; used to extend
    /// mark-delete through contiguous ranges.
    pub fn run_end_from(&self, p: Position) -> Option<Position> {
        let e = u32::try_from(p.entry_id).ok()?;
        let b = self.ledgers.get(&p.ledger_id)?;
        let bits = b.bits.read();
        if !bits.contains(e) {
            return None;
        }
        let run = bits.range(e..).next_range()?;
        Some(Position::new(p.ledger_id, i64::from(*run.end())))
    }
}

impl PositionRangeSet {
    /// A copy of every ledger's bitmap (ledger id → deleted entries), taken
    /// under each bitmap's read lock; empty bitmaps are left out.
    pub fn to_bitmaps(&self) -> BTreeMap<i64, RoaringBitmap> {
        self.ledgers
            .iter()
            .filter_map(|(l, b)| {
                let bits = b.bits.read();
                (!bits.is_empty()).then(|| (*l, bits.clone()))
            })
            .collect()
    }

    /// Replaces the whole content with `bitmaps` (ledger id → deleted
    /// entries; Pulsar's `build(Map<Long, long[]>)`): the directory is
    /// invalidated, the map replaced, the new directory published.
    ///
    /// # Errors
    /// [`RangeSetError::NegativeLedgerId`] for a ledger id below 0; the set
    /// is unchanged on error.
    pub fn rebuild_from_bitmaps(
        &mut self,
        bitmaps: BTreeMap<i64, RoaringBitmap>,
    ) -> Result<(), RangeSetError> {
        if let Some((l, _)) = bitmaps.iter().find(|(l, _)| **l < 0) {
            return Err(RangeSetError::NegativeLedgerId {
                ledger_id: *l,
                entry_id: 0,
            });
        }
        self.clear();
        for (l, bits) in bitmaps {
            if bits.is_empty() {
                continue;
            }
            let (b, _) = self.bitmap_or_create(l);
            b.assign(bits);
            self.directory.refresh(l, &b);
        }
        self.publish_directory();
        Ok(())
    }

    /// Number of deleted entries in the closed window `[lower, upper]`
    /// (Pulsar's `cardinality(lowerKey, lowerValue, upperKey, upperValue)`),
    /// summed over the ledgers it spans; `0` for an empty window.
    pub fn cardinality_between(&self, lower: Position, upper: Position) -> u64 {
        if lower > upper {
            return 0;
        }
        let clamp = |e: i64| e.clamp(0, i64::from(u32::MAX)) as u32;
        self.ledgers
            .range(lower.ledger_id..=upper.ledger_id)
            .map(|(l, b)| {
                let bits = b.bits.read();
                let from = if *l == lower.ledger_id {
                    if lower.entry_id > i64::from(u32::MAX) {
                        return 0;
                    }
                    clamp(lower.entry_id)
                } else {
                    0
                };
                let to = if *l == upper.ledger_id {
                    if upper.entry_id < 0 {
                        return 0;
                    }
                    clamp(upper.entry_id)
                } else {
                    u32::MAX
                };
                if from > to {
                    0
                } else {
                    bits.range_cardinality(from..=to)
                }
            })
            .sum()
    }

    /// The maximal range `(lower, upper]` containing `p` (Pulsar's
    /// `rangeContaining`), or `None` if `p` is not in the set.
    pub fn range_containing(&self, p: Position) -> Option<(Position, Position)> {
        let e = u32::try_from(p.entry_id).ok()?;
        let b = self.ledgers.get(&p.ledger_id)?;
        let bits = b.bits.read();
        if !bits.contains(e) {
            return None;
        }
        let end = *bits.range(e..).next_range()?.end();
        // The run's first entry: one past the highest absent entry below e.
        let start = match bits.range(..e).next_range_back() {
            Some(r) if *r.end() + 1 == e => *r.start(),
            _ => e,
        };
        Some(run_to_range(p.ledger_id, start..=end))
    }
}

fn run_to_range(ledger_id: i64, run: std::ops::RangeInclusive<u32>) -> (Position, Position) {
    (
        Position::new(ledger_id, i64::from(*run.start()) - 1),
        Position::new(ledger_id, i64::from(*run.end())),
    )
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    /// A lock-free read of entry 10 whose validated window contains
    /// `during`; true iff the read kept its "deleted".
    fn read_10_around(b: &LedgerBitmap, during: impl FnOnce()) -> bool {
        b.mirror
            .contains_validated(10, || {
                during();
                true
            })
            .expect("entry 10 is mirrored")
    }

    #[test]
    fn a_removal_of_entries_that_are_not_set_leaves_concurrent_lookups_alone() {
        let b = LedgerBitmap::new(1);
        b.insert_entries(&[10, 40], |_| {});
        // Nothing set in 0..=5 or 12..=30: no bracket, the read stands.
        assert!(read_10_around(&b, || b.remove_range(0..=5)));
        assert!(read_10_around(&b, || b.remove_range(12..=30)));
        assert!(read_10_around(&b, || b.remove_range(50..=60)));
        // A removal that clears a set bit (40) opens a bracket.
        assert!(!read_10_around(&b, || b.remove_range(35..=45)));
        assert!(b.contains_without_waiting(1, 10) && !b.contains_without_waiting(1, 40));
        assert!(b.bits.read().iter().eq([10]));
    }
}
