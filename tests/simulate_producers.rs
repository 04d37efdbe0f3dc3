//! The simulator's node engine reaches producer access modes and unique
//! producer names (PIP-68): tests/workloads/node_producers.toml runs clean
//! at a few seeds with every rule of `sim::checker::producers` exercised
//! (exclusive and shared admissions, ProducerFenced / ProducerBusy
//! refusals, a second producer of a name refused, producers fenced out by
//! ExclusiveWithFencing, WaitForExclusive producers queued then promoted),
//! across crashes at durable writes; without the knob the component is
//! absent; its bad values are typed errors.
#![cfg(not(any(loom, feature = "shuttle")))]

use pulsar_core::sim::{Workload, WorkloadError};

#[path = "common/sim_run.rs"]
mod sim_run;
use sim_run::run_seed;

fn workload() -> Workload {
    sim_run::workload_file("node_producers.toml")
}

#[test]
fn producer_access_modes_run_clean_and_every_rule_is_exercised() {
    let w = workload();
    let mut total = pulsar_core::sim::node::producers::AccessActivity::default();
    let mut crashes = 0;
    for seed in 1..=3 {
        let r = run_seed(&w, seed);
        sim_run::assert_clean(&r, &format!("seed {seed}"));
        assert_eq!(r.counts.producer_access_violations, 0);
        assert_eq!(r.counts.lost, 0);
        let n = r.activity.node.as_ref().expect("node activity");
        let a = &n.producer_access;
        total.exclusive_grants += a.exclusive_grants;
        total.shared_grants += a.shared_grants;
        total.producer_fenced += a.producer_fenced;
        total.producer_busy += a.producer_busy;
        total.same_name_refused += a.same_name_refused;
        total.fenced_out += a.fenced_out;
        total.waited_then_promoted += a.waited_then_promoted;
        crashes += n.crash_points;
        let c = sim_run::component(&r, "producer access modes")
            .expect("the producer access modes component");
        assert!(c.exercised, "seed {seed}: {:?}", c.missing());
    }
    let t = &total;
    assert!(
        t.exclusive_grants > 0
            && t.shared_grants > 0
            && t.producer_fenced > 0
            && t.producer_busy > 0
            && t.same_name_refused > 0
            && t.fenced_out > 0
            && t.waited_then_promoted > 0,
        "a rule not exercised: {t:?}"
    );
    assert!(crashes > 0, "no crash point reached");
}

#[test]
fn without_access_modes_the_component_is_absent() {
    let mut w = workload();
    w.faults.producer_access_modes = 0.0;
    w.messages = 200;
    let r = run_seed(&w, 1);
    sim_run::assert_clean(&r, "without access modes");
    assert!(sim_run::component(&r, "producer access modes").is_none());
}

#[test]
fn bad_access_mode_settings_are_typed_errors() {
    let mut w = workload();
    w.faults.producer_access_modes = 1.5;
    assert!(
        matches!(w.validate(), Err(WorkloadError::Invalid(m)) if m.contains("faults.producer_access_modes"))
    );
    let mut w = workload();
    w.txn_ack_ratio = 0.3;
    assert!(
        matches!(w.validate(), Err(WorkloadError::Unsupported(m)) if m.contains("faults.producer_access_modes") && m.contains("transactions"))
    );
}
