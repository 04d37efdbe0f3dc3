//! The node engine's transactions (`sim::node::txn`, `checker::txn`): the
//! preset `tests/workloads/node_txn.toml` drives the shipped broker core's
//! coordinator, transaction buffer and transactional acks over real
//! frames, with crashes inside END_TXN, and runs clean; the settings it
//! needs are typed errors elsewhere.

use pulsar_core::sim::{run, Engine, Report, SimError, SimOptions, Watchdog, Workload};

fn watchdog() -> Watchdog {
    Watchdog {
        exit_on_hang: Some(std::time::Duration::from_secs(60)),
        wall_limit: Some(std::time::Duration::from_secs(240)),
        ..Watchdog::default()
    }
}

fn preset() -> Workload {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/node_txn.toml");
    Workload::from_toml_file(&path).unwrap()
}

fn run_seed(
    w: &Workload,
    seed: u64,
    sync: pulsar_core::ledger::SyncMode,
) -> Result<Report, SimError> {
    let dir = tempfile::tempdir().unwrap();
    let opts = SimOptions {
        seed,
        data_dir: dir.path().join("data"),
        faults: true,
        sabotage: None,
        sync,
        watchdog: watchdog(),
        trace_dir: None,
    };
    run(w, &opts, None)
}

/// Commits, aborts and a timeout, transactional sends to both topics and
/// acks on both subscriptions, a transaction open across a crash, crashes
/// inside END_TXN (the coordinator's recovery finishes them): clean, and
/// the report's `txn` component says so.
#[test]
fn the_node_txn_preset_runs_clean_with_crashes_inside_commits_and_aborts() {
    let w = preset();
    assert_eq!(w.engine, Engine::Node);
    let r = run_seed(&w, 1, pulsar_core::ledger::SyncMode::Immediate).unwrap();
    assert!(
        r.is_clean(),
        "{:?} ({} violations)",
        r.first_violation,
        r.violations
    );
    let n = r.activity.node.as_ref().expect("node activity");
    let t = &n.txn;
    assert!(t.committed > 0 && t.aborted > 0 && t.timed_out > 0, "{t:?}");
    assert!(
        t.sends > 0 && t.acks > 0 && t.reader_deliveries > 0,
        "{t:?}"
    );
    assert!(t.open_across_crash > 0, "{t:?}");
    assert!(
        t.crash_points_in_end > 0 && t.end_in_flight_at_crash > 0,
        "{t:?}"
    );
    assert!(n.crash_points >= 1, "{n:?}");
    let c = r
        .components
        .iter()
        .find(|c| c.component.starts_with("txn:"))
        .expect("a txn component line");
    assert!(c.exercised, "{c:?}");
    assert_eq!(r.counts.txn_violations, 0);
}

/// A node run with transactions is a function of its seed.
#[test]
fn the_node_txn_preset_same_seed_same_report() {
    let mut w = preset();
    w.messages = 300;
    w.txn.transactions = 10;
    let a = run_seed(&w, 3, pulsar_core::ledger::SyncMode::Immediate).unwrap();
    let b = run_seed(&w, 3, pulsar_core::ledger::SyncMode::Immediate).unwrap();
    assert_eq!(a.counts, b.counts);
    assert_eq!(a.activity, b.activity);
    assert_eq!(a.virtual_ms, b.virtual_ms);
}

/// `[txn]` needs `sync = always` (a crash with deferred
/// commits loses answered coordinator writes); its ranges are checked.
#[test]
fn txn_settings_out_of_range_or_without_fsync_are_typed_errors() {
    let mut w = preset();
    w.txn.abort_ratio = 0.95;
    let e = w.validate().unwrap_err().to_string();
    assert!(e.contains("txn.abort_ratio"), "{e}");
    let w = preset();
    let e = run_seed(&w, 1, pulsar_core::ledger::SyncMode::Deferred)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("sync = always"), "{e}");
}

/// Failed MESSAGE writes (`faults.write_failure_ratio`): the broker closes
/// the consumer a failed MESSAGE was for (CLOSE_CONSUMER) and puts its
/// unacknowledged entries back for redelivery. The second topic's reader,
/// closed that way, subscribes again and receives every committed message
/// (a reader left closed never receives the message whose write failed,
/// nor anything after it: `committed-lost`).
#[test]
fn the_second_topic_reader_closed_by_a_failed_write_subscribes_again() {
    let mut w = preset();
    w.messages = 400;
    w.txn.transactions = 20;
    w.faults.write_failure_ratio = 0.05;
    w.faults.crash_points = 0;
    w.txn.crashes_during_end = 0;
    let r = run_seed(&w, 2, pulsar_core::ledger::SyncMode::Immediate).unwrap();
    let t = &r.activity.node.as_ref().expect("node activity").txn;
    assert!(t.reader_closed_by_broker > 0 && t.committed > 0, "{t:?}");
    assert!(
        r.is_clean(),
        "{:?} ({} violations)",
        r.first_violation,
        r.violations
    );
    assert_eq!(r.counts.txn_violations, 0);
}
