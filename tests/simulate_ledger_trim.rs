//! The simulator's node engine reaches consumed-ledger trimming: small
//! ledgers, the core's trimming timer, crashes at durable writes (ledger
//! deletions among them) and restarts; every run is clean (no message lost,
//! none delivered from a deleted ledger it still needed) and deletes
//! ledgers.
#![cfg(not(any(loom, feature = "shuttle")))]

use pulsar_core::sim::{run, SimOptions, Watchdog, Workload};

fn run_seed(w: &Workload, seed: u64) -> pulsar_core::sim::Report {
    let dir = tempfile::tempdir().unwrap();
    let opts = SimOptions {
        seed,
        data_dir: dir.path().join("data"),
        faults: true,
        sabotage: None,
        sync: pulsar_core::ledger::SyncMode::Immediate,
        watchdog: Watchdog {
            exit_on_hang: Some(std::time::Duration::from_secs(30)),
            wall_limit: Some(std::time::Duration::from_secs(120)),
            ..Watchdog::default()
        },
        trace_dir: None,
    };
    run(w, &opts, None).unwrap()
}

#[test]
fn node_engine_trims_consumed_ledgers_across_crashes_and_restarts() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads/node_ledger_trim.toml");
    let w = Workload::from_toml_file(&path).unwrap();
    let mut deleted = 0;
    let mut crashes = 0;
    for seed in 1..=3 {
        let r = run_seed(&w, seed);
        assert!(
            r.is_clean(),
            "seed {seed}: {:?} ({} violations)",
            r.first_violation,
            r.violations
        );
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
