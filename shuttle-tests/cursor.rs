//! shuttle: the lock-free read-scheduling hint of `src/cursor` under large
//! random and PCT (depth 3) schedules, with fixed seeds: 3 ack threads doing
//! grouped acks (mark-delete advances through contiguous ranges, acks into
//! two ledgers), a reset thread doing occasional resets (backward and
//! forward), and 2 readers. Property: when no reset overlapped a lookup,
//! a positive hint is confirmed by the authoritative (locked) check at the
//! lookup's end; a never-acknowledged position is never reported deleted.
//! The crate's real code runs through `crate::sync`.
//!
//! Negative control: a small test-only model that publishes mark-delete as
//! two separate atomics; shuttle must find the torn read.
#![cfg(feature = "shuttle")]

use std::panic::{catch_unwind, AssertUnwindSafe};

use pulsar_core::__model::sync::{thread, Arc, AtomicI64, AtomicUsize, Mutex, Ordering};
use pulsar_core::cursor::{CursorDeletionState, LedgerLayout};
use pulsar_core::Position;
use shuttle::scheduler::{PctScheduler, RandomScheduler};
use shuttle::{Config, Runner};

const ITERATIONS: usize = 10_000;
const RANDOM_SEED: u64 = 0x0004_4614_f94b;
const PCT_SEED: u64 = 0x0004_f218_5b4e;

#[path = "../tests/common/mod.rs"]
mod common;
use common::p;

fn scenario() {
    let ledger = LedgerLayout::new([(1, 12), (2, 12)]);
    let state = Arc::new(CursorDeletionState::new(p(1, -1)).unwrap());
    let resets_started = Arc::new(AtomicUsize::new(0));
    let resets_done = Arc::new(AtomicUsize::new(0));

    let mut handles = Vec::new();
    for t in 0..3i64 {
        let (state, ledger) = (Arc::clone(&state), ledger.clone());
        handles.push(thread::spawn(move || {
            // Thread t acks entries e ≡ t (mod 3) of ledger 1 (0..9) and of
            // ledger 2 (0..6), in groups of two.
            let mine: Vec<Position> = (0..9)
                .filter(|e| e % 3 == t)
                .map(|e| p(1, e))
                .chain((0..6).filter(|e| e % 3 == t).map(|e| p(2, e)))
                .collect();
            for group in mine.chunks(2) {
                state.delete(group, &ledger).unwrap();
            }
        }));
    }
    {
        let (state, ledger) = (Arc::clone(&state), ledger.clone());
        let (started, done) = (Arc::clone(&resets_started), Arc::clone(&resets_done));
        handles.push(thread::spawn(move || {
            for target in [p(1, 2), p(1, 7)] {
                thread::yield_now();
                started.fetch_add(1, Ordering::SeqCst);
                state.reset(target, &ledger).unwrap();
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for r in 0..2i64 {
        let state = Arc::clone(&state);
        let (started, done) = (Arc::clone(&resets_started), Arc::clone(&resets_done));
        handles.push(thread::spawn(move || {
            let queries = [p(1, 1 + r), p(1, 5), p(2, 2 + r), p(1, 8), p(2, 9)];
            for q in queries {
                let s0 = started.load(Ordering::SeqCst);
                let d0 = done.load(Ordering::SeqCst);
                let look = state.read_scheduling_lookup(q.ledger_id, q.entry_id);
                let authoritative = state.is_message_deleted(q);
                let s1 = started.load(Ordering::SeqCst);
                if s0 == d0 && s0 == s1 && look.deleted {
                    assert!(
                        authoritative,
                        "stale positive for {q} with no reset overlapping: {look:?}"
                    );
                }
                if q.ledger_id == 2 && q.entry_id >= 6 {
                    assert!(
                        !look.deleted,
                        "invented positive for never-acked {q}: {look:?}"
                    );
                }
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    // Quiescent: hint == authoritative everywhere.
    for l in 1..=2 {
        for e in -1..12 {
            assert_eq!(
                state.is_deleted_for_read_scheduling(l, e),
                state.is_message_deleted(p(l, e)),
                "quiescent disagreement at {l}:{e}"
            );
        }
    }
    assert_eq!(state.reset_epoch(), 4);
}

#[test]
fn hint_random_schedules() {
    let runner = Runner::new(
        RandomScheduler::new_from_seed(RANDOM_SEED, ITERATIONS),
        Config::new(),
    );
    let n = runner.run(scenario);
    assert_eq!(n, ITERATIONS);
    eprintln!("shuttle_cursor: {n} random schedules (seed {RANDOM_SEED:#x})");
}

#[test]
fn hint_pct_depth3_schedules() {
    let runner = Runner::new(
        PctScheduler::new_from_seed(PCT_SEED, 3, ITERATIONS),
        Config::new(),
    );
    let n = runner.run(scenario);
    assert_eq!(n, ITERATIONS);
    eprintln!("shuttle_cursor: {n} PCT depth-3 schedules (seed {PCT_SEED:#x})");
}

/// Test-only model: mark-delete as two separate atomics next to the
/// authoritative value under a lock. The writer advances (5,100) → (6,3) in
/// one locked section; the lock-free reader may read (6,100).
fn torn_mark_delete_model() {
    let ledger = Arc::new(AtomicI64::new(5));
    let entry = Arc::new(AtomicI64::new(100));
    let authoritative = Arc::new(Mutex::new((5i64, 100i64)));
    let w = {
        let (ledger, entry, authoritative) = (
            Arc::clone(&ledger),
            Arc::clone(&entry),
            Arc::clone(&authoritative),
        );
        thread::spawn(move || {
            let mut g = authoritative.lock();
            ledger.store(6, Ordering::SeqCst);
            entry.store(3, Ordering::SeqCst);
            *g = (6, 3);
        })
    };
    let md = (ledger.load(Ordering::SeqCst), entry.load(Ordering::SeqCst));
    let hint = (6, 50) <= md;
    let truth = (6, 50) <= *authoritative.lock();
    if hint {
        assert!(truth, "torn mark-delete {md:?}: stale positive for (6,50)");
    }
    w.join().unwrap();
}

#[test]
fn negative_control_mark_delete_as_two_atomics_is_caught() {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let runner = Runner::new(
            PctScheduler::new_from_seed(PCT_SEED, 3, ITERATIONS),
            Config::new(),
        );
        runner.run(torn_mark_delete_model);
    }));
    let err = result.expect_err("shuttle must find the torn mark-delete read");
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        msg.contains("torn mark-delete"),
        "unexpected failure: {msg}"
    );
}

// ---------------------------------------------------------------------------
// Mark-delete crossing a ledger boundary, and the post-I/O filter racing
// grouped acks on the same ledger (the real code; the mutation suite's
// patches `cursor_torn_mark_delete` and `cursor_filter_trusts_hint` are the
// negative controls: each makes one of these fail).
// ---------------------------------------------------------------------------

const BOUNDARY_ITERATIONS: usize = 3_000;

/// A writer moves mark-delete 1:998 → 1:999 → 2:5 → 2:6 (across the ledger
/// boundary, one explicit mark-delete each) while a reader runs lock-free
/// lookups. Without resets deletions only grow, so every positive must be
/// backed by the authoritative check afterwards, and 2:500 / 2:7 (never
/// deleted) must never be reported deleted: a mark-delete read as
/// (new ledger id, old entry id) = 2:999 would say they are.
fn mark_delete_boundary_scenario() {
    let ledger = LedgerLayout::new([(1, 1000), (2, 1000)]);
    let state = Arc::new(CursorDeletionState::new(p(1, 998)).unwrap());
    let writer = {
        let (state, ledger) = (Arc::clone(&state), ledger.clone());
        thread::spawn(move || {
            for md in [p(1, 999), p(2, 5), p(2, 6)] {
                assert_eq!(state.mark_delete(md, &ledger).unwrap(), md);
            }
        })
    };
    for _ in 0..3 {
        for q in [p(2, 500), p(2, 7), p(2, 5), p(1, 999)] {
            let look = state.read_scheduling_lookup(q.ledger_id, q.entry_id);
            if look.deleted {
                assert!(
                    state.is_message_deleted(q),
                    "stale positive for {q} while mark-delete crossed a ledger boundary: {look:?}"
                );
            }
            if q.ledger_id == 2 && q.entry_id > 6 {
                assert!(
                    !look.deleted,
                    "stale positive for never-deleted {q} (torn mark-delete?): {look:?}"
                );
            }
        }
    }
    writer.join().unwrap();
    assert_eq!(state.mark_delete_position(), p(2, 6));
    assert!(!state.is_deleted_for_read_scheduling(2, 7));
    assert!(state.is_deleted_for_read_scheduling(2, 6));
}

#[test]
fn mark_delete_across_ledger_boundary_random_schedules() {
    let runner = Runner::new(
        RandomScheduler::new_from_seed(RANDOM_SEED, BOUNDARY_ITERATIONS),
        Config::new(),
    );
    assert_eq!(
        runner.run(mark_delete_boundary_scenario),
        BOUNDARY_ITERATIONS
    );
}

#[test]
fn mark_delete_across_ledger_boundary_pct_schedules() {
    let runner = Runner::new(
        PctScheduler::new_from_seed(PCT_SEED, 3, BOUNDARY_ITERATIONS),
        Config::new(),
    );
    assert_eq!(
        runner.run(mark_delete_boundary_scenario),
        BOUNDARY_ITERATIONS
    );
}

/// An acker deletes 1:3, records that it returned, then keeps grouped-acking
/// other entries of ledger 1 (holding that ledger's bitmap write lock for
/// each group); (1,0) stays unacked so mark-delete never moves. A reader
/// filters the read batch [1:2, 1:3, 1:4]: once the 1:3 ack has returned
/// before the filter started, 1:3 must never come back (Pulsar's
/// `filterReadEntries` is the correctness boundary after a read scheduled
/// with the hint; the hint itself may say "not deleted" while a group holds
/// the bitmap).
fn filter_vs_grouped_acks_scenario() {
    let ledger = LedgerLayout::new([(1, 40)]);
    let state = Arc::new(CursorDeletionState::new(p(1, -1)).unwrap());
    let acked_3 = Arc::new(AtomicUsize::new(0));
    let acker = {
        let (state, ledger, acked_3) = (Arc::clone(&state), ledger.clone(), Arc::clone(&acked_3));
        thread::spawn(move || {
            state.delete(&[p(1, 3)], &ledger).unwrap();
            acked_3.store(1, Ordering::SeqCst);
            for first in (7..31).step_by(4) {
                let group: Vec<Position> = (first..first + 4).map(|e| p(1, e)).collect();
                state.delete(&group, &ledger).unwrap();
            }
        })
    };
    for _ in 0..6 {
        let acked_before = acked_3.load(Ordering::SeqCst) == 1;
        let out = state.filter_read_entries(vec![p(1, 2), p(1, 3), p(1, 4)], |q| *q);
        if acked_before {
            assert_eq!(
                out,
                vec![p(1, 2), p(1, 4)],
                "filter leak: 1:3 was acked before the filter started"
            );
        }
        assert!(
            out.contains(&p(1, 2)) && out.contains(&p(1, 4)),
            "filter dropped a live entry: {out:?}"
        );
        thread::yield_now();
    }
    acker.join().unwrap();
    assert_eq!(
        state.filter_read_entries(vec![p(1, 2), p(1, 3), p(1, 7)], |q| *q),
        vec![p(1, 2)]
    );
}

#[test]
fn filter_never_returns_entry_acked_before_it_random_schedules() {
    let runner = Runner::new(
        RandomScheduler::new_from_seed(RANDOM_SEED, BOUNDARY_ITERATIONS),
        Config::new(),
    );
    assert_eq!(
        runner.run(filter_vs_grouped_acks_scenario),
        BOUNDARY_ITERATIONS
    );
}

#[test]
fn filter_never_returns_entry_acked_before_it_pct_schedules() {
    let runner = Runner::new(
        PctScheduler::new_from_seed(PCT_SEED, 3, BOUNDARY_ITERATIONS),
        Config::new(),
    );
    assert_eq!(
        runner.run(filter_vs_grouped_acks_scenario),
        BOUNDARY_ITERATIONS
    );
}

/// The epoch re-check, observed from a test thread. Shuttle switches threads
/// only at its own synchronisation calls, so a flag kept in a plain
/// `std::sync::atomic` and written right after `reset` returns (read right
/// after the lookup returns) says exactly whether the reset had completed
/// when the lookup's last step ran. Ledgers 1–5 each have entry 5
/// individually deleted; ledger 5 is beyond the summary slots, so its bitmap
/// is reached through the published directory, whose old snapshot keeps the
/// retired bitmap (and its bits) alive after the reset. The reset moves
/// mark-delete to 1:-1 and clears every range: 5:5 is no longer deleted,
/// and a lookup that returns after the reset completed must say so. A
/// lookup without the epoch re-check can take the old snapshot before the
/// reset and read the retired bitmap after it (the mutant
/// `cursor_no_epoch_recheck` is this check's negative control).
fn epoch_recheck_scenario() {
    use std::sync::atomic::{AtomicBool as StdAtomicBool, Ordering as StdOrdering};
    let ledger = LedgerLayout::new((1..=5).map(|l| (l, 10)));
    let ranges: Vec<(Position, Position)> = (1..=5).map(|l| (p(l, 4), p(l, 5))).collect();
    let state = Arc::new(CursorDeletionState::recover(p(1, -1), &ranges).unwrap());
    // Not a shuttle primitive on purpose: no scheduling point around it.
    let reset_done = Arc::new(StdAtomicBool::new(false));
    let resetter = {
        let (state, reset_done) = (Arc::clone(&state), Arc::clone(&reset_done));
        thread::spawn(move || {
            assert_eq!(state.reset(p(1, 0), &ledger).unwrap(), p(1, -1));
            reset_done.store(true, StdOrdering::SeqCst);
        })
    };
    for q in [p(5, 5), p(4, 5), p(5, 5), p(5, 5)] {
        let look = state.read_scheduling_lookup(q.ledger_id, q.entry_id);
        if reset_done.load(StdOrdering::SeqCst) {
            assert!(
                !look.deleted,
                "stale positive for {q}: the reset that un-deleted it completed before the lookup returned: {look:?}"
            );
        }
    }
    resetter.join().unwrap();
    assert!(!state.is_deleted_for_read_scheduling(5, 5));
}

#[test]
fn epoch_recheck_no_positive_after_a_completed_reset_random_schedules() {
    let runner = Runner::new(
        RandomScheduler::new_from_seed(RANDOM_SEED, BOUNDARY_ITERATIONS),
        Config::new(),
    );
    assert_eq!(runner.run(epoch_recheck_scenario), BOUNDARY_ITERATIONS);
}

#[test]
fn epoch_recheck_no_positive_after_a_completed_reset_pct_schedules() {
    let runner = Runner::new(
        PctScheduler::new_from_seed(PCT_SEED, 3, BOUNDARY_ITERATIONS),
        Config::new(),
    );
    assert_eq!(runner.run(epoch_recheck_scenario), BOUNDARY_ITERATIONS);
}
