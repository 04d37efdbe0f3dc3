//! loom: group commit's completion handoff in every interleaving (the
//! shipped `ledger::GroupCommitter` and `ledger::Completion`, its writer
//! thread included) up to the preemption bound. The scenarios are
//! `tests/scenarios/group_commit.rs`, shared with
//! `shuttle-tests/group_commit.rs`.
#![cfg(loom)]

use loom::model::Builder;

#[path = "../tests/scenarios/group_commit.rs"]
mod group_commit;

/// Preemption bound 3 by default; `LOOM_MAX_PREEMPTIONS` (read by
/// `Builder::new`) sets another.
fn check(scenario: impl Fn() + Sync + Send + 'static) {
    let mut b = Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(scenario);
}

#[test]
fn completion_never_fires_before_its_commit() {
    check(|| group_commit::completion_never_fires_before_its_commit(1));
}

#[test]
#[should_panic(expected = "completed before its commit")]
fn negative_control_completion_before_commit_is_caught() {
    check(|| group_commit::early_completion_is_caught(1));
}
