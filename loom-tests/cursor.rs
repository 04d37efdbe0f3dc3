//! loom: the lock-free read-scheduling hint of `src/cursor`
//! (`CursorDeletionState::is_deleted_for_read_scheduling`) never gives a
//! stale positive, in every interleaving (preemption bound 2; 3 with
//! `LOOM_MAX_PREEMPTIONS=3`) of an ack
//! thread (acks into an existing and a new ledger, advancing mark-delete), a
//! reset thread (moves mark-delete backward, un-deleting positions) and a
//! reader. The crate's real code runs through `crate::sync`.
//!
//! Negative controls: small test-only models of buggy orderings that loom
//! must catch: (a) the lookup without the epoch re-check, (b) mark-delete
//! published as two separate atomics, (c) a summary slot read without its
//! owner check.
//!
//! What these assertions cannot see: deleting the epoch re-check from the
//! real code passes them. Reset publishes the empty directory
//! before it moves mark-delete, so every positive a lookup can compute is
//! true in the state before or after the reset; only "still true at the
//! instant the call returns" separates the two, and a test thread cannot
//! observe that instant (any witness it reads comes after the return).
//! That stronger property is `NoStalePositive` in `specs/DeletionLookup.tla`,
//! whose `_bug_no_epoch` cfg is caught, and model (a) below; on the real
//! code, `shuttle-tests/cursor.rs` (`epoch_recheck_*`) observes the instant
//! (shuttle switches threads only at its own primitives).
#![cfg(loom)]

use loom::model::Builder;
use pulsar_core::__model::sync::{
    fence, thread, Arc, AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering,
};
use pulsar_core::cursor::{CursorDeletionState, LedgerLayout};
use pulsar_core::Position;

#[path = "../tests/common/mod.rs"]
mod common;
use common::p;

static EXECUTIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn count() {
    EXECUTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Preemption bound 2 by default (CI budget); `LOOM_MAX_PREEMPTIONS=3`
/// (read by `Builder::new`) runs the deeper search.
fn builder() -> Builder {
    let mut b = Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        b.preemption_bound = Some(2);
    }
    b
}

const NOT_STARTED: usize = 0;
const STARTED: usize = 1;
const DONE: usize = 2;

/// Before: mark-delete (1,4), (1,7) individually deleted.
/// Ack thread: acks (1,5),(1,6) (mark-delete advances through (1,7) and trims),
/// then (2,1) (a new ledger: directory republished).
/// Reset thread: reset to read position (1,3), i.e. mark-delete (1,2), clearing
/// the ranges: (1,4) and (1,7) become NOT deleted and nobody acks them again.
/// Reader (main thread): hint for (1,4), (1,7), and (2,3) (never acked).
/// `base` offsets the ledger ids: 0 exercises the packed mark-delete, 2^40
/// the `Published<Position>` fallback (ledger ids that do not pack).
fn reset_scenario(base: i64) {
    builder().check(move || {
        count();
        let p = move |l: i64, e: i64| Position::new(base + l, e);
        let ledger = LedgerLayout::new([(base + 1, 10), (base + 2, 10)]);
        let state = Arc::new(CursorDeletionState::recover(p(1, 4), &[(p(1, 6), p(1, 7))]).unwrap());
        let reset_state = Arc::new(AtomicUsize::new(NOT_STARTED));

        let acker = {
            let (state, ledger) = (Arc::clone(&state), ledger.clone());
            thread::spawn(move || {
                state.delete(&[p(1, 5), p(1, 6)], &ledger).unwrap();
                state.delete(&[p(2, 1)], &ledger).unwrap();
            })
        };
        let resetter = {
            let (state, ledger, reset_state) =
                (Arc::clone(&state), ledger.clone(), Arc::clone(&reset_state));
            thread::spawn(move || {
                reset_state.store(STARTED, Ordering::SeqCst);
                assert_eq!(state.reset(p(1, 3), &ledger).unwrap(), p(1, 2));
                reset_state.store(DONE, Ordering::SeqCst);
            })
        };

        for q in [p(1, 4), p(1, 7)] {
            let before = reset_state.load(Ordering::SeqCst);
            let look = state.read_scheduling_lookup(q.ledger_id, q.entry_id);
            if before == DONE {
                assert!(
                    !look.deleted,
                    "stale positive for {q} after a completed reset: {look:?}"
                );
            }
            if !look.fell_back && look.mark_delete_seen == Some(p(1, 2)) {
                // Saw the post-reset mark-delete without falling back: the answer
                // must be the post-reset truth.
                assert!(!look.deleted, "mixed pre/post-reset view for {q}: {look:?}");
            }
            if look.deleted && !look.fell_back {
                assert_eq!(
                    look.epoch, 0,
                    "positive computed in a post-reset epoch for {q}"
                );
            }
        }
        let never = state.read_scheduling_lookup(base + 2, 3);
        assert!(!never.deleted, "invented positive for (2,3): {never:?}");

        acker.join().unwrap();
        resetter.join().unwrap();
        // Quiescent: the hint agrees with the authoritative state.
        for q in [p(1, 4), p(1, 5), p(1, 7), p(2, 1), p(2, 3)] {
            assert_eq!(
                state.is_deleted_for_read_scheduling(q.ledger_id, q.entry_id),
                state.is_message_deleted(q),
                "quiescent disagreement at {q}"
            );
        }
        assert!(!state.is_message_deleted(p(1, 4)));
        assert_eq!(state.mark_delete_position(), p(1, 2));
    });
    eprintln!(
        "loom_cursor: reset scenario (ledger base {base}) explored {} executions so far",
        EXECUTIONS.load(std::sync::atomic::Ordering::Relaxed)
    );
}

#[test]
fn hint_never_stale_positive_with_backward_reset() {
    reset_scenario(0);
}

#[test]
fn hint_never_stale_positive_with_backward_reset_unpacked_mark_delete() {
    reset_scenario(1 << 40);
}

/// Forward-only changes (two ack threads, one writing a new ledger): a
/// positive hint is backed by the authoritative state when it returns, since
/// without a reset deletions only grow.
#[test]
fn hint_positive_implies_deleted_without_reset() {
    builder().check(|| {
        let ledger = LedgerLayout::new([(1, 4), (2, 4)]);
        let state = Arc::new(CursorDeletionState::new(p(1, -1)).unwrap());
        let a = {
            let (state, ledger) = (Arc::clone(&state), ledger.clone());
            thread::spawn(move || {
                state.delete(&[p(1, 1), p(1, 0)], &ledger).unwrap();
            })
        };
        let b = {
            let (state, ledger) = (Arc::clone(&state), ledger.clone());
            thread::spawn(move || {
                state.delete(&[p(2, 2)], &ledger).unwrap();
            })
        };
        for q in [p(1, 1), p(2, 2), p(2, 3)] {
            let look = state.read_scheduling_lookup(q.ledger_id, q.entry_id);
            if look.deleted {
                assert!(
                    state.is_message_deleted(q),
                    "positive for {q} not backed: {look:?}"
                );
            }
            assert!(!look.fell_back, "fell back without any reset: {look:?}");
        }
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(state.mark_delete_position(), p(1, 1));
        assert!(state.is_deleted_for_read_scheduling(2, 2));
        assert!(!state.is_deleted_for_read_scheduling(2, 3));
    });
}

// ---------------------------------------------------------------------------
// Negative controls: small TEST-ONLY models of buggy orderings (not the
// crate's code). Each must fail under loom.
// ---------------------------------------------------------------------------

/// Model of a reset that un-deletes entry 7 of a single ledger: before, md = 4
/// and the published bitmap has bit 7; the reset invalidates the directory
/// (bit gone for new readers) and moves md back to 2.
/// Data is read with relaxed loads, as the seqlock recipe allows when the
/// epoch re-check is present.
struct ResetModel {
    epoch: AtomicU64,
    md: AtomicI64,
    bit7_published: AtomicBool,
}

impl ResetModel {
    fn new() -> Self {
        Self {
            epoch: AtomicU64::new(0),
            md: AtomicI64::new(4),
            bit7_published: AtomicBool::new(true),
        }
    }

    fn reset(&self) {
        self.epoch.store(1, Ordering::Relaxed);
        fence(Ordering::Release);
        self.bit7_published.store(false, Ordering::Relaxed);
        self.md.store(2, Ordering::Relaxed);
        self.epoch.store(2, Ordering::Release);
    }

    /// Returns (deleted, md seen, fell back).
    fn lookup7(&self, recheck: bool) -> (bool, i64, bool) {
        let e1 = self.epoch.load(Ordering::Acquire);
        if e1 & 1 == 1 {
            return (false, -1, true); // locked path: post-reset truth for entry 7
        }
        let md = self.md.load(Ordering::Relaxed);
        let deleted = 7 <= md || self.bit7_published.load(Ordering::Relaxed);
        if recheck {
            fence(Ordering::Acquire);
            if self.epoch.load(Ordering::Relaxed) != e1 {
                return (false, md, true);
            }
        }
        (deleted, md, false)
    }
}

fn reset_model(recheck: bool) {
    loom::model(move || {
        let m = Arc::new(ResetModel::new());
        let w = {
            let m = Arc::clone(&m);
            thread::spawn(move || m.reset())
        };
        let (deleted, md_seen, fell_back) = m.lookup7(recheck);
        if !fell_back && md_seen == 2 {
            assert!(
                !deleted,
                "mixed view: post-reset mark-delete with pre-reset bitmap"
            );
        }
        w.join().unwrap();
    });
}

/// (a) Without the epoch re-check a reader can combine the post-reset
/// mark-delete with the pre-reset bitmap and answer "deleted" for an entry
/// the reset un-deleted.
#[test]
#[should_panic(expected = "mixed view: post-reset mark-delete with pre-reset bitmap")]
fn negative_control_lookup_without_epoch_recheck() {
    reset_model(false);
}

/// Sanity for (a): the same model with the re-check passes, so the failure
/// above is due to the missing re-check alone.
#[test]
fn control_model_with_epoch_recheck_passes() {
    reset_model(true);
}

/// (b) Mark-delete as two separate atomics: a forward advance (5,100) →
/// (6,3) read torn as (6,100) says (6,50) is deleted, which it never was.
#[test]
#[should_panic(expected = "torn mark-delete")]
fn negative_control_mark_delete_as_two_atomics() {
    loom::model(|| {
        let ledger = Arc::new(AtomicI64::new(5));
        let entry = Arc::new(AtomicI64::new(100));
        let w = {
            let (ledger, entry) = (Arc::clone(&ledger), Arc::clone(&entry));
            thread::spawn(move || {
                ledger.store(6, Ordering::SeqCst);
                entry.store(3, Ordering::SeqCst);
            })
        };
        let md = (ledger.load(Ordering::SeqCst), entry.load(Ordering::SeqCst));
        assert!(
            (6, 50) > md,
            "torn mark-delete {md:?} says (6,50) is deleted"
        );
        w.join().unwrap();
    });
}

/// Summary-slot reuse on the real code (one slot under loom): ledger 1's
/// bitmap lives in the slot; an ack completes ledger 1's range so
/// mark-delete passes it and the slot is freed, then an ack on ledger 2
/// takes the slot over with entry 5. (1,5) is never deleted, so the hint
/// must never say it is, whatever slot state a reader catches in passing.
#[test]
fn summary_slot_reuse_never_leaks_another_ledgers_bits() {
    builder().check(|| {
        let ledger = LedgerLayout::new([(1, 10), (2, 10)]);
        let state = Arc::new(CursorDeletionState::recover(p(1, 1), &[(p(1, 2), p(1, 3))]).unwrap());
        let acker = {
            let (state, ledger) = (Arc::clone(&state), ledger.clone());
            thread::spawn(move || {
                // (1,2) closes the gap: mark-delete → (1,3), ledger 1 trimmed.
                state.delete(&[p(1, 2)], &ledger).unwrap();
                state.delete(&[p(2, 5)], &ledger).unwrap();
            })
        };
        let look = state.read_scheduling_lookup(1, 5);
        assert!(
            !look.deleted,
            "ledger 2's entry 5 read as ledger 1's: {look:?}"
        );
        acker.join().unwrap();
        assert!(state.is_deleted_for_read_scheduling(2, 5));
        assert!(!state.is_deleted_for_read_scheduling(1, 5));
        assert_eq!(state.mark_delete_position(), p(1, 3));
    });
}

/// Test-only model of a summary slot WITHOUT the owner check under the
/// bitmap lock: a reader that found the slot tagged with ledger 1 reads
/// the bits after the slot was handed to ledger 2.
fn slot_reuse_model(check_owner: bool) {
    use loom::sync::RwLock;
    const FREE: i64 = 0;
    struct Slot {
        ledger: AtomicI64,
        /// (owner, bit mask of entries), under the bitmap lock.
        bits: RwLock<(i64, u64)>,
    }
    loom::model(move || {
        let slot = Arc::new(Slot {
            ledger: AtomicI64::new(1),
            bits: RwLock::new((1, 1 << 3)),
        });
        let w = {
            let slot = Arc::clone(&slot);
            thread::spawn(move || {
                // Ledger 1 leaves the map: free the slot, empty and untag.
                slot.ledger.store(FREE, Ordering::Release);
                *slot.bits.write().unwrap() = (FREE, 0);
                // Ledger 2 takes it over and acks entry 5.
                *slot.bits.write().unwrap() = (2, 0);
                slot.ledger.store(2, Ordering::Release);
                slot.bits.write().unwrap().1 |= 1 << 5;
            })
        };
        // Lookup of (1,5).
        let deleted = slot.ledger.load(Ordering::Acquire) == 1 && {
            let g = slot.bits.read().unwrap();
            (!check_owner || g.0 == 1) && g.1 & (1 << 5) != 0
        };
        assert!(!deleted, "slot reuse: ledger 2's bit read as ledger 1's");
        w.join().unwrap();
    });
}

/// Negative control: without the owner check the reuse leaks bits.
#[test]
#[should_panic(expected = "slot reuse: ledger 2's bit read as ledger 1's")]
fn negative_control_slot_without_owner_check() {
    slot_reuse_model(false);
}

/// Sanity for the control: with the owner check the same model passes.
#[test]
fn control_slot_with_owner_check_passes() {
    slot_reuse_model(true);
}
