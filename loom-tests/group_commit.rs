//! loom: group commit's completion handoff in every interleaving (the
//! shipped `ledger::GroupCommitter` and `ledger::Completion`, its writer
//! thread included). The scenarios are `tests/scenarios/group_commit.rs`,
//! shared with `shuttle-tests/group_commit.rs`.
#![cfg(loom)]

#[path = "../tests/scenarios/group_commit.rs"]
mod group_commit;

#[test]
fn completion_never_fires_before_its_commit() {
    loom::model(|| group_commit::completion_never_fires_before_its_commit(1));
}

#[test]
#[should_panic(expected = "completed before its commit")]
fn negative_control_completion_before_commit_is_caught() {
    loom::model(|| group_commit::early_completion_is_caught(1));
}
