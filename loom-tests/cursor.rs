//! loom: the lock-free read-scheduling hint of `src/deletion` never gives a
//! stale positive, in every interleaving (preemption bound 2; 3 with
//! `LOOM_MAX_PREEMPTIONS=3`). The scenarios and their negative controls are
//! `tests/scenarios/cursor.rs` (see its docs for what each checks and what
//! the assertions cannot see), shared with `shuttle-tests/cursor.rs`; the
//! "shuttle only" ones are too large for loom.
#![cfg(loom)]

use loom::model::Builder;

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/scenarios/cursor.rs"]
mod cursor;
#[path = "../tests/scenarios/torn_pair.rs"]
mod torn_pair;

/// Preemption bound 2 by default (CI budget); `LOOM_MAX_PREEMPTIONS=3`
/// (read by `Builder::new`) runs the deeper search.
fn check(scenario: impl Fn() + Sync + Send + 'static) {
    let mut b = Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        b.preemption_bound = Some(2);
    }
    b.check(scenario);
}

#[test]
fn hint_never_stale_positive_with_backward_reset() {
    check(|| cursor::backward_reset(0));
}

#[test]
fn hint_never_stale_positive_with_backward_reset_unpacked_mark_delete() {
    check(|| cursor::backward_reset(1 << 40));
}

#[test]
fn hint_positive_implies_deleted_without_reset() {
    check(cursor::positive_implies_deleted_without_reset);
}

#[test]
fn summary_slot_reuse_never_leaks_another_ledgers_bits() {
    check(cursor::summary_slot_reuse);
}

#[test]
fn summary_slot_reuse_inside_old_bounds_never_leaks_another_ledgers_bits() {
    check(cursor::summary_slot_reuse_directory);
}

#[test]
fn summary_slot_reuse_by_two_writer_threads_never_leaks_another_ledgers_bits() {
    check(cursor::summary_slot_reuse_two_writers);
}

/// (a) Without the epoch re-check a reader can combine the post-reset
/// mark-delete with the pre-reset bitmap.
#[test]
#[should_panic(expected = "mixed view: post-reset mark-delete with pre-reset bitmap")]
fn negative_control_lookup_without_epoch_recheck() {
    loom::model(|| cursor::reset_model(false));
}

/// Sanity for (a): with the re-check the same model passes.
#[test]
fn control_model_with_epoch_recheck_passes() {
    loom::model(|| cursor::reset_model(true));
}

/// (b) Mark-delete as two separate atomics tears.
#[test]
#[should_panic(expected = "torn pair")]
fn negative_control_mark_delete_as_two_atomics() {
    loom::model(torn_pair::two_atomics_tear);
}

/// (c) A mirror read without the version validation leaks a reused
/// slot's new bits.
#[test]
#[should_panic(expected = "slot reuse: ledger 2's bit read as ledger 1's")]
fn negative_control_mirror_read_without_version_validation() {
    loom::model(|| cursor::slot_reuse_model(cursor::MirrorRead::Unvalidated));
}

/// (d) The version re-load without the Acquire fence before it can return
/// the old version after the word load saw the new owner's bit.
#[test]
#[should_panic(expected = "slot reuse: ledger 2's bit read as ledger 1's")]
fn negative_control_mirror_read_without_acquire_fence() {
    loom::model(|| cursor::slot_reuse_model(cursor::MirrorRead::NoFence));
}

/// Sanity for (c) and (d): the crate's validated read passes the same model.
#[test]
fn control_mirror_read_validated_passes() {
    loom::model(|| cursor::slot_reuse_model(cursor::MirrorRead::Validated));
}

/// (e) A mirror bit set with a Relaxed store by another writer thread than
/// the one that re-tagged the slot leaks the new owner's bit.
#[test]
#[should_panic(expected = "slot reuse: ledger 2's bit read as ledger 1's")]
fn negative_control_mirror_set_relaxed_in_another_writer_thread() {
    loom::model(|| cursor::two_writer_set_model(false));
}

/// Sanity for (e): the crate's Release set store passes the same model.
#[test]
fn control_mirror_set_release_in_another_writer_thread_passes() {
    loom::model(|| cursor::two_writer_set_model(true));
}
