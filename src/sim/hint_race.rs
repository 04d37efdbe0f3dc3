//! The `hint_race` stage of `pulsar-core simulate`: real threads on the
//! real [`CursorDeletionState`], checking the lock-free
//! read-scheduling hint and the locked post-I/O filter against an external
//! oracle.
//!
//! The main simulation runs on one thread in virtual time, so reads complete
//! instantly and no ack can race a lookup: the concurrency defects the hint
//! exists to avoid cannot show there. This stage runs, for a bounded wall
//! time (default 500 ms), on one cursor deletion state over eight ledgers:
//!
//! - a **writer** thread repeating rounds of: 32 times a backward reset
//!   (read position `1:990`, so mark-delete `1:989`, un-deleting everything
//!   above it) followed by an explicit mark-delete to `1:999` and then
//!   across the ledger boundary to `2:5`; then grouped acks into ledgers
//!   3–8 (more ledgers than the summary slots, so the published directory
//!   is used): entries 0–11 in groups of 4, then entries 12–299 in one large
//!   group (a long write section on that ledger's bitmap);
//! - two **reader** threads running the lock-free lookup
//!   ([`CursorDeletionState::read_scheduling_lookup`]) and the post-I/O
//!   filter ([`CursorDeletionState::filter_read_entries`]) on entries 0–11
//!   of the ledger the writer is acking at that moment.
//!
//! The oracle is kept outside the component (std atomics, written by the
//! writer around each call):
//!
//! | rule | violation when |
//! |---|---|
//! | no stale positive | the hint says "deleted" for a position that was never deleted (never acked, never at or below any mark-delete) before the lookup returned — e.g. a torn mark-delete read `2:999` |
//! | no filter leak | the filter returns an entry whose ack returned before the filter started, with no reset started since |
//! | quiescent agreement | after both threads stopped, the hint disagrees with the locked check for some position (e.g. a directory not republished) |
//!
//! Then a **deterministic** part on one thread places a reset exactly
//! inside lookups, through the crate's test hook
//! (`crate::sync::hook::Point::SchedulingLookupAfterMarkDelete`): the
//! lookup has read an even epoch and the mark-delete snapshot, the hook
//! runs a complete backward reset (mark-delete `2:5` → `1:989`, ranges
//! cleared), then the lookup goes on. A position the lookup then reports
//! deleted that the locked check says is not deleted, with no reset after
//! the lookup returned, is a stale positive (the contract of
//! [`CursorDeletionState::is_deleted_for_read_scheduling`]: a positive is
//! computed between two reads of the same even epoch). Real threads reach
//! that window (nanoseconds) only by luck; the hook reaches it on every
//! round, so a lookup without the epoch re-check is caught on every run.
//!
//! A second **deterministic** part places lookups inside a mark-delete:
//! on one thread, a mark-delete from `1:999` across the ledger boundary to
//! `2:5` runs with a hook on the facade's write points
//! (`crate::sync::hook::Point::AtomicWrite`, `race-hooks` builds only); after
//! each atomic write the hook looks up `2:500` and `2:6`, which nothing ever
//! deletes. A positive is a state between two writes that no complete
//! mark-delete published (a torn mark-delete read `2:999`); such a window
//! exists only in code that publishes mark-delete in more than one write,
//! and this part reaches every one of them on every run.
//!
//! A third part mirrors it: a complete mark-delete `1:999` → `2:5` runs
//! from a hook on the facade's read points after the k-th atomic load of a
//! lookup of `2:500`, for every k the lookup reaches, so a lookup that
//! combines loads from before and after one mark-delete (the entry id read
//! as `999` before it, the ledger id as `2` after it) is caught too.
//!
//! Counters (lookups, positives, filtered entries, rounds) depend on thread
//! timing, so the report keeps them with the wall-clock figures, out of the
//! same-seed comparison; on correct code the violations are always 0.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::deletion::{CursorDeletionState, LedgerLayout, SchedulingLookup};
use crate::position::Position;

/// Entries per ledger in the stage's layout.
const ENTRIES: u32 = 1_000;
/// Ledgers `1..=LEDGERS`.
const LEDGERS: i64 = 8;
/// First ledger that receives grouped acks (ledgers 1 and 2 are crossed by
/// mark-delete).
const ACKED_FROM: i64 = 3;
/// Entries of the acked ledgers that the writer acks: `e % 3 != 2` below
/// this bound (so `e % 3 == 2` stays a gap and mark-delete never swallows
/// the ranges): the first [`SMALL_GROUP_END`] of them in groups of 4, then
/// the rest in one large group (a long write section on that ledger's
/// bitmap while the reader filters the entries of the first groups).
const ACKED_BELOW: u32 = 300;
/// End of the entries acked in small groups (the reader's filter batch).
const SMALL_GROUP_END: u32 = 12;
/// The writer's grouped acks and the reader's filter batch use entries
/// `ACKED_BASE + e` of the acked ledgers: above the cursor bitmaps'
/// lock-free mirror (entries 0..65,535), where the hint reads the roaring
/// bitmap only if its lock is free and answers "not deleted" while the
/// large group holds it: the stale negatives a filter that trusted the
/// hint would leak. (Below it, only a lookup overlapping a clear of the
/// bitmap gives one.)
const ACKED_BASE: u32 = 65_536;
/// Backward resets (each followed by the two mark-deletes across the
/// ledger boundary) per writer round.
const CROSSINGS_PER_ROUND: u32 = 32;
/// Reader threads (more than one, so that on a loaded machine some reader
/// is likely to run at the same instant as the writer).
const READERS: usize = 2;

/// Parameters of the stage.
#[derive(Debug, Clone)]
pub struct HintRaceConfig {
    /// Wall time the two threads run (the quiescent check follows).
    pub duration: Duration,
}

impl Default for HintRaceConfig {
    fn default() -> Self {
        Self {
            duration: Duration::from_millis(500),
        }
    }
}

/// What the stage did and found. Only the three violation counters are
/// checked; the others vary with thread timing.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HintRaceReport {
    /// Writer rounds (reset + two mark-deletes + grouped acks).
    pub rounds: u64,
    /// Lock-free lookups run by the reader.
    pub lookups: u64,
    /// Of those, answered "deleted".
    pub positives: u64,
    /// Of those, answered through the locked fallback (a reset overlapped).
    pub fallbacks: u64,
    /// Positives for a position that was never deleted (violations).
    pub stale_positives: u64,
    /// Post-I/O filter calls.
    pub filter_calls: u64,
    /// Entries the filter dropped.
    pub entries_filtered: u64,
    /// Entries the filter returned although their ack returned before the
    /// filter started and no reset started since (violations).
    pub filter_leaks: u64,
    /// Positions where, with both threads stopped, the hint disagreed with
    /// the locked check (violations).
    pub quiescent_disagreements: u64,
    /// Lookups of the deterministic part, each overlapped by a complete
    /// reset run from the test hook (their stale positives are counted in
    /// `stale_positives`).
    pub overlapped_lookups: u64,
    /// Lookups of the second deterministic part, each run from the test
    /// hook just after one atomic write of a mark-delete across the ledger
    /// boundary (their stale positives are counted in `stale_positives`).
    pub lookups_inside_writes: u64,
    /// Lookups of the third deterministic part, each with a complete
    /// mark-delete across the ledger boundary run from the test hook just
    /// after one of its atomic loads (their stale positives are counted in
    /// `stale_positives`).
    pub mark_deletes_inside_lookups: u64,
    /// The first violation, if any.
    pub first_violation: Option<String>,
}

impl HintRaceReport {
    fn absorb(&mut self, r: HintRaceReport) {
        self.lookups += r.lookups;
        self.positives += r.positives;
        self.fallbacks += r.fallbacks;
        self.stale_positives += r.stale_positives;
        self.filter_calls += r.filter_calls;
        self.entries_filtered += r.entries_filtered;
        self.filter_leaks += r.filter_leaks;
        self.quiescent_disagreements += r.quiescent_disagreements;
        self.overlapped_lookups += r.overlapped_lookups;
        self.lookups_inside_writes += r.lookups_inside_writes;
        self.mark_deletes_inside_lookups += r.mark_deletes_inside_lookups;
        if self.first_violation.is_none() {
            self.first_violation = r.first_violation;
        }
    }

    /// Total violations.
    pub fn violations(&self) -> u64 {
        self.stale_positives + self.filter_leaks + self.quiescent_disagreements
    }
}

fn slot(p: Position) -> usize {
    // Two regions per ledger: entries 0..ENTRIES, then ACKED_BASE + 0..ENTRIES.
    let e = p.entry_id as usize;
    let region = if e >= ACKED_BASE as usize {
        ENTRIES as usize + e - ACKED_BASE as usize
    } else {
        e
    };
    (p.ledger_id as usize - 1) * 2 * ENTRIES as usize + region
}

/// Order-preserving position key for `fetch_max` (entry `-1` included).
fn key(p: Position) -> u64 {
    ((p.ledger_id as u64) << 32) | (p.entry_id + 1) as u64
}

/// Writer phase: between calls.
const PHASE_IDLE: u64 = 0;
/// Writer phase: inside the mark-delete across the ledger boundary.
const PHASE_CROSSING: u64 = 1;
/// Writer phase: inside the large ack group.
const PHASE_LARGE_GROUP: u64 = 2;

/// The external oracle: written by the writer around each call.
struct Oracle {
    /// Global sequence for "returned before / started after".
    seq: AtomicU64,
    /// Per position: set before the position is first acked (ever deleted).
    ever_acked: Vec<AtomicBool>,
    /// Per position: the sequence number taken after its last ack returned.
    ack_done: Vec<AtomicU64>,
    /// Highest mark-delete ever requested (key), raised before the call.
    max_mark_delete: AtomicU64,
    /// Sequence number taken just before the latest reset started.
    last_reset_start: AtomicU64,
    /// The ledger the writer is acking now.
    acking_ledger: AtomicI64,
    /// What the writer is doing now (`PHASE_*`).
    phase: AtomicU64,
    stop: AtomicBool,
}

impl Oracle {
    fn new() -> Self {
        let n = LEDGERS as usize * 2 * ENTRIES as usize;
        Self {
            seq: AtomicU64::new(1),
            ever_acked: (0..n).map(|_| AtomicBool::new(false)).collect(),
            ack_done: (0..n).map(|_| AtomicU64::new(0)).collect(),
            max_mark_delete: AtomicU64::new(0),
            last_reset_start: AtomicU64::new(0),
            acking_ledger: AtomicI64::new(ACKED_FROM),
            phase: AtomicU64::new(PHASE_IDLE),
            stop: AtomicBool::new(false),
        }
    }

    fn tick(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst)
    }

    /// Whether `p` was deleted at some instant so far.
    fn ever_deleted(&self, p: Position) -> bool {
        key(p) <= self.max_mark_delete.load(Ordering::SeqCst)
            || self.ever_acked[slot(p)].load(Ordering::SeqCst)
    }
}

fn layout() -> LedgerLayout {
    // Ledgers 1 and 2 end at entry ENTRIES - 1 (mark-delete crosses from
    // the end of one to the other); the acked ledgers also hold the
    // entries above ACKED_BASE.
    LedgerLayout::new((1..=LEDGERS).map(|l| {
        (
            l,
            if l >= ACKED_FROM {
                ACKED_BASE + ENTRIES
            } else {
                ENTRIES
            },
        )
    }))
}

fn writer(state: &CursorDeletionState, oracle: &Oracle, ledger: &LedgerLayout) -> u64 {
    let p = Position::new;
    let mut rounds = 0u64;
    while !oracle.stop.load(Ordering::Relaxed) {
        for _ in 0..CROSSINGS_PER_ROUND {
            let start = oracle.tick();
            oracle.last_reset_start.store(start, Ordering::SeqCst);
            // Cannot fail: 1:990 holds an entry of the fixed layout.
            state
                .reset(p(1, 990), ledger)
                .expect("reset within the layout");
            for md in [p(1, 999), p(2, 5)] {
                oracle.max_mark_delete.fetch_max(key(md), Ordering::SeqCst);
                if md.ledger_id == 2 {
                    oracle.phase.store(PHASE_CROSSING, Ordering::SeqCst);
                }
                state
                    .mark_delete(md, ledger)
                    .expect("mark-delete forward within the layout");
                oracle.phase.store(PHASE_IDLE, Ordering::SeqCst);
            }
        }
        for l in ACKED_FROM..=LEDGERS {
            oracle.acking_ledger.store(l, Ordering::SeqCst);
            let acked = |from: u32, to: u32| -> Vec<Position> {
                (from..to)
                    .filter(|e| e % 3 != 2)
                    .map(|e| p(l, i64::from(ACKED_BASE + e)))
                    .collect()
            };
            let small = acked(0, SMALL_GROUP_END);
            let large = acked(SMALL_GROUP_END, ACKED_BELOW);
            for group in small.chunks(4).chain(std::iter::once(&large[..])) {
                for q in group {
                    oracle.ever_acked[slot(*q)].store(true, Ordering::SeqCst);
                }
                if group.len() > 4 {
                    oracle.phase.store(PHASE_LARGE_GROUP, Ordering::SeqCst);
                }
                state.delete(group, ledger).expect("ack within the layout");
                oracle.phase.store(PHASE_IDLE, Ordering::SeqCst);
                let done = oracle.tick();
                for q in group {
                    oracle.ack_done[slot(*q)].store(done, Ordering::SeqCst);
                }
            }
        }
        rounds += 1;
    }
    rounds
}

/// Counts a stale positive (or a deterministic part that checked nothing,
/// or a panicked thread) and keeps the first violation's message.
fn stale_positive(report: &mut HintRaceReport, what: String) {
    report.stale_positives += 1;
    violation(report, what);
}

/// Counts one lookup of a never-deleted position `l:e`; a "deleted" answer
/// is a stale positive, described by `during`.
fn never_deleted_lookup(
    r: &mut HintRaceReport,
    l: i64,
    e: i64,
    look: &SchedulingLookup,
    during: impl FnOnce() -> String,
) {
    r.lookups += 1;
    r.fallbacks += u64::from(look.fell_back);
    if look.deleted {
        r.positives += 1;
        stale_positive(
            r,
            format!(
                "hint_race: stale positive for never-deleted {l}:{e}: {} saw {look:?}",
                during()
            ),
        );
    }
}

/// Brings `state` to mark-delete `1:999` with no ranges, through a backward
/// reset (so that a mark-delete to `2:5` can follow again).
fn mark_delete_at_1_999(state: &CursorDeletionState, ledger: &LedgerLayout) {
    let p = Position::new;
    // Cannot fail: 1:990 holds an entry of the fixed layout.
    state
        .reset(p(1, 990), ledger)
        .expect("reset within the layout");
    state
        .mark_delete(p(1, 999), ledger)
        .expect("mark-delete forward within the layout");
}

/// A cursor deletion state over the stage's layout, mark-delete `1:-1`.
fn fresh_cursor() -> (LedgerLayout, Arc<CursorDeletionState>) {
    // Cannot fail: (1, -1) is a valid mark-delete.
    let state = CursorDeletionState::new(Position::new(1, -1)).expect("valid mark-delete");
    (layout(), Arc::new(state))
}

fn violation(report: &mut HintRaceReport, what: String) {
    if report.first_violation.is_none() {
        report.first_violation = Some(what);
    }
}

fn reader(state: &CursorDeletionState, oracle: &Oracle) -> HintRaceReport {
    let p = Position::new;
    let mut r = HintRaceReport::default();
    // Never deleted: above every mark-delete in ledger 2, and the gaps
    // (e % 3 == 2) of the acked ledgers; plus acked ones.
    let probes = [
        p(2, 500),
        p(2, 6),
        p(2, 5),
        p(1, 999),
        p(3, i64::from(ACKED_BASE) + 2),
        p(4, i64::from(ACKED_BASE) + 1),
        p(6, i64::from(ACKED_BASE) + 5),
        p(8, i64::from(ACKED_BASE)),
    ];
    let lookup = |r: &mut HintRaceReport, q: Position| {
        let look = state.read_scheduling_lookup(q.ledger_id, q.entry_id);
        r.lookups += 1;
        r.fallbacks += u64::from(look.fell_back);
        if look.deleted {
            r.positives += 1;
            if !oracle.ever_deleted(q) {
                stale_positive(
                    r,
                    format!("hint_race: stale positive for never-deleted {q}: {look:?}"),
                );
            }
        }
    };
    // Post-I/O filter on entries 0-11 of the ledger being acked right now.
    let filter = |r: &mut HintRaceReport| {
        let l = oracle.acking_ledger.load(Ordering::SeqCst);
        let batch: Vec<Position> = (0..i64::from(SMALL_GROUP_END))
            .map(|e| p(l, i64::from(ACKED_BASE) + e))
            .collect();
        let started = oracle.tick();
        let out = state.filter_read_entries(batch.clone(), |q| *q);
        let last_reset = oracle.last_reset_start.load(Ordering::SeqCst);
        r.filter_calls += 1;
        r.entries_filtered += (batch.len() - out.len()) as u64;
        for q in &out {
            let done = oracle.ack_done[slot(*q)].load(Ordering::SeqCst);
            if done != 0 && done < started && last_reset < done {
                r.filter_leaks += 1;
                violation(
                    r,
                    format!(
                        "hint_race: filter leak: {q} returned although its ack returned before the filter started"
                    ),
                );
            }
        }
    };
    while !oracle.stop.load(Ordering::Relaxed) {
        // While the writer is inside a call, probe what that call can break:
        // 2:500 during the mark-delete across the ledger boundary (a torn
        // read (2, 999) covers it), the filter during the large ack group.
        match oracle.phase.load(Ordering::SeqCst) {
            PHASE_CROSSING => lookup(&mut r, p(2, 500)),
            PHASE_LARGE_GROUP => filter(&mut r),
            _ => {
                for q in probes {
                    lookup(&mut r, q);
                }
                filter(&mut r);
            }
        }
    }
    r
}

/// Rounds of the deterministic part (each: three probes, one reset inside
/// each lookup).
const OVERLAP_ROUNDS: i64 = 16;

/// The deterministic part: on this thread, every lookup of a position that
/// is deleted before the reset and not after it is overlapped by a
/// complete reset, run from the test hook between the lookup's
/// mark-delete read and its epoch re-check.
fn resets_inside_lookups() -> HintRaceReport {
    use crate::sync::hook::{self, Point};
    let p = Position::new;
    let (ledger, state) = fresh_cursor();
    let mut r = HintRaceReport::default();
    for round in 0..OVERLAP_ROUNDS {
        for q in [p(1, 995), p(2, 3), p(3, round)] {
            // Deleted before each probe: everything up to 2:5 (mark-delete)
            // and 3:round (a range, through the directory); a reset to read
            // 1:990 un-deletes all three probes.
            state
                .mark_delete(p(2, 5), &ledger)
                .expect("mark-delete forward within the layout");
            state
                .delete(&[p(3, round)], &ledger)
                .expect("ack within the layout");
            let fired = Arc::new(AtomicBool::new(false));
            let guard = {
                let (state, fired, ledger) =
                    (Arc::clone(&state), Arc::clone(&fired), ledger.clone());
                hook::install(move |point| {
                    if point == Point::SchedulingLookupAfterMarkDelete
                        && !fired.swap(true, Ordering::Relaxed)
                    {
                        // Cannot fail: 1:990 holds an entry of the fixed layout.
                        state
                            .reset(p(1, 990), &ledger)
                            .expect("reset within the layout");
                    }
                })
            };
            let look = state.read_scheduling_lookup(q.ledger_id, q.entry_id);
            drop(guard);
            r.lookups += 1;
            r.positives += u64::from(look.deleted);
            r.fallbacks += u64::from(look.fell_back);
            if !fired.load(Ordering::Relaxed) {
                // The lookup never reached the point (e.g. an odd epoch):
                // nothing overlapped it, nothing to check.
                continue;
            }
            r.overlapped_lookups += 1;
            if look.deleted && !state.is_message_deleted(q) {
                stale_positive(
                    &mut r,
                    format!(
                        "hint_race: stale positive for {q}: reported deleted by a lookup that a complete reset overlapped (mark-delete now {}): {look:?}",
                        state.mark_delete_position()
                    ),
                );
            }
        }
    }
    r
}

/// Rounds of the second deterministic part (each: one mark-delete across
/// the ledger boundary, lookups after each of its atomic writes).
const CROSSING_ROUNDS: u32 = 16;

/// Positions of ledger 2 that the second deterministic part never deletes
/// (every mark-delete it requests is at most `2:5`).
const NEVER_DELETED: [(i64, i64); 2] = [(2, 500), (2, 6)];

/// The second deterministic part: on this thread, a lock-free lookup of
/// never-deleted positions runs after **every** atomic write of a
/// mark-delete from `1:999` to `2:5`, through the facade's write points
/// (`crate::sync::hook::Point::AtomicWrite`). Each lookup therefore sees
/// the cursor's published state between two writes of one mark-delete; a
/// positive for `2:500` or `2:6` is a state no complete mark-delete
/// published (e.g. mark-delete kept in two atomics, read as `2:999` after
/// the ledger id was written and before the entry id was). The lookups run
/// while this thread holds the cursor's write lock, so they are made only
/// while the reset epoch is even (mark-delete never changes it): the
/// lock-free path then returns without taking the lock.
fn lookups_inside_mark_delete() -> HintRaceReport {
    use crate::sync::hook::{self, Point};
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    let p = Position::new;
    let (ledger, state) = fresh_cursor();
    let report = Rc::new(RefCell::new(HintRaceReport::default()));
    let armed = Rc::new(Cell::new(false));
    let guard = {
        let (state, report, armed) = (Arc::clone(&state), Rc::clone(&report), Rc::clone(&armed));
        hook::install(move |point| {
            if point != Point::AtomicWrite || !armed.get() || state.reset_epoch() & 1 == 1 {
                return;
            }
            let mut r = report.borrow_mut();
            for (l, e) in NEVER_DELETED {
                let look = state.read_scheduling_lookup(l, e);
                r.lookups_inside_writes += 1;
                never_deleted_lookup(&mut r, l, e, &look, || {
                    "a lookup between two atomic writes of the mark-delete 1:999 -> 2:5".into()
                });
            }
        })
    };
    let mut rounds_without_write = 0u32;
    for _ in 0..CROSSING_ROUNDS {
        mark_delete_at_1_999(&state, &ledger);
        let before = report.borrow().lookups_inside_writes;
        armed.set(true);
        state
            .mark_delete(p(2, 5), &ledger)
            .expect("mark-delete forward within the layout");
        armed.set(false);
        if report.borrow().lookups_inside_writes == before {
            rounds_without_write += 1;
        }
    }
    drop(guard);
    let mut r = report.take();
    if rounds_without_write > 0 {
        // The part checked nothing in these rounds: mark-delete published
        // without any write through the facade (or the hook never ran).
        stale_positive(
            &mut r,
            format!(
                "hint_race: {rounds_without_write} of {CROSSING_ROUNDS} mark-deletes across the ledger boundary made no atomic write through the facade, so no lookup ran inside them"
            ),
        );
    }
    r
}

/// Bound on the loads of one lookup that the third deterministic part
/// places a mark-delete after (the real lookup makes a handful).
const MAX_LOADS_PROBED: u32 = 64;

/// The third deterministic part, the mirror of the second: on this thread,
/// a lock-free lookup of never-deleted `2:500` runs with mark-delete at
/// `1:999`, and a complete mark-delete to `2:5` runs from the test hook
/// just after the lookup's k-th atomic load ([`Point::AtomicRead`], `sim`
/// builds only), for k = 1, 2, … until the lookup makes fewer than k loads.
/// A positive combines loads from before and after one complete
/// mark-delete (e.g. mark-delete kept in two atomics, the entry id read as
/// `999` before it, the ledger id as `2` after it). The lookup holds no
/// lock, so the mark-delete inside it cannot block on it.
///
/// [`Point::AtomicRead`]: crate::sync::hook::Point::AtomicRead
fn mark_deletes_inside_lookups() -> HintRaceReport {
    use crate::sync::hook::{self, Point};
    use std::cell::Cell;
    use std::rc::Rc;
    let p = Position::new;
    let (ledger, state) = fresh_cursor();
    let mut r = HintRaceReport::default();
    let (l, e) = NEVER_DELETED[0];
    for k in 1..=MAX_LOADS_PROBED {
        mark_delete_at_1_999(&state, &ledger);
        let fired = Rc::new(Cell::new(false));
        let guard = {
            let (state, ledger, fired) = (Arc::clone(&state), ledger.clone(), Rc::clone(&fired));
            let mut loads = 0u32;
            hook::install(move |point| {
                if point != Point::AtomicRead || fired.get() {
                    return;
                }
                loads += 1;
                if loads == k {
                    fired.set(true);
                    state
                        .mark_delete(p(2, 5), &ledger)
                        .expect("mark-delete forward within the layout");
                }
            })
        };
        let look = state.read_scheduling_lookup(l, e);
        drop(guard);
        if !fired.get() {
            // Fewer than k loads: every gap between two loads was probed.
            if k == 1 {
                stale_positive(
                    &mut r,
                    "hint_race: the lookup made no atomic load through the facade, so no mark-delete ran inside it".into(),
                );
            }
            return r;
        }
        r.mark_deletes_inside_lookups += 1;
        never_deleted_lookup(&mut r, l, e, &look, || {
            format!("a lookup with the mark-delete 1:999 -> 2:5 run after its load {k}")
        });
    }
    stale_positive(
        &mut r,
        format!("hint_race: a lookup made more than {MAX_LOADS_PROBED} atomic loads"),
    );
    r
}

/// Runs the stage: the writer and reader threads for `config.duration`, the
/// quiescent check, then the three deterministic parts (resets inside
/// lookups, lookups inside mark-delete writes, mark-deletes inside lookups).
pub fn run(config: &HintRaceConfig) -> HintRaceReport {
    let (ledger, state) = fresh_cursor();
    let oracle = Arc::new(Oracle::new());
    let writer_thread = {
        let (state, oracle, ledger) = (Arc::clone(&state), Arc::clone(&oracle), ledger.clone());
        std::thread::spawn(move || writer(&state, &oracle, &ledger))
    };
    let reader_threads: Vec<_> = (0..READERS)
        .map(|_| {
            let (state, oracle) = (Arc::clone(&state), Arc::clone(&oracle));
            std::thread::spawn(move || reader(&state, &oracle))
        })
        .collect();
    let deadline = Instant::now() + config.duration;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    oracle.stop.store(true, Ordering::Relaxed);
    let rounds = writer_thread.join();
    let mut report = HintRaceReport::default();
    match rounds {
        Ok(rounds) => report.rounds = rounds,
        Err(_) => {
            stale_positive(&mut report, "hint_race: the writer thread panicked".into());
        }
    }
    for t in reader_threads {
        match t.join() {
            Ok(r) => report.absorb(r),
            Err(_) => {
                stale_positive(&mut report, "hint_race: a reader thread panicked".into());
            }
        }
    }
    let acked_region = (ACKED_FROM..=LEDGERS)
        .flat_map(|l| (0..i64::from(ACKED_BELOW + 8)).map(move |e| (l, i64::from(ACKED_BASE) + e)));
    let low_region = (1..=LEDGERS)
        .flat_map(|l| (-1..i64::from(ENTRIES.min(ACKED_BELOW + 8))).map(move |e| (l, e)));
    for (l, e) in low_region.chain(acked_region) {
        {
            let hint = state.is_deleted_for_read_scheduling(l, e);
            let truth = state.is_message_deleted(Position::new(l, e));
            if hint != truth {
                report.quiescent_disagreements += 1;
                violation(
                    &mut report,
                    format!(
                        "hint_race: quiescent disagreement at {l}:{e}: hint {hint}, locked check {truth}"
                    ),
                );
            }
        }
    }
    report.absorb(resets_inside_lookups());
    report.absorb(lookups_inside_mark_delete());
    report.absorb(mark_deletes_inside_lookups());
    report
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    #[test]
    fn hint_race_on_the_real_code_is_clean_and_exercises_both_paths() {
        let r = run(&HintRaceConfig {
            duration: Duration::from_millis(200),
        });
        assert_eq!(r.violations(), 0, "{r:?}");
        assert!(r.rounds > 0 && r.lookups > 0 && r.filter_calls > 0, "{r:?}");
        assert!(r.positives > 0, "no positive at all: {r:?}");
        // Every probe of the deterministic part was overlapped by a reset.
        assert_eq!(r.overlapped_lookups, 3 * OVERLAP_ROUNDS as u64, "{r:?}");
        assert!(r.lookups_inside_writes > 0, "{r:?}");
    }

    #[test]
    fn lookups_after_every_write_of_a_mark_delete_across_ledgers_see_no_stale_positive() {
        let r = lookups_inside_mark_delete();
        assert_eq!(r.violations(), 0, "{r:?}");
        // Every mark-delete wrote through the facade at least once, and each
        // write was followed by one lookup per never-deleted probe.
        assert!(
            r.lookups_inside_writes >= u64::from(CROSSING_ROUNDS) * NEVER_DELETED.len() as u64,
            "{r:?}"
        );
        // No lookup inside the write section took the (held) lock.
        assert_eq!(r.fallbacks, 0, "{r:?}");
    }

    #[test]
    fn a_mark_delete_after_every_load_of_a_lookup_leaves_no_stale_positive() {
        let r = mark_deletes_inside_lookups();
        assert_eq!(r.violations(), 0, "{r:?}");
        // The lookup loads the reset epoch and the mark-delete at least.
        assert!(r.mark_deletes_inside_lookups >= 2, "{r:?}");
        assert_eq!(r.lookups, r.mark_deletes_inside_lookups, "{r:?}");
    }

    #[test]
    fn a_reset_inside_every_overlapped_lookup_sends_it_to_the_locked_check() {
        let r = resets_inside_lookups();
        assert_eq!(r.stale_positives, 0, "{r:?}");
        assert_eq!(r.overlapped_lookups, 3 * OVERLAP_ROUNDS as u64, "{r:?}");
        // Each overlapped lookup noticed the changed epoch.
        assert_eq!(r.fallbacks, r.overlapped_lookups, "{r:?}");
    }
}
