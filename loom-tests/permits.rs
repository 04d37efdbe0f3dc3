//! loom: the permits scenarios of `tests/scenarios/permits.rs` (shared with
//! `shuttle-tests/permits.rs`) over every interleaving (preemption bound 3).
//! Threads (loom allows 4 including main): two application threads, the
//! connection task and main.
#![cfg(loom)]

#[path = "../tests/scenarios/permits.rs"]
mod permits;

fn check(scenario: impl Fn() + Sync + Send + 'static) -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let executions = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&executions);
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        scenario();
    });
    executions.load(Ordering::Relaxed)
}

#[test]
fn flow_never_crosses_incarnations_and_credit_is_conserved() {
    let n = check(permits::replacement_during_returns);
    println!("loom permits: {n} interleavings explored");
}

#[test]
#[should_panic(expected = "old incarnation Flow written after replacement's Subscribe")]
fn negative_control_flow_without_revalidation_crosses_incarnations() {
    check(permits::flow_without_revalidation);
}
