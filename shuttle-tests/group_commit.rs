//! shuttle: group commit's completion handoff under random and PCT
//! schedules (the shipped `ledger::GroupCommitter` and `ledger::Completion`,
//! its writer thread included; more submitters than the loom model). The
//! scenarios are `tests/scenarios/group_commit.rs`, shared with
//! `loom-tests/group_commit.rs`.
#![cfg(feature = "shuttle")]

#[path = "../tests/scenarios/group_commit.rs"]
mod group_commit;

const ITERATIONS: usize = 3_000;

#[test]
fn completion_never_fires_before_its_commit_random() {
    shuttle::check_random(
        || group_commit::completion_never_fires_before_its_commit(3),
        ITERATIONS,
    );
}

#[test]
fn completion_never_fires_before_its_commit_pct() {
    shuttle::check_pct(
        || group_commit::completion_never_fires_before_its_commit(3),
        ITERATIONS,
        3,
    );
}

#[test]
#[should_panic(expected = "completed before its commit")]
fn negative_control_completion_before_commit_is_caught() {
    shuttle::check_random(|| group_commit::early_completion_is_caught(3), ITERATIONS);
}
