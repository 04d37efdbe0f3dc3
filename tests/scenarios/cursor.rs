//! The concurrent scenarios of `src/deletion` (the lock-free read-scheduling
//! hint, `CursorDeletionState::is_deleted_for_read_scheduling`), written once
//! against the crate's sync facade and run by `loom-tests/cursor.rs`
//! (exhaustively, preemption bound 2; 3 with `LOOM_MAX_PREEMPTIONS=3`) and
//! `shuttle-tests/cursor.rs` (random and PCT schedules, fixed seeds). The
//! crate's real code runs through `crate::sync`. Scenarios marked "shuttle
//! only" are too large for loom's exhaustive search.
//!
//! Negative controls: small test-only models of buggy orderings that both
//! checkers must catch: (a) the lookup without the epoch re-check
//! ([`reset_model`]), (b) mark-delete published as two separate atomics
//! (`torn_pair.rs`), (c) a summary slot's lock-free bitmap read without
//! the mirror's version validation and (d) the validation without its
//! Acquire fence (loom only) ([`slot_reuse_model`]), (e) a bit set with a
//! Relaxed store by another writer thread than the re-tag's (loom only,
//! [`two_writer_set_model`]); on the real code, the mutation suite's
//! `cursor_*` patches.
//!
//! What the real-code assertions of [`backward_reset`] cannot see: deleting
//! the epoch re-check from the real code passes them. Reset publishes the
//! empty directory before it moves mark-delete, so every positive a lookup
//! can compute is true in the state before or after the reset; only "still
//! true at the instant the call returns" separates the two, and a loom test
//! thread cannot observe that instant (any witness it reads comes after the
//! return). That stronger property is `NoStalePositive` in
//! `specs/DeletionLookup.tla`, whose `_bug_no_epoch` cfg is caught, and
//! model (a); on the real code, [`epoch_recheck_observed`] observes the
//! instant under shuttle (which switches threads only at its own
//! primitives).

#[cfg(loom)]
use pulsar_core::__model::sync::AtomicBool;
use pulsar_core::__model::sync::{fence, thread, Arc, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use pulsar_core::deletion::{CursorDeletionState, LedgerLayout};
use pulsar_core::Position;

use crate::common::p;

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
pub fn backward_reset(base: i64) {
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
}

/// Forward-only changes (two ack threads, one writing a new ledger): a
/// positive hint is backed by the authoritative state when it returns, since
/// without a reset deletions only grow.
pub fn positive_implies_deleted_without_reset() {
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
}

#[cfg(loom)] // loom only: needs weak memory
/// Model of a reset that un-deletes entry 7 of a single ledger: before, md = 4
/// and the published bitmap has bit 7; the reset invalidates the directory
/// (bit gone for new readers) and moves md back to 2.
/// Data is read with relaxed loads, as the seqlock recipe allows when the
/// epoch re-check is present.
pub struct ResetModel {
    epoch: AtomicU64,
    md: AtomicI64,
    bit7_published: AtomicBool,
}

#[cfg(loom)] // loom only: needs weak memory
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

#[cfg(loom)] // loom only: needs weak memory
/// `recheck: false` is negative control (a): it must fail with "mixed view".
/// Loom only: the reordering it needs (md seen new, bit seen old, though
/// the bit is cleared first) exists only in loom's weak-memory model.
pub fn reset_model(recheck: bool) {
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
}

/// Summary-slot reuse on the real code (one slot under loom, so the reuse is
/// forced; under shuttle's four slots ledger 2 may take another): ledger 1's
/// bitmap lives in the slot; an ack completes ledger 1's range so
/// mark-delete passes it and the slot is freed, then an ack on ledger 2
/// takes the slot over with entry 5. (1,5) is never deleted, so the hint
/// must never say it is, whatever slot state a reader catches in passing.
pub fn summary_slot_reuse() {
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
}

/// Summary-slot reuse on the real directory, with a bitmap whose bounds
/// admit the queried entry (one slot under loom, so the reuse is forced):
/// ledger 1 holds entries 3 and 7 in the slot; the writer trims ledger 1
/// through entry 7 (it leaves the map and frees the slot), then adds (2,5),
/// which takes the slot over. (1,5) is never in the set, so the directory
/// must never report it: a reader can pass ledger 1's old tag and bounds
/// (3..=7) and then read the word in which ledger 2's entry 5 is set; only
/// the mirror's version validation (or the owner check under the lock,
/// above the mirror) stops it.
pub fn summary_slot_reuse_directory() {
    use pulsar_core::deletion::PositionRangeSet;
    let mut set = PositionRangeSet::new();
    set.add(p(1, 3)).unwrap();
    set.add(p(1, 7)).unwrap();
    let dir = set.directory();
    let writer = thread::spawn(move || {
        set.remove_at_most(1, 7).unwrap();
        set.add(p(2, 5)).unwrap();
        set
    });
    assert!(
        !dir.contains(1, 5),
        "ledger 2's entry 5 read as ledger 1's through a reused slot"
    );
    let set = writer.join().unwrap();
    assert!(dir.contains(2, 5) && set.contains(2, 5));
    assert!(!dir.contains(1, 3) && !dir.contains(1, 5));
}

/// Summary-slot reuse with the re-tag and a later set made by different
/// writer threads (the set's owner serialises them with a lock, as the
/// cursor does): thread A trims ledger 1 through entry 7 (it leaves the
/// map and frees the slot) and adds (2,5), which re-tags the slot; thread B
/// then adds (2,6), into the same mirror word. (1,6) is never in the set. A
/// reader that passes ledger 1's old tag and bounds (3..=7) and reads B's
/// word must see the re-tag's version bracket on its re-check: B's store
/// carries A's bracket to it only because mirror sets are Release stores
/// (B's thread has no fence of its own).
pub fn summary_slot_reuse_two_writers() {
    use pulsar_core::__model::sync::Mutex;
    use pulsar_core::deletion::PositionRangeSet;
    let set = Arc::new(Mutex::new(PositionRangeSet::new()));
    let dir = {
        let mut s = set.lock();
        s.add(p(1, 3)).unwrap();
        s.add(p(1, 7)).unwrap();
        s.directory()
    };
    let a = {
        let set = Arc::clone(&set);
        thread::spawn(move || {
            let mut s = set.lock();
            s.remove_at_most(1, 7).unwrap();
            s.add(p(2, 5)).unwrap();
        })
    };
    let b = {
        let set = Arc::clone(&set);
        thread::spawn(move || {
            set.lock().add(p(2, 6)).unwrap();
        })
    };
    assert!(
        !dir.contains(1, 6),
        "ledger 2's entry 6 read as ledger 1's through a reused slot"
    );
    a.join().unwrap();
    b.join().unwrap();
    assert!(dir.contains(2, 6) && !dir.contains(1, 6));
}

/// How the test-only model of a mirror read ([`slot_reuse_model`])
/// validates what it read.
#[derive(Clone, Copy, Debug)]
pub enum MirrorRead {
    /// The crate's read (`BitMirror::contains_validated`): version load
    /// (Acquire), owner check and word load, Acquire fence, version re-load.
    Validated,
    /// No version re-load: negative control (c), caught by loom and shuttle.
    Unvalidated,
    /// The re-load without the Acquire fence before it: negative control
    /// (d), caught by loom only (shuttle's schedules are sequentially
    /// consistent, so a missing fence is invisible to it).
    #[cfg(loom)]
    NoFence,
}

/// Test-only model of a summary slot's lock-free mirror read (the
/// crate's `BitMirror` reduced to one word): the slot is tagged with ledger
/// 1; a writer frees it, hands it to ledger 2 (clear + owner change inside
/// one version bracket: odd, Release fence, stores, even with Release) and
/// sets entry 5 (a plain store, no bracket). The reader looks up (1,5),
/// which is never deleted. `Validated` must pass; the controls must fail
/// with "slot reuse".
pub fn slot_reuse_model(read: MirrorRead) {
    const FREE: i64 = 0;
    struct Slot {
        ledger: AtomicI64,
        version: AtomicU64,
        owner: AtomicI64,
        word: AtomicU64,
    }
    let slot = Arc::new(Slot {
        ledger: AtomicI64::new(1),
        version: AtomicU64::new(0),
        owner: AtomicI64::new(1),
        word: AtomicU64::new(1 << 3),
    });
    let w = {
        let slot = Arc::clone(&slot);
        thread::spawn(move || {
            let bracket = |f: &dyn Fn()| {
                let v = slot.version.load(Ordering::Relaxed);
                slot.version.store(v + 1, Ordering::Relaxed);
                fence(Ordering::Release);
                f();
                slot.version.store(v + 2, Ordering::Release);
            };
            // Ledger 1 leaves the map: free the slot, empty and untag.
            slot.ledger.store(FREE, Ordering::Release);
            bracket(&|| {
                slot.word.store(0, Ordering::Relaxed);
                slot.owner.store(FREE, Ordering::Relaxed);
            });
            // Ledger 2 takes it over and acks entry 5.
            bracket(&|| slot.owner.store(2, Ordering::Relaxed));
            slot.ledger.store(2, Ordering::Release);
            let word = slot.word.load(Ordering::Relaxed);
            slot.word.store(word | 1 << 5, Ordering::Relaxed);
        })
    };
    // Lookup of (1,5).
    let deleted = slot.ledger.load(Ordering::Acquire) == 1 && {
        let v1 = slot.version.load(Ordering::Acquire);
        v1 & 1 == 0
            && slot.owner.load(Ordering::Relaxed) == 1
            && slot.word.load(Ordering::Relaxed) & (1 << 5) != 0
            && match read {
                MirrorRead::Validated => {
                    fence(Ordering::Acquire);
                    slot.version.load(Ordering::Relaxed) == v1
                }
                #[cfg(loom)]
                MirrorRead::NoFence => slot.version.load(Ordering::Relaxed) == v1,
                MirrorRead::Unvalidated => true,
            }
    };
    assert!(!deleted, "slot reuse: ledger 2's bit read as ledger 1's");
    w.join().unwrap();
}

/// Test-only model of a mirror bit set by another writer thread than the
/// one that re-tagged the bitmap (the writers hand over through a lock, as
/// the bitmap's write lock does): A re-tags the word from ledger 1 to 2
/// inside a version bracket; B, after A, sets ledger 2's entry 6. The reader
/// validates ledger 1 and looks up (1,6), never deleted. `release_set:
/// false` (a Relaxed set store) is negative control (e), caught by loom
/// only: B's thread has no release fence, so the reader's Acquire fence
/// synchronises with nothing and its version re-load may return the old
/// version.
#[cfg(loom)]
pub fn two_writer_set_model(release_set: bool) {
    use pulsar_core::__model::sync::Mutex;
    struct Slot {
        version: AtomicU64,
        owner: AtomicI64,
        word: AtomicU64,
        lock: Mutex<()>,
    }
    let slot = Arc::new(Slot {
        version: AtomicU64::new(0),
        owner: AtomicI64::new(1),
        word: AtomicU64::new(1 << 3),
        lock: Mutex::new(()),
    });
    let a = {
        let slot = Arc::clone(&slot);
        thread::spawn(move || {
            let _g = slot.lock.lock();
            slot.version.store(1, Ordering::Relaxed);
            fence(Ordering::Release);
            slot.word.store(0, Ordering::Relaxed);
            slot.owner.store(2, Ordering::Relaxed);
            slot.version.store(2, Ordering::Release);
        })
    };
    let b = {
        let slot = Arc::clone(&slot);
        thread::spawn(move || {
            let _g = slot.lock.lock();
            if slot.owner.load(Ordering::Relaxed) == 2 {
                let order = if release_set {
                    Ordering::Release
                } else {
                    Ordering::Relaxed
                };
                let w = slot.word.load(Ordering::Relaxed);
                slot.word.store(w | 1 << 6, order);
            }
        })
    };
    let v1 = slot.version.load(Ordering::Acquire);
    let deleted = v1 & 1 == 0
        && slot.owner.load(Ordering::Relaxed) == 1
        && slot.word.load(Ordering::Relaxed) & (1 << 6) != 0
        && {
            fence(Ordering::Acquire);
            slot.version.load(Ordering::Relaxed) == v1
        };
    assert!(!deleted, "slot reuse: ledger 2's bit read as ledger 1's");
    a.join().unwrap();
    b.join().unwrap();
}

#[cfg(not(loom))] // shuttle only
/// Shuttle only (too many threads and steps for loom's exhaustive search):
/// 3 ack threads doing grouped acks (mark-delete advances through contiguous
/// ranges, acks into two ledgers), a reset thread doing occasional resets
/// (backward and forward), and 2 readers. When no reset overlapped a lookup,
/// a positive hint is confirmed by the authoritative (locked) check at the
/// lookup's end; a never-acknowledged position is never reported deleted.
pub fn grouped_acks_with_resets() {
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

#[cfg(not(loom))] // shuttle only
/// Shuttle only. A writer moves mark-delete 1:998 → 1:999 → 2:5 → 2:6 (across the ledger
/// boundary, one explicit mark-delete each) while a reader runs lock-free
/// lookups. Without resets deletions only grow, so every positive must be
/// backed by the authoritative check afterwards, and 2:500 / 2:7 (never
/// deleted) must never be reported deleted: a mark-delete read as
/// (new ledger id, old entry id) = 2:999 would say they are.
pub fn mark_delete_across_ledger_boundary() {
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

#[cfg(not(loom))] // shuttle only
/// Shuttle only (six grouped acks against six filters).
/// An acker deletes B+3 of ledger 1, records that it returned, then keeps
/// grouped-acking other entries of ledger 1 (holding that ledger's bitmap
/// write lock for each group); (1,0) stays unacked so mark-delete never
/// moves. A reader filters the read batch [B+2, B+3, B+4]: once the B+3 ack
/// has returned before the filter started, B+3 must never come back
/// (Pulsar's `filterReadEntries` is the correctness boundary after a read
/// scheduled with the hint). B = 65,536: above the bitmap's lock-free
/// mirror, where the hint says "not deleted" while a group holds the
/// bitmap, so a filter that trusted the hint leaks (the mutant
/// `cursor_filter_trusts_hint` is this check's negative control).
pub fn filter_vs_grouped_acks() {
    const B: i64 = 65_536;
    let ledger = LedgerLayout::new([(1, B as u32 + 40)]);
    let state = Arc::new(CursorDeletionState::new(p(1, -1)).unwrap());
    let acked_3 = Arc::new(AtomicUsize::new(0));
    let acker = {
        let (state, ledger, acked_3) = (Arc::clone(&state), ledger.clone(), Arc::clone(&acked_3));
        thread::spawn(move || {
            state.delete(&[p(1, B + 3)], &ledger).unwrap();
            acked_3.store(1, Ordering::SeqCst);
            for first in (7..31).step_by(4) {
                let group: Vec<Position> = (first..first + 4).map(|e| p(1, B + e)).collect();
                state.delete(&group, &ledger).unwrap();
            }
        })
    };
    let batch = || vec![p(1, B + 2), p(1, B + 3), p(1, B + 4)];
    for _ in 0..6 {
        let acked_before = acked_3.load(Ordering::SeqCst) == 1;
        let out = state.filter_read_entries(batch(), |q| *q);
        if acked_before {
            assert_eq!(
                out,
                vec![p(1, B + 2), p(1, B + 4)],
                "filter leak: 1:B+3 was acked before the filter started"
            );
        }
        assert!(
            out.contains(&p(1, B + 2)) && out.contains(&p(1, B + 4)),
            "filter dropped a live entry: {out:?}"
        );
        thread::yield_now();
    }
    acker.join().unwrap();
    assert_eq!(
        state.filter_read_entries(vec![p(1, B + 2), p(1, B + 3), p(1, B + 7)], |q| *q),
        vec![p(1, B + 2)]
    );
}

#[cfg(not(loom))] // shuttle only
/// Shuttle only. The epoch re-check, observed from a test thread. Shuttle switches threads
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
pub fn epoch_recheck_observed() {
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
