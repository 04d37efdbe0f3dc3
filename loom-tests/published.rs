//! loom: the published-value cell (`sync::Published`) in every interleaving.
//! The scenarios are `tests/scenarios/published.rs`, shared with
//! `shuttle-tests/published.rs`; negative control `tests/scenarios/torn_pair.rs`.
#![cfg(loom)]

#[path = "../tests/scenarios/published.rs"]
mod published;
#[path = "../tests/scenarios/torn_pair.rs"]
mod torn_pair;

#[test]
fn published_cell_is_monotonic_and_never_invents_values() {
    loom::model(|| published::monotonic_and_never_invents_values(2, 1, 3));
}

#[test]
fn rcu_never_loses_an_update() {
    loom::model(|| published::rcu_never_loses_an_update(2));
}

#[test]
fn published_pair_never_tears() {
    loom::model(published::pair_never_tears);
}

#[test]
#[should_panic(expected = "torn pair")]
fn negative_control_two_atomics_tear() {
    loom::model(torn_pair::two_atomics_tear);
}
