//! The report's Activity counters that the broker core feeds (Failover
//! handovers, re-applied commits, failed pending-ack replay attempts and
//! their reads, replays a completing failure ended, crash points taken and
//! unreached): each is non-zero in a run where the core must do that work
//! and zero in a run where it cannot, so none of them says "0 happened"
//! about work that did happen. The runs that must fail replay attempts,
//! end replays by a completing failure and re-apply commits are asserted
//! where they already run: `tests/simulate_node_pending_ack.rs` and
//! `tests/simulate.rs` (`txn_outage_runs_clean_on_the_broker_core_at_seed_1`).

#[path = "common/sim_run.rs"]
mod sim_run;

use pulsar_core::sim::Report;

/// Failover (`node_failover.toml`, seed 1): consumers that sort first
/// rejoin and the active one leaves, so the active consumer changes and the
/// core's rewind hands what the old one held (sent and unacknowledged) to
/// the new one. The run has no transactions and no pending-ack faults: no
/// commit can be re-applied and no replay can fail or end early. All its
/// crash points are taken.
#[test]
fn failover_counts_active_consumer_changes_and_handed_over_entries() {
    let r = sim_run::run_seed(&sim_run::workload_file("node_failover.toml"), 1);
    sim_run::assert_clean(&r, "node_failover.toml seed 1");
    let a = &r.activity;
    assert!(a.active_consumer_changes > 0, "{r}");
    assert!(a.handover_entries > 0, "{r}");
    assert_eq!(a.commits_reapplied, 0, "{r}");
    assert_eq!(a.replay_failed_attempts, 0, "{r}");
    assert_eq!(a.replay_reads_in_failed_attempts, 0, "{r}");
    assert_eq!(a.replays_ended_by_completing_failure, 0, "{r}");
    assert_crashes_listed(&r);
    assert_eq!(a.crashes.len(), 3, "every crash point is taken: {r}");
    assert_eq!(a.crash_points_unreached, 0, "{r}");
}

/// A crash point whose k lies beyond the run's durable writes is drawn and
/// never reached: it is counted as unreached, none is listed as taken.
#[test]
fn a_crash_point_beyond_the_run_is_counted_unreached() {
    let mut w = sim_run::workload_file("node_failover.toml");
    w.faults.crash_points = 1;
    w.faults.crash_window = 1_000_000;
    let r = sim_run::run_seed(&w, 1);
    sim_run::assert_clean(&r, "node_failover.toml, one crash point beyond the run");
    assert_eq!(r.activity.crash_points_unreached, 1, "{r}");
    assert_crashes_listed(&r);
    assert!(r.activity.crashes.is_empty(), "{r}");
}

/// The crash list and the store's figures are in the report and agree with
/// the node engine's count.
fn assert_crashes_listed(r: &Report) {
    let a = &r.activity;
    let n = a.node.as_ref().expect("node activity");
    assert_eq!(a.crashes.len() as u64, n.crash_points, "{r}");
    let st = a.crash_storage.expect("the run's in-memory store");
    assert!(st.durable_writes > 0, "{r}");
    assert_eq!(st.crashes, n.crash_points, "{r}");
    let text = r.to_string();
    assert!(text.contains("crash points taken"), "{text}");
}
