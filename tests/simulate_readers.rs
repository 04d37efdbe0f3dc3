//! The simulator's node engine reaches readers (non-durable subscriptions)
//! and unsubscribe: tests/workloads/node_readers.toml runs clean at a few
//! seeds with reader sessions opened at every kind of start, read to
//! their end, messages read, the store's cursor list read after each
//! (re)start, subscriptions deleted and created again (their counters
//! non-zero, so the rules in `sim::checker::reader` and the reset after
//! an unsubscribe judged something); the knobs' bad values and the
//! combinations the node engine cannot judge are typed errors.
#![cfg(not(any(loom, feature = "shuttle")))]

use pulsar_core::sim::{Workload, WorkloadError};

#[path = "common/sim_run.rs"]
mod sim_run;
use sim_run::run_seed;

fn workload() -> Workload {
    sim_run::workload_file("node_readers.toml")
}

#[test]
fn readers_and_unsubscribes_run_clean_and_are_exercised() {
    let w = workload();
    let mut starts = [0u64; 4];
    let (mut completed, mut read, mut store_checks, mut recreated, mut crashes) = (0, 0, 0, 0, 0);
    for seed in 1..=3 {
        let r = run_seed(&w, seed);
        sim_run::assert_clean(&r, &format!("seed {seed}"));
        assert_eq!(r.counts.reader_violations, 0);
        assert_eq!(r.counts.lost, 0);
        let n = r.activity.node.as_ref().expect("node activity");
        assert!(n.readers.opened > 0, "seed {seed}: {:?}", n.readers);
        assert!(
            n.unsubscribes.applied > 0,
            "seed {seed}: {:?}",
            n.unsubscribes
        );
        for (s, k) in starts.iter_mut().zip(n.readers.starts) {
            *s += k;
        }
        completed += n.readers.completed;
        read += n.readers.messages_read;
        store_checks += n.readers.store_checks;
        recreated += n.unsubscribes.recreated;
        crashes += n.crash_points;
        let c = sim_run::component(&r, "readers").expect("the readers component");
        assert!(c.exercised, "seed {seed}: {:?}", c.missing());
    }
    assert!(
        starts.iter().all(|k| *k > 0),
        "every kind of start: {starts:?}"
    );
    assert!(completed > 0 && read > 0 && store_checks > 0 && recreated > 0);
    assert!(crashes > 0, "no crash point reached");
}

/// The readers + unsubscribe section is listed only for a run that asks
/// for readers or unsubscribes (`sim::node::reader`'s unit tests: asked for
/// and without work, it reads NOT EXERCISED).
#[test]
fn the_component_is_listed_only_when_asked_for() {
    let mut w = workload();
    w.faults.readers = 0;
    w.faults.unsubscribes = 0;
    w.messages = 200;
    let r = run_seed(&w, 1);
    sim_run::assert_clean(&r, "without readers and unsubscribes");
    assert!(
        sim_run::component(&r, "readers").is_none(),
        "not asked for, not listed: {r}"
    );
}

#[test]
fn bad_reader_and_unsubscribe_settings_are_typed_errors() {
    let mut w = workload();
    w.faults.readers = 17;
    assert!(matches!(w.validate(), Err(WorkloadError::Invalid(m)) if m.contains("faults.readers")));
    let mut w = workload();
    w.faults.unsubscribes = 101;
    assert!(
        matches!(w.validate(), Err(WorkloadError::Invalid(m)) if m.contains("faults.unsubscribes"))
    );
    let mut w = workload();
    w.delayed_ratio = 0.2;
    assert!(
        matches!(w.validate(), Err(WorkloadError::Unsupported(m)) if m.contains("faults.unsubscribes") && m.contains("delayed"))
    );
    let mut w = workload();
    w.txn_ack_ratio = 0.3;
    assert!(
        matches!(w.validate(), Err(WorkloadError::Unsupported(m)) if m.contains("faults.unsubscribes") && m.contains("transactions"))
    );
}

/// Swarm seed 395 (tests/workloads/node_unsubscribe_recreate_lost_turn.toml):
/// the core re-creates an unsubscribed subscription and dies at that turn's
/// barrier, so no client saw the SUBSCRIBE's SUCCESS and the recovered
/// store has no cursor; the next SUBSCRIBE creates the subscription at the
/// first ledger kept then. The node engine judges the re-creation from the
/// store: the run is clean (a reset told from the lost turn expected the
/// trimmed ledgers again: 80 messages lost, then a livelock).
#[test]
fn a_recreation_lost_with_its_turn_is_judged_from_the_store() {
    let w = sim_run::workload_file("node_unsubscribe_recreate_lost_turn.toml");
    let r = run_seed(&w, 395);
    sim_run::assert_clean(&r, "seed 395");
    assert_eq!(r.counts.lost, 0);
    let n = r.activity.node.as_ref().expect("node activity");
    assert!(
        n.unsubscribes.recreations_in_lost_turn > 0 && n.unsubscribes.recreated > 0,
        "{:?}",
        n.unsubscribes
    );
}
