//! The node engine's pending-ack faults (`tests/workloads/node_pending_ack_faults.toml`):
//! the `txn-outage` shape on the shipped broker core with transactional
//! acks of already-acknowledged messages (`faults.txn_acks_of_deleted`: the
//! core must refuse each), pending-ack log entries whose data is gone
//! (`faults.pending_ack_entries_missing`: a completing failure with
//! auto-skip on, the replay completes over it) and admission rejections
//! (each MESSAGE must spend an admission of the core's hook). The run is
//! clean and every one of those paths did work; the report counts the
//! failed replay attempts with their reads (one each: the retry waits for
//! its backoff, no spin) and the replays the missing data ended by a
//! completing failure (Shared: no active consumer to change). The mutants
//! `pending_ack_ack_of_deleted_accepted`, `pending_ack_every_failure_fails_attempt`
//! and `permits_finalised_before_admission` are the negative controls
//! (`bash .ci/mutants NAME`).

#[path = "common/sim_run.rs"]
mod sim_run;

#[test]
fn pending_ack_faults_on_the_core_run_clean_and_reach_their_paths() {
    let w = sim_run::workload_file("node_pending_ack_faults.toml");
    let r = sim_run::run_seed_within(&w, 1, std::time::Duration::from_secs(300));
    sim_run::assert_clean(&r, "node_pending_ack_faults.toml seed 1");
    let a = &r.activity;
    assert!(a.txn_acks_of_deleted_refused > 0, "no probe refused: {r}");
    assert!(a.admission_rejections > 0, "no admission rejection: {r}");
    let n = a.node.as_ref().expect("node activity");
    assert!(
        n.pending_ack_reads_missing > 0,
        "no read met missing data: {n:?}"
    );
    assert!(a.txn_commits > 0, "{r}");
    assert!(a.replay_failed_attempts > 0, "{r}");
    assert!(a.replay_reads_in_failed_attempts > 0, "{r}");
    assert!(
        a.replay_reads_in_failed_attempts <= 2 * a.replay_failed_attempts,
        "a failed attempt reads at most its failing read and one read-ahead: {r}"
    );
    assert!(a.replays_ended_by_completing_failure > 0, "{r}");
    assert_eq!(
        (a.active_consumer_changes, a.handover_entries),
        (0, 0),
        "{r}"
    );
    assert_eq!(r.counts.published, w.messages, "{r}");
}
