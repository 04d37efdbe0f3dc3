//! The pending-ack replay's read-pipeline scenarios, written once
//! and run by `loom-tests/pending_ack.rs` (every interleaving, preemption
//! bound 3) and `shuttle-tests/pending_ack.rs` (random and PCT schedules),
//! on the crate's REAL `ReplayAttempt::run` / `fill_queue` / `read_complete`
//! / `read_failed` through `crate::sync`: the replay thread races a
//! read-callback thread, a failed attempt issues exactly one read after
//! which nothing more is read, the drained check never loses the last read,
//! and a late read after `stop_replay` changes nothing.
//!
//! Negative controls: test-only models of the reversed orders (reader loads
//! `is_readable` before the counter; writer decrements before clearing the
//! flag, [`reversed`]) and of a late read without the read gate
//! ([`late_read_without_gate`]); both checkers must catch them.

use std::collections::VecDeque;
use std::sync::Arc;

use pulsar_core::__model::pending_ack::ReplayAttempt;
use pulsar_core::__model::sync::{thread, AtomicBool, AtomicUsize, Condvar, Mutex, Ordering};
use pulsar_core::ledger::{Entry, LedgerConfig, LedgerError, ManagedLedger, MemoryStore};
use pulsar_core::pending_ack::{
    AckedPosition, PendingAckError, PendingAckRecord, PendingAckState, ReadDispatcher, ReadJob,
    ReplayConfig, TxnId,
};
use pulsar_core::Position;

/// Hands the first `expected` issued reads to the callback thread (the
/// managed-ledger thread); any read beyond them (a bug) fails synchronously
/// on the replay thread, so the attempt still ends and the read-count
/// assertion reports it.
pub struct HandOff {
    jobs: Mutex<VecDeque<ReadJob>>,
    ready: Condvar,
    dispatched: AtomicUsize,
    expected: usize,
}

impl std::fmt::Debug for HandOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandOff")
    }
}

impl ReadDispatcher for HandOff {
    fn dispatch(&self, job: ReadJob) {
        if self.dispatched.fetch_add(1, Ordering::SeqCst) >= self.expected {
            job.fail(unavailable());
            return;
        }
        self.jobs.lock().push_back(job);
        self.ready.notify_all();
    }
}

impl HandOff {
    fn new(expected: usize) -> Arc<Self> {
        Arc::new(Self {
            jobs: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            dispatched: AtomicUsize::new(0),
            expected,
        })
    }

    fn take(&self) -> ReadJob {
        let mut q = self.jobs.lock();
        loop {
            if let Some(j) = q.pop_front() {
                return j;
            }
            q = self.ready.wait(q);
        }
    }
}

fn log_with(entries: i64) -> Arc<pulsar_core::ledger::ManagedCursor> {
    let ml = ManagedLedger::open("pa", LedgerConfig::default(), Arc::new(MemoryStore::new()))
        .expect("valid ledger");
    for i in 0..entries {
        let r = PendingAckRecord::individual_ack(
            TxnId::new(0, i as u64),
            vec![AckedPosition::whole(Position::new(9, i))],
        );
        ml.append(&r.encode()).expect("append");
    }
    Arc::new(ml.open_cursor("__pending_ack_state").expect("cursor"))
}

/// A replay attempt over a log of `entries` records whose first `reads`
/// reads are handed to the callback thread; one entry per read.
fn attempt_over(
    entries: i64,
    reads: usize,
) -> (
    Arc<pulsar_core::ledger::ManagedCursor>,
    Arc<HandOff>,
    Arc<ReplayAttempt>,
) {
    let cursor = log_with(entries);
    let handoff = HandOff::new(reads);
    let attempt = ReplayAttempt::new(
        "pa",
        Arc::clone(&cursor),
        handoff.clone(),
        ReplayConfig {
            queue_capacity: 4,
            read_batch: 1,
        },
    )
    .expect("config");
    (cursor, handoff, attempt)
}

fn unavailable() -> LedgerError {
    LedgerError::StorageUnavailable {
        reason: "bookie down".into(),
    }
}

/// Replay thread vs failure thread: the only read fails; exactly one read
/// is issued, the attempt fails with the stored error, the cursor rewound.
pub fn failed_attempt_issues_exactly_one_read() {
    let (cursor, handoff, attempt) = attempt_over(2, 1);
    let failer = {
        let handoff = Arc::clone(&handoff);
        thread::spawn(move || handoff.take().fail(unavailable()))
    };
    let mut state = PendingAckState::default();
    let r = attempt.run(&mut state);
    failer.join().expect("failure thread");
    assert!(
        matches!(
            r,
            Err(PendingAckError::Ledger(
                LedgerError::StorageUnavailable { .. }
            ))
        ),
        "attempt must fail with the stored failure: {r:?}"
    );
    assert_eq!(
        handoff.dispatched.load(Ordering::SeqCst),
        1,
        "exactly one read per failed attempt"
    );
    assert_eq!(cursor.read_position(), Position::new(1, 0), "rewound");
}

/// First read completes (enqueue then decrement) on the callback thread,
/// second fails: two reads, never a third, never reported complete.
pub fn read_after_completion_then_failure_ends_the_attempt() {
    let (_cursor, handoff, attempt) = attempt_over(3, 2);
    let callbacks = {
        let handoff = Arc::clone(&handoff);
        thread::spawn(move || {
            let first = handoff.take();
            let entry = Entry {
                position: Position::new(1, 0),
                data: PendingAckRecord::individual_ack(
                    TxnId::new(0, 0),
                    vec![AckedPosition::whole(Position::new(9, 0))],
                )
                .encode(),
            };
            first.complete(vec![entry]);
            handoff.take().fail(unavailable());
        })
    };
    let mut state = PendingAckState::default();
    let r = attempt.run(&mut state);
    callbacks.join().expect("callback thread");
    assert!(r.is_err(), "never reported complete: {r:?}");
    assert_eq!(
        handoff.dispatched.load(Ordering::SeqCst),
        2,
        "no read after the failure"
    );
}

/// Every read succeeds on the callback thread: the "nothing readable and
/// queue drained" end must see the last read's entries (read_complete
/// enqueues BEFORE it decrements, and fill_queue checks the queue AFTER the
/// counter), so the replay applies every entry.
pub fn drained_check_never_loses_the_last_read() {
    let (_cursor, handoff, attempt) = attempt_over(2, 2);
    let callbacks = {
        let handoff = Arc::clone(&handoff);
        thread::spawn(move || {
            // Real reads through the cursor (they move its read position).
            handoff.take().run();
            handoff.take().run();
        })
    };
    let mut state = PendingAckState::default();
    let r = attempt.run(&mut state);
    callbacks.join().expect("callback thread");
    let report = r.expect("replay completes");
    assert_eq!(report.entries_applied, 2, "every entry applied: {report:?}");
}

// ------------------------------------------------------------------------
// Negative control: a TEST-ONLY model of the reversed orders. It is not the
// crate's code; it exists to show loom catches the bug the ordering fixes.

pub struct ReversedModel {
    outstanding: AtomicUsize,
    readable: AtomicBool,
    reads: AtomicUsize,
    reader_reversed: bool,
}

impl ReversedModel {
    fn fill_queue(&self) -> bool {
        // The two arms load the same atomics in opposite orders: the order
        // is the point (loads are not commutative across threads).
        #[allow(clippy::if_same_then_else)]
        let may_read = if self.reader_reversed {
            self.readable.load(Ordering::SeqCst) && self.outstanding.load(Ordering::SeqCst) == 0
        } else {
            self.outstanding.load(Ordering::SeqCst) == 0 && self.readable.load(Ordering::SeqCst)
        };
        if may_read {
            self.outstanding.fetch_add(1, Ordering::SeqCst);
            self.reads.fetch_add(1, Ordering::SeqCst);
        }
        self.readable.load(Ordering::SeqCst)
    }

    fn read_failed(&self) {
        if self.reader_reversed {
            self.readable.store(false, Ordering::SeqCst);
            self.outstanding.fetch_sub(1, Ordering::SeqCst);
        } else {
            // writer reversed: decrement BEFORE clearing the flag
            self.outstanding.fetch_sub(1, Ordering::SeqCst);
            self.readable.store(false, Ordering::SeqCst);
        }
    }
}

/// `reader_reversed`: the reader loads `is_readable` before the counter;
/// otherwise the writer decrements before clearing the flag. Either must
/// fail with "a read was issued after the failure".
pub fn reversed(reader_reversed: bool) {
    let m = Arc::new(ReversedModel {
        outstanding: AtomicUsize::new(1),
        readable: AtomicBool::new(true),
        reads: AtomicUsize::new(1),
        reader_reversed,
    });
    let failer = {
        let m = Arc::clone(&m);
        thread::spawn(move || m.read_failed())
    };
    for _ in 0..3 {
        if !m.fill_queue() {
            break;
        }
        thread::yield_now();
    }
    failer.join().expect("failure thread");
    assert_eq!(
        m.reads.load(Ordering::SeqCst),
        1,
        "a read was issued after the failure"
    );
}

/// A lost read's late `ReadJob::run` races `stop_replay` (the attempt ended
/// by close while the read was outstanding): once `stop_replay` returned, the
/// shared cursor's read position never moves again and nothing is queued
/// (spec `LateReadsChangeNothing`; the read gate).
pub fn late_read_after_stop_never_moves_the_cursor() {
    let (cursor, handoff, attempt) = attempt_over(2, 1);
    assert!(attempt.fill_queue(), "the first read is issued");
    let job = handoff.take();
    let late = thread::spawn(move || job.run());
    attempt.stop_replay();
    let after_stop = cursor.read_position();
    late.join().expect("late callback thread");
    assert_eq!(
        cursor.read_position(),
        after_stop,
        "a late read moved the cursor after stop_replay"
    );
    assert_eq!(attempt.queued(), 0, "late entries are released");
}

/// Test-only model of a late read WITHOUT the gate: it checks "stopped",
/// then reads (moves the position) as a separate step.
/// Must fail with "a late read moved the cursor after stop_replay".
pub fn late_read_without_gate() {
    let stopped = Arc::new(AtomicBool::new(false));
    let position = Arc::new(AtomicUsize::new(0));
    let late = {
        let (stopped, position) = (Arc::clone(&stopped), Arc::clone(&position));
        thread::spawn(move || {
            if !stopped.load(Ordering::SeqCst) {
                position.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    stopped.store(true, Ordering::SeqCst);
    let after_stop = position.load(Ordering::SeqCst);
    late.join().expect("late thread");
    assert_eq!(
        position.load(Ordering::SeqCst),
        after_stop,
        "a late read moved the cursor after stop_replay"
    );
}
