//! The simulator's node engine reaches chunked messages (PIP-37):
//! tests/workloads/node_chunks.toml runs clean at a few seeds with chunked
//! messages sent, receipted chunk by chunk, reassembled by the consumer
//! client and delivered as one message each (the counters non-zero, so
//! the checker's rules judged whole chunked messages); without chunks the
//! component reads NOT EXERCISED; the knob's bad values and the
//! combinations the node engine cannot judge are typed errors.
#![cfg(not(any(loom, feature = "shuttle")))]

use pulsar_core::sim::{Workload, WorkloadError};

#[path = "common/sim_run.rs"]
mod sim_run;
use sim_run::run_seed;

fn workload() -> Workload {
    sim_run::workload_file("node_chunks.toml")
}

#[test]
fn chunked_messages_run_clean_and_are_exercised() {
    let w = workload();
    let (mut resent, mut crashes) = (0, 0);
    for seed in 1..=3 {
        let r = run_seed(&w, seed);
        sim_run::assert_clean(&r, &format!("seed {seed}"));
        assert_eq!(r.counts.chunk_violations, 0);
        assert_eq!(r.counts.lost, 0);
        let n = r.activity.node.as_ref().expect("node activity");
        assert!(
            n.chunks.messages_sent > 0 && n.chunks.reassembled > 0,
            "seed {seed}: {:?}",
            n.chunks
        );
        // Every chunk of a message is a SEND: more chunks than messages.
        assert!(n.chunks.chunks_sent >= 2 * n.chunks.messages_sent);
        resent += n.chunks.chunks_resent;
        crashes += n.crash_points;
        let c = sim_run::component(&r, "chunked messages").expect("the chunked messages component");
        assert!(c.exercised, "seed {seed}: {:?}", c.missing());
    }
    assert!(resent > 0, "no chunk resent after a reconnect");
    assert!(crashes > 0, "no crash point reached");
}

#[test]
fn without_chunks_the_component_is_not_exercised() {
    let mut w = workload();
    w.faults.chunked_ratio = 0.0;
    w.messages = 200;
    let r = run_seed(&w, 1);
    sim_run::assert_clean(&r, "without chunks");
    assert!(sim_run::component(&r, "chunked messages").is_none());
    // Asked for, but no message drawn as chunks: NOT EXERCISED.
    w.faults.chunked_ratio = 1e-12;
    let r = run_seed(&w, 1);
    sim_run::assert_clean(&r, "no message drawn as chunks");
    let c = sim_run::component(&r, "chunked messages").expect("the chunked messages component");
    assert!(!c.exercised);
    assert!(r.to_string().contains("NOT EXERCISED"));
}

#[test]
fn bad_chunk_settings_are_typed_errors() {
    let mut w = workload();
    w.faults.chunked_ratio = 1.5;
    assert!(
        matches!(w.validate(), Err(WorkloadError::Invalid(m)) if m.contains("faults.chunked_ratio"))
    );
    let mut w = workload();
    w.batch_size = 4;
    assert!(
        matches!(w.validate(), Err(WorkloadError::Unsupported(m)) if m.contains("faults.chunked_ratio") && m.contains("batch"))
    );
    let mut w = workload();
    w.txn_ack_ratio = 0.3;
    assert!(
        matches!(w.validate(), Err(WorkloadError::Unsupported(m)) if m.contains("faults.chunked_ratio") && m.contains("transactions"))
    );
    let mut w = workload();
    w.subscription_type = pulsar_core::sim::SubscriptionType::KeyShared;
    assert!(
        matches!(w.validate(), Err(WorkloadError::Unsupported(m)) if m.contains("faults.chunked_ratio") && m.contains("Key_Shared"))
    );
}
