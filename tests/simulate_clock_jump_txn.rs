//! A broker clock jump beside transactional acks on the node engine
//! (tests/workloads/node_clock_jump_txn.toml): the coordinator times a
//! transaction out by the broker's clock, so a jump past its ttl aborts it
//! at the core's next input, before the run's clock reaches the ttl, and
//! the core redelivers the entries it acknowledged (Pulsar's timeout
//! abort). The simulated client is told at the jump that the timeout of
//! such a transaction may have passed (`sim::node::txn`), so the checker
//! allows that redelivery and the client aborts an open one instead of
//! committing it. Without it, seeds 2 and 3 report the abort's
//! redelivery as a duplicate to a live consumer.
#![cfg(not(any(loom, feature = "shuttle")))]

#[path = "common/sim_run.rs"]
mod sim_run;
use sim_run::{assert_clean, run_seed};

#[test]
fn transactions_a_clock_jump_times_out_run_clean() {
    let w = sim_run::workload_file("node_clock_jump_txn.toml");
    let (mut jumps, mut timed_out, mut acks) = (0, 0, 0);
    for seed in 1..=3 {
        let r = run_seed(&w, seed);
        assert_clean(&r, &format!("seed {seed}"));
        jumps += r.activity.clock_jumps;
        let t = &r.activity.node.as_ref().expect("node activity").txn;
        timed_out += t.timed_out;
        acks += t.acks;
    }
    assert!(
        jumps > 0 && timed_out > 0 && acks > 0,
        "{jumps} {timed_out} {acks}"
    );
}
