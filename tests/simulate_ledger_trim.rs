//! The simulator's node engine reaches consumed-ledger trimming: small
//! ledgers, the core's trimming timer, crashes at durable writes (ledger
//! deletions among them) and restarts; every run is clean (no message lost,
//! none delivered from a deleted ledger it still needed) and deletes
//! ledgers.
#![cfg(not(any(loom, feature = "shuttle")))]

#[path = "common/sim_run.rs"]
mod sim_run;

#[test]
fn node_engine_trims_consumed_ledgers_across_crashes_and_restarts() {
    let w = sim_run::workload_file("node_ledger_trim.toml");
    let mut deleted = 0;
    let mut crashes = 0;
    for seed in 1..=3 {
        let r = sim_run::run_seed_within(&w, seed, std::time::Duration::from_secs(120));
        sim_run::assert_clean(&r, &format!("seed {seed}"));
        assert_eq!(r.counts.lost, 0, "seed {seed}");
        assert!(r.counts.published >= w.messages, "seed {seed}");
        let n = r.activity.node.as_ref().expect("node activity");
        assert!(
            n.ledgers_deleted > 0,
            "seed {seed}: no ledger deleted: {n:?}"
        );
        deleted += n.ledgers_deleted;
        crashes += n.crash_points;
    }
    assert!(crashes >= 3, "crash points reached: {crashes}");
    eprintln!("ledgers deleted over 3 seeds: {deleted}; crash points: {crashes}");
}
