//! shuttle: the lock-free read-scheduling hint of `src/deletion` under large
//! random and PCT (depth 3) schedules, with fixed seeds. The scenarios and
//! their negative controls are `tests/scenarios/cursor.rs` (see its docs),
//! shared with `loom-tests/cursor.rs`: every loom scenario runs here too,
//! plus the "shuttle only" ones, except negative control (a)
//! (`reset_model`), which needs loom's weak-memory model (shuttle runs
//! sequentially consistent, where that reordering cannot happen). On the real code the mutation suite's
//! `cursor_torn_mark_delete`, `cursor_filter_trusts_hint` and
//! `cursor_no_epoch_recheck` patches are negative controls: each makes one
//! of these fail.
#![cfg(feature = "shuttle")]

use shuttle::scheduler::{PctScheduler, RandomScheduler};
use shuttle::{Config, Runner};

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/scenarios/cursor.rs"]
mod cursor;
#[path = "../tests/scenarios/torn_pair.rs"]
mod torn_pair;

const RANDOM_SEED: u64 = 0x0004_4614_f94b;
const PCT_SEED: u64 = 0x0004_f218_5b4e;
/// Schedules for the large grouped-acks scenario.
const ITERATIONS: usize = 10_000;
/// Schedules for every other scenario.
const SMALL_ITERATIONS: usize = 3_000;

fn random(iterations: usize, scenario: impl Fn() + Send + Sync + 'static) {
    let runner = Runner::new(
        RandomScheduler::new_from_seed(RANDOM_SEED, iterations),
        Config::new(),
    );
    assert_eq!(runner.run(scenario), iterations);
}

fn pct(iterations: usize, scenario: impl Fn() + Send + Sync + 'static) {
    let runner = Runner::new(
        PctScheduler::new_from_seed(PCT_SEED, 3, iterations),
        Config::new(),
    );
    assert_eq!(runner.run(scenario), iterations);
}

/// Runs `scenario` under `iterations` random schedules, then as many PCT
/// depth-3 schedules (fixed seeds), and checks that every one ran.
fn check(name: &str, iterations: usize, scenario: impl Fn() + Send + Sync + 'static) {
    let scenario = std::sync::Arc::new(scenario);
    let s = std::sync::Arc::clone(&scenario);
    random(iterations, move || s());
    pct(iterations, move || scenario());
    eprintln!("shuttle_cursor: {name}: {iterations} random + {iterations} PCT depth-3 schedules");
}

#[test]
fn hint_random_schedules() {
    random(ITERATIONS, cursor::grouped_acks_with_resets);
}

#[test]
fn hint_pct_depth3_schedules() {
    pct(ITERATIONS, cursor::grouped_acks_with_resets);
}

#[test]
fn hint_never_stale_positive_with_backward_reset() {
    check("backward reset", SMALL_ITERATIONS, || {
        cursor::backward_reset(0)
    });
    check(
        "backward reset, unpacked mark-delete",
        SMALL_ITERATIONS,
        || cursor::backward_reset(1 << 40),
    );
}

#[test]
fn hint_positive_implies_deleted_without_reset() {
    check(
        "forward only",
        SMALL_ITERATIONS,
        cursor::positive_implies_deleted_without_reset,
    );
}

#[test]
fn summary_slot_reuse_never_leaks_another_ledgers_bits() {
    check(
        "summary slot reuse",
        SMALL_ITERATIONS,
        cursor::summary_slot_reuse,
    );
}

#[test]
fn summary_slot_reuse_inside_old_bounds_never_leaks_another_ledgers_bits() {
    check(
        "summary slot reuse inside old bounds",
        SMALL_ITERATIONS,
        cursor::summary_slot_reuse_directory,
    );
}

#[test]
fn summary_slot_reuse_by_two_writer_threads_never_leaks_another_ledgers_bits() {
    check(
        "summary slot reuse by two writer threads",
        SMALL_ITERATIONS,
        cursor::summary_slot_reuse_two_writers,
    );
}

#[test]
fn mark_delete_across_ledger_boundary() {
    check(
        "mark-delete across a ledger boundary",
        SMALL_ITERATIONS,
        cursor::mark_delete_across_ledger_boundary,
    );
}

#[test]
fn filter_never_returns_entry_acked_before_it() {
    check(
        "filter vs grouped acks",
        SMALL_ITERATIONS,
        cursor::filter_vs_grouped_acks,
    );
}

#[test]
fn epoch_recheck_no_positive_after_a_completed_reset() {
    check(
        "epoch re-check observed",
        SMALL_ITERATIONS,
        cursor::epoch_recheck_observed,
    );
}

#[test]
#[should_panic(expected = "torn pair")]
fn negative_control_mark_delete_as_two_atomics_is_caught() {
    shuttle::check_pct(torn_pair::two_atomics_tear, SMALL_ITERATIONS, 3);
}

#[test]
#[should_panic(expected = "slot reuse: ledger 2's bit read as ledger 1's")]
fn negative_control_mirror_read_without_version_validation() {
    shuttle::check_pct(
        || cursor::slot_reuse_model(cursor::MirrorRead::Unvalidated),
        SMALL_ITERATIONS,
        3,
    );
}

#[test]
fn control_mirror_read_validated_passes() {
    check(
        "mirror read with version validation",
        SMALL_ITERATIONS,
        || cursor::slot_reuse_model(cursor::MirrorRead::Validated),
    );
}
