//! tests/workloads/node_delayed_expired_readd.toml, the `# simulate:` line
//! of the delayed_expired_readd_keeps_bit and delayed_pop_ignores_untrack
//! mutants, runs clean on the shipped tracker at those lines' seeds (1, 4,
//! 5) with its clock jumps and consumer-set rewinds done: a line that also
//! failed on correct code would catch nothing.
#![cfg(not(any(loom, feature = "shuttle")))]

#[path = "common/sim_run.rs"]
mod sim_run;
use sim_run::{assert_clean, run_seed};

#[test]
fn delayed_expired_readd_workload_runs_clean_at_the_mutant_lines_seeds() {
    let w = sim_run::workload_file("node_delayed_expired_readd.toml");
    for seed in [1, 4, 5] {
        let r = run_seed(&w, seed);
        assert_clean(&r, &format!("seed {seed}"));
        assert_eq!(r.counts.tracker_violations, 0, "seed {seed}");
        assert!(
            r.activity.rewinds >= 2 && r.activity.clock_jumps >= 2,
            "seed {seed}: rewinds {}, clock jumps {}",
            r.activity.rewinds,
            r.activity.clock_jumps
        );
    }
}
