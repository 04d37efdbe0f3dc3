//! Corrupted MESSAGEs of an earlier consumer epoch on the node engine
//! (`tests/workloads/stale_epoch_corrupted.toml`): a consumer asks for its
//! unacknowledged messages again (REDELIVER_UNACKNOWLEDGED_MESSAGES, a new
//! epoch) while corrupted copies stamped with the old epoch are still on
//! their way. Pulsar's client verifies the checksum before the epoch, so
//! it answers them with a validation-error ack; their entries were already
//! given back by the redelivery request, so the node engine sends no
//! negative ack in its place. The run is clean (no message delivered twice
//! to one consumer epoch) and the path did work. Negative control: the same
//! workload on a driver that sends the negative ack anyway (the tree before
//! `Consumer::corrupt_given_back`) fails at seeds 1-3 with "delivered twice
//! to consumer-0 with no restart or reconnect between".

#[path = "common/sim_run.rs"]
mod sim_run;

#[test]
fn corrupted_copies_of_an_earlier_epoch_are_not_given_back_twice() {
    let w = sim_run::workload_file("stale_epoch_corrupted.toml");
    let r = sim_run::run_seed_within(&w, 1, std::time::Duration::from_secs(300));
    sim_run::assert_clean(&r, "stale_epoch_corrupted.toml seed 1");
    let n = r.activity.node.as_ref().expect("node activity");
    assert!(
        n.corrupted_of_earlier_epoch > 0,
        "no corrupted copy of an earlier epoch: {n:?}"
    );
    assert!(n.redelivery_requests > 0, "{n:?}");
    assert_eq!(r.counts.published, w.messages, "{r}");
}
