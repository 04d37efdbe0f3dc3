//! The node engine's judgement of an unsubscribe across a restart: the
//! reset it tells the checker must be the one the core applied.
//!
//! - tests/workloads/node_unsubscribe_restart_trimmed.toml, seed 2027: the
//!   broker restarts between the UNSUBSCRIBE and the next SUBSCRIBE, which
//!   opens the topic on the new core and creates the subscription again at
//!   the first kept ledger (ledger 1 was trimmed as consumed). The reset's
//!   mark-delete comes from the store's ledger list while the topic is not
//!   open; `i64::MIN` would make the checker expect the trimmed ledger's
//!   100 messages again (lost, then a stall).
//! - tests/workloads/node_unsubscribe_crash_at_commit.toml, seed 1617: the
//!   core applies an UNSUBSCRIBE in memory and dies at its turn's durable
//!   commit; the recovered store keeps the cursor and the next SUBSCRIBE
//!   resumes it. Judged applied from memory, the checker would be told a
//!   reset to the initial position and count what the kept cursor
//!   acknowledged as lost (608, then a stall).
#![cfg(not(any(loom, feature = "shuttle")))]

#[path = "common/sim_run.rs"]
mod sim_run;
use sim_run::{assert_clean, run_seed, workload_file};

#[test]
fn subscription_recreated_on_a_restarted_core_starts_at_the_first_kept_ledger() {
    let w = workload_file("node_unsubscribe_restart_trimmed.toml");
    let r = run_seed(&w, 2027);
    assert_clean(&r, "seed 2027");
    let n = r.activity.node.as_ref().expect("node activity");
    // The case is reached: a re-creation, after ledgers were trimmed.
    assert!(n.unsubscribes.recreated > 0, "{:?}", n.unsubscribes);
    assert!(n.ledgers_deleted > 0, "no ledger trimmed");
    assert!(n.clean_restarts > 0, "no restart");
}

#[test]
fn unsubscribe_cut_by_a_crash_at_its_commit_is_not_a_reset() {
    let w = workload_file("node_unsubscribe_crash_at_commit.toml");
    let r = run_seed(&w, 1617);
    assert_clean(&r, "seed 1617");
    let n = r.activity.node.as_ref().expect("node activity");
    // The case is reached: an unsubscribe the crash undid.
    assert!(n.unsubscribes.undone_by_crash > 0, "{:?}", n.unsubscribes);
}

#[test]
fn unsubscribe_of_a_subscription_the_core_has_not_opened_is_not_a_reset() {
    let w = workload_file("node_unsubscribe_before_resubscribe.toml");
    let r = run_seed(&w, 2527);
    assert_clean(&r, "seed 2527");
    let n = r.activity.node.as_ref().expect("node activity");
    assert!(n.unsubscribes.sent > 0, "{:?}", n.unsubscribes);
    assert!(n.readers.opened > 0, "{:?}", n.readers);
}
