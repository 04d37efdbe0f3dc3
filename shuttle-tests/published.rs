//! shuttle: the published-value cell (`sync::Published`) under random and PCT
//! schedules. The scenarios are `tests/scenarios/published.rs`, shared with
//! `loom-tests/published.rs` (larger sizes here: shuttle samples schedules
//! instead of enumerating them); negative control `tests/scenarios/torn_pair.rs`.
#![cfg(feature = "shuttle")]

#[path = "../tests/scenarios/published.rs"]
mod published;
#[path = "../tests/scenarios/torn_pair.rs"]
mod torn_pair;

const ITERATIONS: usize = 2_000;

#[test]
fn published_cell_random() {
    shuttle::check_random(
        || published::monotonic_and_never_invents_values(3, 2, 4),
        ITERATIONS,
    );
}

#[test]
fn published_cell_pct() {
    shuttle::check_pct(
        || published::monotonic_and_never_invents_values(3, 2, 4),
        ITERATIONS,
        3,
    );
}

#[test]
fn rcu_never_loses_an_update_random() {
    shuttle::check_random(|| published::rcu_never_loses_an_update(3), ITERATIONS);
}

#[test]
fn published_pair_never_tears() {
    shuttle::check_random(published::pair_never_tears, ITERATIONS);
}

#[test]
#[should_panic(expected = "torn pair")]
fn negative_control_two_atomics_tear() {
    shuttle::check_random(torn_pair::two_atomics_tear, ITERATIONS);
}
