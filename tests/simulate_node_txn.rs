//! The node engine's transactions (`sim::node::txn`, `checker::txn`): the
//! preset `tests/workloads/node_txn.toml` drives the shipped broker core's
//! coordinator, transaction buffer and transactional acks over real
//! frames, with crashes inside END_TXN, and runs clean; the settings it
//! needs are typed errors elsewhere.

use pulsar_core::sim::{Engine, Report, SimError, Workload};

#[path = "common/sim_run.rs"]
mod sim_run;
use sim_run::workload_file as workload;

fn preset() -> Workload {
    workload("node_txn.toml")
}

fn run_seed(
    w: &Workload,
    seed: u64,
    sync: pulsar_core::ledger::SyncMode,
) -> Result<Report, SimError> {
    sim_run::run_with(w, seed, std::time::Duration::from_secs(240), |o| {
        o.sync = sync;
    })
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
    sim_run::assert_clean(&r, "node_txn.toml seed 1");
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
    let c = sim_run::component(&r, "txn:").expect("a txn component line");
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
    sim_run::assert_clean(&r, "node_txn.toml with write failures, seed 2");
    assert_eq!(r.counts.txn_violations, 0);
}

/// `txn.snapshot_min_time_ms` / `txn.snapshot_max_transaction_count` (the
/// core's `BrokerConfig::txn_snapshot`): the transaction buffer takes
/// snapshots while transactions are open, and the crashes after them
/// recover each topic's buffer from such a snapshot and the entries after
/// it: clean (a snapshot whose max read position passed an open
/// transaction's first entry, or a recovery that skips the entry after
/// it, dispatches that transaction's messages: open-visible,
/// aborted-visible, past-max-read-position; the mutants
/// `txn_buffer_snapshot_*`). With Pulsar's defaults (`node_txn.toml`) a
/// run restarts after new snapshots at most a few times.
#[test]
fn buffers_recovered_from_snapshots_taken_while_transactions_are_open_run_clean() {
    let w = workload("node_txn_snapshots.toml");
    assert_eq!(w.txn.snapshot_min_time_ms, 30);
    let r = run_seed(&w, 1, pulsar_core::ledger::SyncMode::Immediate).unwrap();
    sim_run::assert_clean(&r, "node_txn_snapshots.toml seed 1");
    let t = &r.activity.node.as_ref().expect("node activity").txn;
    let d = run_seed(&preset(), 1, pulsar_core::ledger::SyncMode::Immediate).unwrap();
    let dt = &d.activity.node.as_ref().expect("node activity").txn;
    assert!(
        t.restarts_after_new_snapshots >= 5
            && t.restarts_after_new_snapshots > dt.restarts_after_new_snapshots,
        "{t:?} vs the defaults' {dt:?}"
    );
    assert!(
        t.open_across_crash > 0 && t.committed > 0 && t.aborted > 0,
        "{t:?}"
    );
    assert_eq!(r.counts.txn_violations, 0);
}

/// `turn_commit = false` (`serve --no-turn-commit`, an embedder's
/// `BrokerConfig::turn_commit = false`): every store commit is durable on
/// its own, so the crash points moved into END_TXN fall between its
/// coordinator records, markers and pending-ack records, and the
/// coordinator's recovery finishes every transaction a crash left
/// Committing or Aborting: clean (a recovery that drops a Committing
/// transaction loses its messages: committed-lost, the mutant
/// `txn_coordinator_recovery_drops_committing`).
#[test]
fn without_turn_commit_crashes_between_end_txn_writes_are_finished_by_recovery() {
    let w = workload("node_txn_no_turn_commit.toml");
    assert!(!w.turn_commit);
    let r = run_seed(&w, 2, pulsar_core::ledger::SyncMode::Immediate).unwrap();
    sim_run::assert_clean(&r, "node_txn_no_turn_commit.toml seed 2");
    let t = &r.activity.node.as_ref().expect("node activity").txn;
    assert!(
        t.crash_points_in_end > 0 && t.end_in_flight_at_crash > 0 && t.committed > 0,
        "{t:?}"
    );
    assert_eq!(r.counts.txn_violations, 0);
}

/// The broker settings of a workload are checked: the snapshot settings
/// are at least 1.
#[test]
fn broker_settings_of_a_workload_are_typed_errors_when_out_of_range() {
    for zero in [true, false] {
        let mut w = workload("node_txn_snapshots.toml");
        if zero {
            w.txn.snapshot_min_time_ms = 0;
        } else {
            w.txn.snapshot_max_transaction_count = 0;
        }
        let e = w.validate().unwrap_err().to_string();
        assert!(e.contains("txn.snapshot_"), "{e}");
    }
}
