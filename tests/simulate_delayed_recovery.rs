//! Bucket delayed-delivery recovery after crash points on the node engine
//! (tests/workloads/delayed_seal_lost_before_barrier_*.toml, the swarm
//! workloads of seeds 1551, 2365 and 2623). The core commits a turn's store
//! writes with one fsynced barrier, so a crash before the barrier loses the
//! bucket snapshots that turn sealed or merged although their `create`
//! returned `Ok`; as in Pulsar (recovery reads only committed bucket keys)
//! the recovered tracker does not hold their indexes and the dispatcher
//! re-reads them from the mark-delete. Recovery must restore every held,
//! not yet due index of the snapshots durable at the last barrier
//! (`sim::delayed_truth`), and only those: judged against the snapshots
//! the crashed process saw, each of these runs reports "recovery lost held
//! indexes".
#![cfg(not(any(loom, feature = "shuttle")))]

#[path = "common/sim_run.rs"]
mod sim_run;
use sim_run::{assert_clean, run_seed};

#[test]
fn delayed_recovery_after_a_crash_before_the_turn_barrier_runs_clean() {
    let (mut crashes, mut seals, mut recoveries) = (0, 0, 0);
    for seed in [1551u64, 2365, 2623] {
        let w = sim_run::workload_file(&format!("delayed_seal_lost_before_barrier_{seed}.toml"));
        let r = run_seed(&w, seed);
        assert_clean(&r, &format!("seed {seed}"));
        crashes += r
            .activity
            .node
            .as_ref()
            .expect("node activity")
            .crash_points;
        seals += r.activity.bucket_seals;
        recoveries += r.activity.delayed_recoveries;
    }
    assert!(
        crashes > 0 && seals > 0 && recoveries > 0,
        "{crashes} crash points, {seals} seals, {recoveries} recoveries"
    );
}
