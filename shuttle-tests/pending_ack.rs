//! shuttle: several pending-ack handles share ONE replay executor (a
//! shuttle thread) and one reader thread, with random transient,
//! non-recoverable and completing read failures, retries on a virtual
//! timer driven by the test thread. Every handle ends Ready or Error, no
//! attempt issues more reads than the log needs, and a Ready handle whose
//! replay was not cut short by a completing failure holds exactly the log's
//! content (checked against a reference model).
//!
//! This multi-handle world runs under shuttle only (its failures come from
//! shuttle's scheduler RNG). The read-pipeline scenarios of
//! `tests/scenarios/pending_ack.rs`, shared with `loom-tests/pending_ack.rs`,
//! run here too, with their negative controls (the reversed read/failure
//! orderings, a late read without the read gate).
#![cfg(feature = "shuttle")]

#[path = "../tests/scenarios/pending_ack.rs"]
mod replay;

use std::collections::BTreeSet;
use std::sync::Arc;

use pulsar_core::__model::sync::{thread, AtomicUsize, Ordering};
use pulsar_core::ledger::{LedgerConfig, ManagedLedger, MemoryStore, ReadFailureKind};
use pulsar_core::pending_ack::*;
use pulsar_core::Position;
use shuttle::rand::RngCore;

const TXNS: u64 = 3;
const BATCH: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    Healthy,
    Transient,
    NonRecoverable,
    Completing,
}

struct Case {
    plan: Plan,
    handle: PendingAckHandle,
    expected: PendingAckSummary,
    entries: usize,
}

fn build(
    i: usize,
    plan: Plan,
    extra: u64,
    pool: &ReplayExecutorPool,
    reader: &Arc<ReaderThread>,
    timer: &Arc<VirtualTimer>,
) -> Case {
    let cfg = LedgerConfig {
        max_entries_per_ledger: 4,
        auto_skip_non_recoverable_data: false,
    };
    let ml = ManagedLedger::open(format!("t{i}"), cfg, Arc::new(MemoryStore::new())).unwrap();
    let mut expected = PendingAckSummary {
        mark_delete: Position::new(-1, -1),
        ..Default::default()
    };
    let mut entries = 0;
    for n in 0..TXNS {
        let t = TxnId::new(i as u64, n);
        let p = Position::new(7, n as i64);
        ml.append(&PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p)]).encode())
            .unwrap();
        entries += 1;
        if n % 2 == 0 {
            ml.append(&PendingAckRecord::commit(t, AckType::Individual).encode())
                .unwrap();
            entries += 1;
            expected.deleted.insert(p);
        } else {
            expected.individual.insert(t, BTreeSet::from([p]));
        }
    }
    match plan {
        Plan::Healthy => {}
        Plan::Transient => {
            // Fail read number `skip` (0-based) and the next `count - 1`.
            let skip = (extra % 3) as usize;
            let count = 1 + (extra / 3 % 3) as usize;
            let kind = if extra.is_multiple_of(2) {
                ReadFailureKind::StorageUnavailable
            } else {
                ReadFailureKind::TooManyRequests
            };
            let seen = Arc::new(AtomicUsize::new(0));
            ml.faults().set_policy(move |_| {
                let n = seen.fetch_add(1, Ordering::SeqCst);
                (n >= skip && n < skip + count).then_some(kind)
            });
        }
        Plan::NonRecoverable => ml.mark_ledger_lost(1).unwrap(),
        Plan::Completing => {
            let kind = if extra.is_multiple_of(2) {
                ReadFailureKind::Fenced
            } else {
                ReadFailureKind::CursorAlreadyClosed
            };
            let at = (extra % 3) as usize;
            let seen = Arc::new(AtomicUsize::new(0));
            ml.faults()
                .set_policy(move |_| (seen.fetch_add(1, Ordering::SeqCst) == at).then_some(kind));
        }
    }
    let cursor = Arc::new(ml.open_cursor("__pending_ack_state").unwrap());
    let handle = PendingAckHandle::new(
        format!("h{i}"),
        cursor,
        Arc::new(MemorySubscription::default()),
        pool,
        reader.clone(),
        timer.clone(),
        HandleConfig {
            replay: ReplayConfig {
                queue_capacity: 4,
                read_batch: BATCH,
            },
            jitter_seed: extra,
            ..HandleConfig::default()
        },
    )
    .unwrap();
    Case {
        plan,
        handle,
        expected,
        entries,
    }
}

fn scenario() {
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Threads).unwrap();
    let reader = Arc::new(ReaderThread::start());
    let timer = Arc::new(VirtualTimer::new());
    let mut rng = shuttle::rand::thread_rng();
    let plans = [
        Plan::Healthy,
        Plan::Transient,
        Plan::NonRecoverable,
        Plan::Completing,
    ];
    let cases: Vec<Case> = (0..3)
        .map(|i| {
            let plan = plans[(rng.next_u64() % 4) as usize];
            let extra = rng.next_u64() % 64;
            build(i, plan, extra, &pool, &reader, &timer)
        })
        .collect();
    for c in &cases {
        c.handle.init();
    }
    let mut spins = 0u64;
    while !cases
        .iter()
        .all(|c| matches!(c.handle.state(), HandleState::Ready | HandleState::Error))
    {
        if !timer.fire_next() {
            thread::yield_now();
        }
        spins += 1;
        assert!(spins < 100_000, "handles never settled");
    }
    for c in &cases {
        let s = c.handle.stats();
        let state = c.handle.state();
        let bound = c.entries.div_ceil(BATCH) as u64;
        assert!(
            s.max_reads_per_attempt <= bound,
            "{:?}: {} reads in one attempt > {bound}",
            c.plan,
            s.max_reads_per_attempt
        );
        match c.plan {
            Plan::NonRecoverable => {
                assert_eq!(state, HandleState::Error, "{:?}", c.plan);
                assert_eq!(s.reads_issued, 1, "deleted ledger: exactly one read");
            }
            _ => {
                assert_eq!(state, HandleState::Ready, "{:?} {s:?}", c.plan);
                let report = s.completed.clone().expect("completed report");
                if report.completing_failure.is_none() {
                    assert_eq!(
                        c.handle.summary(),
                        c.expected,
                        "{:?} {s:?} {}",
                        c.plan,
                        c.handle.name()
                    );
                } else {
                    assert_eq!(c.plan, Plan::Completing);
                }
            }
        }
    }
    for c in &cases {
        c.handle.close();
    }
    pool.shutdown();
    reader.shutdown();
}

/// Fixed seeds so CI runs are reproducible.
const SEED: u64 = 0x5eed_0001;

#[test]
fn handles_on_one_executor_random() {
    shuttle::check_random_with_seed(scenario, SEED, 3_000);
}

#[test]
fn handles_on_one_executor_pct() {
    let scheduler = shuttle::scheduler::PctScheduler::new_from_seed(SEED, 3, 2_000);
    shuttle::Runner::new(scheduler, shuttle::Config::new()).run(scenario);
}

// ------------------------------------------------------------------------
// The read-pipeline scenarios shared with loom (tests/scenarios/pending_ack.rs)
// and their negative controls.

const SHARED_ITERATIONS: usize = 2_000;

/// `scenario` under random, then PCT depth-3, schedules (fixed seed).
fn random_and_pct(scenario: fn()) {
    shuttle::check_random_with_seed(scenario, SEED, SHARED_ITERATIONS);
    let scheduler = shuttle::scheduler::PctScheduler::new_from_seed(SEED, 3, SHARED_ITERATIONS);
    shuttle::Runner::new(scheduler, shuttle::Config::new()).run(scenario);
}

#[test]
fn failed_attempt_issues_exactly_one_read() {
    random_and_pct(replay::failed_attempt_issues_exactly_one_read);
}

#[test]
fn read_after_completion_then_failure_ends_the_attempt() {
    random_and_pct(replay::read_after_completion_then_failure_ends_the_attempt);
}

#[test]
fn drained_check_never_loses_the_last_read() {
    random_and_pct(replay::drained_check_never_loses_the_last_read);
}

#[test]
fn late_read_after_stop_never_moves_the_cursor() {
    random_and_pct(replay::late_read_after_stop_never_moves_the_cursor);
}

#[test]
#[should_panic(expected = "a read was issued after the failure")]
fn negative_control_reader_order_reversed_is_caught() {
    shuttle::check_random_with_seed(|| replay::reversed(true), SEED, SHARED_ITERATIONS);
}

#[test]
#[should_panic(expected = "a read was issued after the failure")]
fn negative_control_writer_order_reversed_is_caught() {
    shuttle::check_random_with_seed(|| replay::reversed(false), SEED, SHARED_ITERATIONS);
}

#[test]
#[should_panic(expected = "a late read moved the cursor after stop_replay")]
fn negative_control_late_read_without_gate_is_caught() {
    shuttle::check_random_with_seed(replay::late_read_without_gate, SEED, SHARED_ITERATIONS);
}
