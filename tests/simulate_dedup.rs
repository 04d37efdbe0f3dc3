//! The node engine's "stored once" rule: sends retried across crashes and
//! reconnects (the same producer name and sequence id) are stored once by
//! the broker core's deduplication, and the rule catches a core without it.

use pulsar_core::sim::{Report, Sabotage, Workload};

#[path = "common/sim_run.rs"]
mod sim_run;

fn run_node(w: &Workload, seed: u64, sabotage: Option<Sabotage>) -> Report {
    sim_run::run_with(w, seed, std::time::Duration::from_secs(120), |o| {
        o.sabotage = sabotage;
    })
    .unwrap()
}

/// A node workload with crashes at durable writes and reconnects: sends
/// whose receipts die with the connection are resent.
fn crashing() -> Workload {
    let mut w = sim_run::workload_file("node_shared_batches.toml");
    w.messages = 1500;
    w.faults.crash_points = 6;
    w.faults.crash_window = 40;
    w
}

#[test]
fn retried_sends_are_stored_once_and_a_core_without_deduplication_is_caught() {
    let w = crashing();
    let mut resent = 0;
    let mut caught = 0;
    for seed in 1..=3 {
        let r = run_node(&w, seed, None);
        sim_run::assert_clean(&r, &format!("seed {seed}"));
        let n = r.activity.node.clone().expect("node activity");
        resent += n.resent_entries;
        // Negative control: the same run without deduplication.
        let bad = run_node(&w, seed, Some(Sabotage::NoDeduplication));
        let bad_node = bad.activity.node.clone().expect("node activity");
        eprintln!(
            "seed {seed}: resent {} deduplicated {}; without deduplication: {:?}",
            n.resent_entries, n.deduplicated_messages, bad.first_violation
        );
        assert_eq!(bad_node.deduplicated_messages, 0);
        if bad
            .first_violation
            .as_deref()
            .is_some_and(|v| v.contains("stored twice"))
        {
            caught += 1;
        }
    }
    assert!(resent > 0, "no send was retried: the runs test nothing");
    assert!(
        caught > 0,
        "no run without deduplication was caught storing a send twice"
    );
}

/// Swarm seed 1223 (tests/workloads/node_dedup_delayed_copy.toml): a send
/// answered as a duplicate after a reconnect lost its receipt; its stored
/// copy is a delayed message (PIP-26) due after everything else was
/// acknowledged. The run waits until it is due and it is delivered: clean
/// (a run that ended first judged the copy lost).
#[test]
fn a_duplicate_answered_delayed_send_is_delivered_once_due() {
    let w = sim_run::workload_file("node_dedup_delayed_copy.toml");
    let r = sim_run::run_seed(&w, 1223);
    sim_run::assert_clean(&r, "seed 1223");
    assert_eq!(r.counts.lost, 0);
    let n = r.activity.node.as_ref().expect("node activity");
    assert!(n.deduplicated_messages > 0, "{n:?}");
}
