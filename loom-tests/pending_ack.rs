//! loom: the pending-ack replay's read-pipeline scenarios of
//! `tests/scenarios/pending_ack.rs` (shared with `shuttle-tests/pending_ack.rs`)
//! in every interleaving (preemption bound 3), with their negative controls.
#![cfg(loom)]

#[path = "../tests/scenarios/pending_ack.rs"]
mod replay;

/// Runs `scenario` in every interleaving (preemption bound 3) and prints how
/// many loom explored.
fn explore(name: &str, scenario: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let executions = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&executions);
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        scenario();
    });
    println!(
        "LOOM {name}: {} interleavings",
        executions.load(Ordering::Relaxed)
    );
}

#[test]
fn failed_attempt_issues_exactly_one_read() {
    explore(
        "failed_attempt_issues_exactly_one_read",
        replay::failed_attempt_issues_exactly_one_read,
    );
}

#[test]
fn read_after_completion_then_failure_ends_the_attempt() {
    explore(
        "read_after_completion_then_failure_ends_the_attempt",
        replay::read_after_completion_then_failure_ends_the_attempt,
    );
}

#[test]
fn drained_check_never_loses_the_last_read() {
    explore(
        "drained_check_never_loses_the_last_read",
        replay::drained_check_never_loses_the_last_read,
    );
}

#[test]
fn late_read_after_stop_never_moves_the_cursor() {
    explore(
        "late_read_after_stop_never_moves_the_cursor",
        replay::late_read_after_stop_never_moves_the_cursor,
    );
}

#[test]
#[should_panic(expected = "a read was issued after the failure")]
fn negative_control_reader_order_reversed_is_caught() {
    explore("reader order reversed", || replay::reversed(true));
}

#[test]
#[should_panic(expected = "a read was issued after the failure")]
fn negative_control_writer_order_reversed_is_caught() {
    explore("writer order reversed", || replay::reversed(false));
}

#[test]
#[should_panic(expected = "a late read moved the cursor after stop_replay")]
fn negative_control_late_read_without_gate_is_caught() {
    explore("late read without gate", replay::late_read_without_gate);
}
