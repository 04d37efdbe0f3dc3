//! One replay attempt's read pipeline driven step by step, without a handle
//! around it (Pulsar's `FillEntryQueueCallback` rules on the real
//! `ReplayAttempt`): a read only with room for a whole batch and none in
//! flight, no read after a failure, a stopped attempt's late reads change
//! nothing, a failure that arrives after the replay caught up does not fail
//! it, and an attempt waiting on a lost read sleeps (does not spin on the
//! shared replay thread) and ends promptly when interrupted.
//!
//! Every test that can wait runs under a watchdog (`common/watchdog.rs`) or
//! a bounded channel wait: a hang fails with a name within seconds.
#![cfg(not(any(loom, feature = "shuttle")))]

#[path = "common/watchdog.rs"]
mod watchdog;

use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use pulsar_core::__model::pending_ack::ReplayAttempt;
use pulsar_core::ledger::{LedgerConfig, LedgerError, ManagedCursor, ManagedLedger, MemoryStore};
use pulsar_core::pending_ack::*;
use pulsar_core::Position;

const CURSOR: &str = "__pending_ack_state";

/// A pending-ack log of `n` entries (one individual ack of its own txn each).
fn log(n: u64) -> (Arc<ManagedLedger>, Arc<ManagedCursor>, Vec<Position>) {
    let ml = ManagedLedger::open(
        "pipeline__transaction_pending_ack",
        LedgerConfig::default(),
        Arc::new(MemoryStore::new()),
    )
    .unwrap();
    let positions = (0..n)
        .map(|i| {
            let rec = PendingAckRecord::individual_ack(
                TxnId::new(7, i),
                vec![AckedPosition::whole(Position::new(100, i as i64))],
            );
            ml.append(&rec.encode()).unwrap()
        })
        .collect();
    let cursor = Arc::new(ml.open_cursor(CURSOR).unwrap());
    (ml, cursor, positions)
}

/// Keeps every issued read without finishing it (the test finishes it).
#[derive(Debug, Default)]
struct Holds(Mutex<Vec<ReadJob>>);

impl Holds {
    fn take(&self) -> ReadJob {
        let mut jobs = self.0.lock().unwrap();
        assert_eq!(jobs.len(), 1, "exactly one read in flight");
        jobs.pop().unwrap()
    }

    fn is_empty(&self) -> bool {
        self.0.lock().unwrap().is_empty()
    }
}

impl ReadDispatcher for Holds {
    fn dispatch(&self, job: ReadJob) {
        self.0.lock().unwrap().push(job);
    }
}

fn attempt(
    cursor: &Arc<ManagedCursor>,
    dispatcher: Arc<dyn ReadDispatcher>,
    queue_capacity: usize,
    read_batch: usize,
) -> Arc<ReplayAttempt> {
    ReplayAttempt::new(
        "pipeline",
        Arc::clone(cursor),
        dispatcher,
        ReplayConfig {
            queue_capacity,
            read_batch,
        },
    )
    .unwrap()
}

fn unavailable() -> LedgerError {
    LedgerError::StorageUnavailable {
        reason: "bookies down".into(),
    }
}

/// Records what the replay applied; `on_apply` runs on the replay thread.
struct Sink {
    applied: Vec<Position>,
    on_apply: Box<dyn FnMut(Position) + Send>,
}

impl ReplaySink for Sink {
    fn apply_entry(&mut self, position: Position, _: &[PendingAckRecord]) -> Option<Position> {
        self.applied.push(position);
        (self.on_apply)(position);
        None
    }
}

fn sink() -> Sink {
    Sink {
        applied: Vec::new(),
        on_apply: Box::new(|_| {}),
    }
}

#[test]
fn a_read_is_issued_only_with_room_for_a_whole_batch_and_none_in_flight() {
    let (ml, cursor, ps) = log(4);
    let holds = Arc::new(Holds::default());
    // Capacity 3, batch 2: a read fits only into an empty queue.
    let a = attempt(&cursor, Arc::clone(&holds) as _, 3, 2);
    assert!(a.is_readable());
    assert_eq!(
        (a.reads_issued(), a.outstanding_reads(), a.queued()),
        (0, 0, 0)
    );
    assert!(a.fill_queue());
    assert_eq!((a.reads_issued(), a.outstanding_reads()), (1, 1));
    // A second fill while the read is in flight issues nothing.
    assert!(a.fill_queue());
    assert_eq!(a.reads_issued(), 1);
    let job = holds.take();
    assert_eq!(job.max_entries(), 2, "a read asks for read_batch entries");
    // Diagnostics name the attempt's pipeline state.
    assert!(format!("{job:?}").contains("max_entries: 2"), "{job:?}");
    let shown = format!("{a:?}");
    assert!(
        shown.contains("\"pipeline\"") && shown.contains("outstanding_reads: 1"),
        "{shown}"
    );
    assert!(Arc::ptr_eq(job.cursor(), &cursor));
    job.complete(ml.read_positions(&ps[..1]).unwrap());
    assert_eq!((a.queued(), a.outstanding_reads()), (1, 0));
    // 1 queued + a batch of 2 is not below the capacity 3: no read.
    assert!(a.fill_queue());
    assert_eq!(a.reads_issued(), 1);
    assert!(holds.is_empty(), "no read without room for a whole batch");

    // With room, a read that runs reads the cursor and queues its entries.
    let (_ml, cursor, ps) = log(4);
    let holds = Arc::new(Holds::default());
    let a = attempt(&cursor, Arc::clone(&holds) as _, 10, 3);
    assert!(a.fill_queue());
    holds.take().run();
    assert_eq!((a.queued(), a.outstanding_reads()), (3, 0));
    assert_eq!(cursor.read_position(), ps[3]);
    // 3 queued + 3 < 10: the next read is issued.
    assert!(a.fill_queue());
    assert_eq!((a.reads_issued(), a.outstanding_reads()), (2, 1));
    holds.take().run();
    assert_eq!(a.queued(), 4);
    // Nothing more to read but entries queued: still readable, no read.
    assert!(a.fill_queue());
    assert_eq!(a.reads_issued(), 2);
    assert!(a.is_readable());
}

#[test]
fn a_failed_read_is_stored_and_no_read_follows_it() {
    let (_ml, cursor, _) = log(4);
    let holds = Arc::new(Holds::default());
    let a = attempt(&cursor, Arc::clone(&holds) as _, 10, 2);
    assert!(a.fill_queue());
    holds.take().fail(unavailable());
    assert_eq!(a.outstanding_reads(), 0);
    assert!(!a.is_readable());
    assert_eq!(a.attempt_failure(), Some(unavailable()));
    assert!(!a.fill_queue(), "not readable after a failure");
    assert_eq!(a.reads_issued(), 1);
    assert!(holds.is_empty(), "no read after a failure");

    // A completing shape (fenced) is not stored as the attempt's failure,
    // but it ends the reads the same way.
    let holds = Arc::new(Holds::default());
    let a = attempt(&cursor, Arc::clone(&holds) as _, 10, 2);
    assert!(a.fill_queue());
    holds
        .take()
        .fail(LedgerError::Fenced { ledger: "l".into() });
    assert_eq!(a.attempt_failure(), None);
    assert!(!a.fill_queue());
    assert!(holds.is_empty());
}

#[test]
fn a_stopped_attempt_releases_its_queue_and_late_reads_change_nothing() {
    let (ml, cursor, ps) = log(4);
    let holds = Arc::new(Holds::default());
    let a = attempt(&cursor, Arc::clone(&holds) as _, 10, 2);
    assert!(a.fill_queue());
    holds.take().run();
    assert_eq!(a.queued(), 2);
    assert!(!a.is_stopped());
    assert_eq!(a.stop_replay(), 2, "the queued entries are released");
    assert!(a.is_stopped());
    assert_eq!(a.queued(), 0);
    // A late read of the stopped attempt reads nothing from the shared cursor.
    let before = cursor.read_position();
    assert!(a.fill_queue());
    holds.take().run();
    assert_eq!(cursor.read_position(), before);
    assert_eq!((a.queued(), a.outstanding_reads()), (0, 0));
    // A late completion's entries are released, not queued.
    assert!(a.fill_queue());
    holds.take().complete(ml.read_positions(&ps[2..]).unwrap());
    assert_eq!((a.queued(), a.outstanding_reads()), (0, 0));
    assert_eq!(a.stop_replay(), 0, "idempotent");
}

/// Completes the first read with every entry of the log (read directly, so
/// the cursor still has more) and holds every later read.
#[derive(Debug)]
struct FirstReadHasEverything {
    ml: Arc<ManagedLedger>,
    positions: Vec<Position>,
    held: Arc<Holds>,
    dispatched: Mutex<usize>,
}

impl ReadDispatcher for FirstReadHasEverything {
    fn dispatch(&self, job: ReadJob) {
        let first = {
            let mut n = self.dispatched.lock().unwrap();
            *n += 1;
            *n == 1
        };
        if first {
            job.complete(self.ml.read_positions(&self.positions).unwrap());
        } else {
            self.held.dispatch(job);
        }
    }
}

#[test]
fn a_read_failure_that_arrives_after_the_replay_caught_up_does_not_fail_it() {
    let _w = watchdog::arm("replay with a late failure", Duration::from_secs(20));
    let (ml, cursor, ps) = log(2);
    let held = Arc::new(Holds::default());
    let dispatcher = Arc::new(FirstReadHasEverything {
        ml: Arc::clone(&ml),
        positions: ps.clone(),
        held: Arc::clone(&held),
        dispatched: Mutex::new(0),
    });
    let a = attempt(&cursor, dispatcher, 10, 2);
    let last = ps[1];
    let h = Arc::clone(&held);
    let mut s = Sink {
        applied: Vec::new(),
        // The read issued while the last entry waited in the queue fails
        // while that entry is applied: the replay has every record by then.
        on_apply: Box::new(move |p| {
            if p == last {
                h.take().fail(unavailable());
            }
        }),
    };
    let report = a
        .run(&mut s)
        .expect("caught up: the late failure changes nothing");
    assert!(report.caught_up);
    assert_eq!(report.completing_failure, None);
    assert_eq!((report.entries_applied, report.records_applied), (2, 2));
    assert_eq!(report.reads_issued, 2);
    assert_eq!(s.applied, ps);
}

/// Holds every read and tells which thread issued it.
#[derive(Debug)]
struct LosesReads {
    issued: Mutex<mpsc::Sender<String>>,
    jobs: Holds,
}

impl ReadDispatcher for LosesReads {
    fn dispatch(&self, job: ReadJob) {
        let me = std::fs::read_link("/proc/thread-self")
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let _ = self.issued.lock().unwrap().send(me);
        self.jobs.dispatch(job);
    }
}

/// CPU time (clock ticks, user + system) of the thread `/proc/<pid>/task/<tid>`.
fn thread_cpu_ticks(thread: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{thread}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after the command: state is field 3; utime 14, stime 15.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

#[test]
fn an_attempt_waiting_on_a_lost_read_sleeps_and_an_interrupt_ends_it_promptly() {
    let (_ml, cursor, _) = log(4);
    let (tx, issued) = mpsc::channel();
    let lost = Arc::new(LosesReads {
        issued: Mutex::new(tx),
        jobs: Holds::default(),
    });
    let a = attempt(&cursor, Arc::clone(&lost) as _, 10, 2);
    let (done_tx, done) = mpsc::channel();
    let runner = Arc::clone(&a);
    std::thread::spawn(move || {
        let _ = done_tx.send(runner.run(&mut sink()));
    });
    let thread = issued
        .recv_timeout(Duration::from_secs(10))
        .expect("the first read is issued");
    // The replay thread waits for the lost read's callback; waiting must not
    // burn its (shared) executor thread.
    let window = Duration::from_secs(1);
    if let Some(t0) = thread_cpu_ticks(&thread) {
        std::thread::sleep(window);
        let t1 = thread_cpu_ticks(&thread).expect("replay thread still alive");
        assert!(
            t1 - t0 < 10,
            "the replay thread used {} ticks of CPU in {window:?} waiting for one read: it spins",
            t1 - t0
        );
    }
    assert!(
        done.try_recv().is_err(),
        "the attempt waits for its outstanding read"
    );
    assert_eq!(a.reads_issued(), 1);
    let interrupted_at = Instant::now();
    a.interrupt();
    let result = done
        .recv_timeout(Duration::from_secs(2))
        .expect("an interrupted attempt ends within 2 s");
    assert!(
        matches!(result, Err(PendingAckError::Interrupted { .. })),
        "{result:?}"
    );
    println!(
        "interrupt ended the waiting attempt in {:?}",
        interrupted_at.elapsed()
    );
    assert!(a.is_stopped());
    // The late callback of the lost read changes nothing.
    let before = cursor.read_position();
    lost.jobs.take().run();
    assert_eq!(cursor.read_position(), before);
}

#[test]
fn replay_config_needs_a_batch_below_the_queue_capacity() {
    let ok = |queue_capacity, read_batch| {
        ReplayConfig {
            queue_capacity,
            read_batch,
        }
        .validate()
        .is_ok()
    };
    assert!(ok(2000, 100));
    assert!(ok(2, 1));
    assert!(!ok(2, 2), "read_batch must be below the capacity");
    assert!(!ok(2, 3));
    assert!(!ok(10, 0), "read_batch must be at least 1");
    assert!(ReplayConfig::default().validate().is_ok());
}

#[test]
fn classify_completes_only_the_three_completing_shapes() {
    use FailureDisposition::*;
    let lost = LedgerError::LedgerNotExist { ledger_id: 3 };
    let bad = LedgerError::NonRecoverableData {
        position: Position::new(3, 1),
    };
    let fenced = LedgerError::Fenced { ledger: "l".into() };
    let closed = LedgerError::CursorAlreadyClosed {
        ledger: "l".into(),
        cursor: "c".into(),
    };
    for (e, skip_off, skip_on) in [
        (&lost, FailsAttempt, CompletesReplay),
        (&bad, FailsAttempt, CompletesReplay),
        (&fenced, CompletesReplay, CompletesReplay),
        (&closed, CompletesReplay, CompletesReplay),
        (&unavailable(), FailsAttempt, FailsAttempt),
        (&LedgerError::TooManyRequests, FailsAttempt, FailsAttempt),
    ] {
        assert_eq!(classify(e, false), skip_off, "{e} with auto-skip off");
        assert_eq!(classify(e, true), skip_on, "{e} with auto-skip on");
    }
}
