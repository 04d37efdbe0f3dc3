//! Scenario tests of the pending-ack replay on virtual time (every read failure ends the attempt, no read after a failure): the
//! numbers quoted in docs/internals/ARCHITECTURE.md come from these tests (run with
//! `--nocapture` to see them printed).
//!
//! Plain std test: compiled out in loom/shuttle builds (their primitives
//! only work inside a model).
#![cfg(not(any(loom, feature = "shuttle")))]

#[path = "common/watchdog.rs"]
mod watchdog;

/// Bound of the whole test binary (it runs in about a second): a replay
/// that spins on the manual executor fails with a named HANG, not a timeout.
const WATCHDOG: std::time::Duration = std::time::Duration::from_secs(20);

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pulsar_core::ledger::{
    LedgerConfig, LedgerError, LedgerStore, ManagedCursor, ManagedLedger, MemoryStore,
    ReadFailureKind,
};
use pulsar_core::pending_ack::*;
use pulsar_core::Position;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

// ------------------------------------------------------------ helpers

/// Counts pending_ack log events per level.
#[derive(Clone, Default)]
struct LevelCount(Arc<Mutex<BTreeMap<Level, usize>>>);

impl<S: Subscriber> Layer<S> for LevelCount {
    fn on_event(&self, e: &Event<'_>, _: Context<'_, S>) {
        if e.metadata()
            .target()
            .starts_with("pulsar_core::pending_ack")
        {
            *self
                .0
                .lock()
                .unwrap()
                .entry(*e.metadata().level())
                .or_default() += 1;
        }
    }
}

impl LevelCount {
    fn get(&self, l: Level) -> usize {
        self.0.lock().unwrap().get(&l).copied().unwrap_or(0)
    }
}

fn with_log_count<R>(f: impl FnOnce() -> R) -> (R, LevelCount) {
    let counts = LevelCount::default();
    let sub = tracing_subscriber::registry().with(counts.clone());
    let r = tracing::subscriber::with_default(sub, f);
    (r, counts)
}

struct Log {
    ml: Arc<ManagedLedger>,
    cursor: Arc<ManagedCursor>,
    expected: PendingAckSummary,
    records: usize,
}

/// Writes `txns` transactions (ACK of one position each, then every third
/// commits, every third aborts, the rest stay pending) plus one committed
/// cumulative ack, one record per entry; returns the reference summary
/// computed by a simple model independent of the handlers.
fn write_log(store: Arc<dyn LedgerStore>, name: &str, cfg: LedgerConfig, txns: u64) -> Log {
    watchdog::arm_for_process("tests/pending_ack_scenarios.rs", WATCHDOG);
    let ml = ManagedLedger::open(name, cfg, store).unwrap();
    let mut expected = PendingAckSummary {
        mark_delete: Position::new(-1, -1),
        ..Default::default()
    };
    let mut records = 0;
    for i in 0..txns {
        let t = TxnId::new(1, i);
        let p = Position::new(100, i as i64);
        ml.append(&PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p)]).encode())
            .unwrap();
        records += 1;
        match i % 3 {
            0 => {
                ml.append(&PendingAckRecord::commit(t, AckType::Individual).encode())
                    .unwrap();
                records += 1;
                expected.deleted.insert(p);
            }
            1 => {
                ml.append(&PendingAckRecord::abort(t, AckType::Individual).encode())
                    .unwrap();
                records += 1;
            }
            _ => {
                expected.individual.insert(t, BTreeSet::from([p]));
            }
        }
    }
    let tc = TxnId::new(2, 0);
    ml.append(&PendingAckRecord::cumulative_ack(tc, Position::new(50, 7)).encode())
        .unwrap();
    ml.append(&PendingAckRecord::commit(tc, AckType::Cumulative).encode())
        .unwrap();
    records += 2;
    expected.mark_delete = Position::new(50, 7);
    let cursor = Arc::new(ml.open_cursor("__pending_ack_state").unwrap());
    Log {
        ml,
        cursor,
        expected,
        records,
    }
}

fn small_replay() -> HandleConfig {
    HandleConfig {
        replay: ReplayConfig {
            queue_capacity: 20,
            read_batch: 4,
        },
        ..HandleConfig::default()
    }
}

/// Runs executors and the virtual timer until every handle is Ready/Error
/// (or `max_fires` timer tasks ran).
fn drive(pool: &ReplayExecutorPool, timer: &VirtualTimer, handles: &[&PendingAckHandle]) {
    for _ in 0..10_000 {
        pool.run_pending();
        if handles
            .iter()
            .all(|h| matches!(h.state(), HandleState::Ready | HandleState::Error))
        {
            return;
        }
        assert!(
            timer.fire_next(),
            "nothing left to run but handles not settled"
        );
    }
    panic!("handles did not settle");
}

fn manual() -> (Arc<ReplayExecutorPool>, Arc<VirtualTimer>) {
    watchdog::arm_for_process("tests/pending_ack_scenarios.rs", WATCHDOG);
    (
        ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap(),
        Arc::new(VirtualTimer::new()),
    )
}

fn handle(
    name: &str,
    log: &Log,
    pool: &ReplayExecutorPool,
    timer: &Arc<VirtualTimer>,
    cfg: HandleConfig,
) -> PendingAckHandle {
    PendingAckHandle::new(
        name,
        Arc::clone(&log.cursor),
        Arc::new(MemorySubscription::default()),
        pool,
        Arc::new(InlineReads),
        Arc::clone(timer) as Arc<dyn Timer>,
        cfg,
    )
    .unwrap()
}

// ------------------------------------------------------------ scenarios

#[test]
fn healthy_log_replays_every_record() {
    let (pool, timer) = manual();
    let log = write_log(
        Arc::new(MemoryStore::new()),
        "ok",
        LedgerConfig::default(),
        30,
    );
    let h = handle("ok", &log, &pool, &timer, small_replay());
    let w = h.ready_waiter();
    h.init();
    drive(&pool, &timer, &[&h]);
    assert_eq!(w.try_result(), Some(Ok(())));
    assert_eq!(h.summary(), log.expected);
    let s = h.stats();
    assert_eq!(s.attempts, 1);
    assert!(s.completed.as_ref().unwrap().caught_up);
    assert_eq!(s.completed.unwrap().records_applied, log.records as u64);
}

#[test]
fn deleted_ledger_without_auto_skip_errors_after_exactly_one_read() {
    let (pool, timer) = manual();
    let cfg = LedgerConfig {
        max_entries_per_ledger: 10,
        auto_skip_non_recoverable_data: false,
    };
    let log = write_log(Arc::new(MemoryStore::new()), "lost", cfg, 20);
    log.ml.mark_ledger_lost(1).unwrap();
    let reads = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&reads);
    log.ml.faults().set_policy(move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        None
    });
    let h = handle("lost", &log, &pool, &timer, small_replay());
    let w = h.ready_waiter();
    let ((), logs) = with_log_count(|| {
        h.init();
        drive(&pool, &timer, &[&h]);
    });
    assert_eq!(h.state(), HandleState::Error);
    assert_eq!(reads.load(Ordering::SeqCst), 1, "exactly one read");
    assert_eq!(h.stats().reads_issued, 1);
    assert_eq!(timer.pending(), 0, "no retry, no flush timer left");
    match w.try_result() {
        Some(Err(PendingAckError::InitFailed { cause, .. })) => assert!(matches!(
            *cause,
            PendingAckError::Ledger(LedgerError::LedgerNotExist { ledger_id: 1 })
        )),
        other => panic!("waiter must fail with InitFailed, got {other:?}"),
    }
    assert_eq!(logs.get(Level::ERROR), 1, "one ERROR on give-up");
    assert_eq!(logs.get(Level::WARN), 0);
    // Later requests fail with NotReady, never hang.
    let got = Arc::new(Mutex::new(None));
    let g = Arc::clone(&got);
    h.append(
        PendingAckRecord::commit(TxnId::new(1, 2), AckType::Individual),
        Box::new(move |r| *g.lock().unwrap() = Some(r)),
    );
    assert!(matches!(
        *got.lock().unwrap(),
        Some(Err(PendingAckError::NotReady { .. }))
    ));
    println!(
        "SCENARIO deleted-ledger: state=Error reads={} virtual_ms={}",
        reads.load(Ordering::SeqCst),
        timer.now_ms()
    );
}

#[test]
fn deleted_ledger_with_auto_skip_completes() {
    let (pool, timer) = manual();
    let cfg = LedgerConfig {
        max_entries_per_ledger: 10,
        auto_skip_non_recoverable_data: true,
    };
    let log = write_log(Arc::new(MemoryStore::new()), "skip", cfg, 20);
    log.ml.mark_ledger_lost(1).unwrap();
    let h = handle("skip", &log, &pool, &timer, small_replay());
    h.init();
    drive(&pool, &timer, &[&h]);
    assert_eq!(h.state(), HandleState::Ready);
    assert_eq!(h.stats().attempts, 1);
}

#[test]
fn storage_outage_of_10s_follows_the_backoff_schedule_and_neighbour_is_not_starved() {
    let (pool, timer) = manual();
    let log = write_log(
        Arc::new(MemoryStore::new()),
        "outage",
        LedgerConfig::default(),
        30,
    );
    let healthy = write_log(
        Arc::new(MemoryStore::new()),
        "neighbour",
        LedgerConfig::default(),
        30,
    );
    let reads_in_outage = Arc::new(AtomicUsize::new(0));
    let reads_total = Arc::new(AtomicUsize::new(0));
    {
        let (ri, rt, t) = (
            Arc::clone(&reads_in_outage),
            Arc::clone(&reads_total),
            Arc::clone(&timer),
        );
        log.ml.faults().set_policy(move |_| {
            rt.fetch_add(1, Ordering::SeqCst);
            if t.now_ms() < 10_000 {
                ri.fetch_add(1, Ordering::SeqCst);
                Some(ReadFailureKind::StorageUnavailable)
            } else {
                None
            }
        });
    }
    let h = handle("outage", &log, &pool, &timer, small_replay());
    let n = handle("neighbour", &healthy, &pool, &timer, small_replay());
    assert_eq!(
        h.executor_index(),
        n.executor_index(),
        "same replay executor"
    );
    let w = h.ready_waiter();
    let ((), logs) = with_log_count(|| {
        h.init();
        pool.run_pending();
        // The neighbour is added while the failing handle waits for a retry.
        timer.advance_to(100);
        pool.run_pending();
        timer.advance_to(150);
        n.init();
        pool.run_pending();
        assert_eq!(
            n.state(),
            HandleState::Ready,
            "neighbour ready during the outage"
        );
        let neighbour_ready_at = timer.now_ms();
        assert!(matches!(
            h.state(),
            HandleState::None | HandleState::Initializing
        ));
        drive(&pool, &timer, &[&h]);
        println!("SCENARIO neighbour ready at virtual {neighbour_ready_at} ms");
    });
    assert_eq!(h.state(), HandleState::Ready);
    assert_eq!(w.try_result(), Some(Ok(())));
    assert_eq!(h.summary(), log.expected, "every record applied");
    // Reads during the outage = attempts scheduled before 10 s by backoff.
    let stats = h.stats();
    let mut t = 0u64;
    let mut expected_reads = 0;
    for d in std::iter::once(0).chain(stats.retry_delays_ms.iter().copied()) {
        t += d;
        if t < 10_000 {
            expected_reads += 1;
        }
    }
    let in_outage = reads_in_outage.load(Ordering::SeqCst);
    assert_eq!(in_outage, expected_reads);
    assert_eq!(
        in_outage, 7,
        "0,100,300,700,1500,3100,6300 ms (minus jitter)"
    );
    assert_eq!(stats.retry_delays_ms.len(), 7);
    assert_eq!(
        stats.max_reads_per_attempt as usize,
        (log.records).div_ceil(4)
    );
    assert_eq!(logs.get(Level::WARN), 7, "one WARN per retry");
    assert_eq!(logs.get(Level::ERROR), 0);
    println!(
        "SCENARIO outage-10s: reads_in_outage={in_outage} retry_delays_ms={:?} ready_at_ms={} total_reads={} (Java spun ~1000 reads/s = ~10000)",
        stats.retry_delays_ms,
        timer.now_ms(),
        reads_total.load(Ordering::SeqCst)
    );
}

#[test]
fn failed_attempt_rewinds_so_the_retry_applies_every_record() {
    let (pool, timer) = manual();
    let log = write_log(
        Arc::new(MemoryStore::new()),
        "rewind",
        LedgerConfig::default(),
        12,
    );
    // The first read succeeds (4 entries queued, unapplied), the second fails.
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = Arc::clone(&n);
    log.ml.faults().set_policy(move |_| {
        (n2.fetch_add(1, Ordering::SeqCst) == 1).then_some(ReadFailureKind::TooManyRequests)
    });
    let h = handle("rewind", &log, &pool, &timer, small_replay());
    h.init();
    pool.run_pending();
    assert_eq!(h.state(), HandleState::None, "waiting for retry");
    let c = &log.cursor;
    assert_eq!(
        c.read_position(),
        log.ml.next_valid_position(c.mark_delete_position()),
        "failed attempt rewound the cursor"
    );
    drive(&pool, &timer, &[&h]);
    assert_eq!(h.summary(), log.expected);
    assert_eq!(h.stats().attempts, 2);
}

#[test]
fn completing_shapes_complete_without_retry_or_rewind() {
    for kind in [
        ReadFailureKind::Fenced,
        ReadFailureKind::CursorAlreadyClosed,
    ] {
        let (pool, timer) = manual();
        let log = write_log(
            Arc::new(MemoryStore::new()),
            "c",
            LedgerConfig::default(),
            12,
        );
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = Arc::clone(&n);
        log.ml
            .faults()
            .set_policy(move |_| (n2.fetch_add(1, Ordering::SeqCst) == 1).then_some(kind));
        let h = handle("c", &log, &pool, &timer, small_replay());
        let ((), logs) = with_log_count(|| {
            h.init();
            pool.run_pending();
        });
        assert_eq!(h.state(), HandleState::Ready, "{kind:?}");
        let report = h.stats().completed.unwrap();
        assert!(report.completing_failure.is_some());
        assert_eq!(report.reads_issued, 2);
        assert_ne!(
            log.cursor.read_position(),
            log.ml
                .next_valid_position(log.cursor.mark_delete_position()),
            "not rewound"
        );
        assert_eq!(logs.get(Level::WARN), 1, "one WARN for {kind:?}");
        assert_eq!(timer.pending(), 0);
    }
}

#[test]
fn corrupt_entry_fails_the_handle_not_the_process() {
    let (pool, timer) = manual();
    let log = write_log(
        Arc::new(MemoryStore::new()),
        "bad",
        LedgerConfig::default(),
        3,
    );
    log.ml.append(&[0x0e, 0x01, 0x00, 0x09]).unwrap();
    let h = handle("bad", &log, &pool, &timer, small_replay());
    let w = h.ready_waiter();
    h.init();
    drive(&pool, &timer, &[&h]);
    assert_eq!(h.state(), HandleState::Error);
    match w.try_result() {
        Some(Err(PendingAckError::InitFailed { cause, .. })) => {
            assert!(matches!(*cause, PendingAckError::Decode { .. }))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn close_during_pending_retry_wins() {
    let (pool, timer) = manual();
    let log = write_log(
        Arc::new(MemoryStore::new()),
        "close",
        LedgerConfig::default(),
        3,
    );
    log.ml
        .faults()
        .fail_next_reads(ReadFailureKind::StorageUnavailable, 1);
    let h = handle("close", &log, &pool, &timer, small_replay());
    let w = h.ready_waiter();
    h.init();
    pool.run_pending();
    assert_eq!(h.state(), HandleState::None);
    assert_eq!(timer.pending(), 1, "only the retry timer (writer closed)");
    h.close();
    assert_eq!(timer.pending(), 0, "retry cancelled");
    assert!(matches!(
        w.try_result(),
        Some(Err(PendingAckError::Closed { .. }))
    ));
    h.init();
    pool.run_pending();
    assert_eq!(h.state(), HandleState::Close);
    assert!(matches!(
        h.ready_waiter().try_result(),
        Some(Err(PendingAckError::Closed { .. }))
    ));
}

/// An `init` while a retry is pending starts the attempt now and cancels that
/// retry: at most one retry timer is armed, so a later failure's backoff is
/// never cut short by an older timer.
#[test]
fn init_during_a_pending_retry_replaces_the_retry_timer() {
    let (pool, timer) = manual();
    let log = write_log(
        Arc::new(MemoryStore::new()),
        "reinit",
        LedgerConfig::default(),
        3,
    );
    log.ml
        .faults()
        .fail_next_reads(ReadFailureKind::StorageUnavailable, 2);
    let h = handle("reinit", &log, &pool, &timer, small_replay());
    h.init();
    pool.run_pending();
    assert_eq!(h.state(), HandleState::None);
    assert_eq!(timer.pending(), 1);
    h.init();
    pool.run_pending();
    assert_eq!(h.state(), HandleState::None);
    assert_eq!(h.stats().attempts, 2);
    assert_eq!(
        timer.pending(),
        1,
        "only the second failure's retry is armed"
    );
    let second_delay = *h.stats().retry_delays_ms.last().unwrap();
    timer.advance(second_delay - 1);
    pool.run_pending();
    assert_eq!(
        h.stats().attempts,
        2,
        "no attempt before the backoff elapsed"
    );
    timer.advance(1);
    pool.run_pending();
    assert_eq!(h.state(), HandleState::Ready);
    assert_eq!(h.stats().attempts, 3);
}

#[test]
fn failed_attempt_with_batching_cancels_the_flush_timer() {
    let (pool, timer) = manual();
    let log = write_log(
        Arc::new(MemoryStore::new()),
        "batch",
        LedgerConfig::default(),
        6,
    );
    log.ml
        .faults()
        .fail_next_reads(ReadFailureKind::StorageUnavailable, 1);
    let cfg = HandleConfig {
        writer: WriterConfig {
            batch_enabled: true,
            ..WriterConfig::default()
        },
        ..small_replay()
    };
    let h = handle("batch", &log, &pool, &timer, cfg);
    // Queued before Ready: applied after Ready through the batched writer.
    let acked = Arc::new(Mutex::new(Vec::new()));
    let t = TxnId::new(9, 9);
    for rec in [
        PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(Position::new(200, 1))]),
        PendingAckRecord::commit(t, AckType::Individual),
    ] {
        let a = Arc::clone(&acked);
        h.append(rec, Box::new(move |r| a.lock().unwrap().push(r)));
    }
    h.init();
    pool.run_pending();
    let failed = h.last_failed_writer().expect("the failed attempt's writer");
    assert_eq!(failed.state(), WriterState::Closed);
    assert!(!failed.has_flush_timer(), "flush timer cancelled");
    assert_eq!(timer.pending(), 1, "only the handle's retry timer remains");
    let runs_before = failed.timer_runs();
    drive(&pool, &timer, &[&h]);
    assert_eq!(h.state(), HandleState::Ready);
    assert!(
        acked.lock().unwrap().is_empty(),
        "buffered until the flush timer"
    );
    timer.advance(1);
    let acks = acked.lock().unwrap().clone();
    assert_eq!(acks.len(), 2);
    let a0 = acks[0].clone().unwrap();
    assert_eq!((a0.batch_size, a0.batch_index), (2, 0));
    assert!(h.summary().deleted.contains(&Position::new(200, 1)));
    assert_eq!(
        failed.timer_runs(),
        runs_before,
        "the orphan's timer never ran again"
    );
    // The batched entry is in the log in the 0x0e01 form and replays.
    let (pool2, timer2) = manual();
    let cursor2 = Arc::new(log.ml.open_cursor("replay-again").unwrap());
    let h2 = PendingAckHandle::new(
        "again",
        cursor2,
        Arc::new(MemorySubscription::default()),
        &pool2,
        Arc::new(InlineReads),
        timer2.clone(),
        small_replay(),
    )
    .unwrap();
    h2.init();
    drive(&pool2, &timer2, &[&h2]);
    assert_eq!(h2.summary(), h.summary());
}

#[test]
fn threads_reader_thread_and_system_timer() {
    let pool = ReplayExecutorPool::new(2, ExecutorMode::Threads).unwrap();
    let timer: Arc<dyn Timer> = Arc::new(SystemTimer::start().unwrap());
    let reader = Arc::new(ReaderThread::start());
    let log = write_log(
        Arc::new(MemoryStore::new()),
        "thr",
        LedgerConfig::default(),
        300,
    );
    log.ml
        .faults()
        .fail_next_reads(ReadFailureKind::StorageUnavailable, 2);
    let h = PendingAckHandle::new(
        "thr",
        Arc::clone(&log.cursor),
        Arc::new(MemorySubscription::default()),
        &pool,
        reader.clone(),
        timer,
        HandleConfig::default(),
    )
    .unwrap();
    let w = h.ready_waiter();
    h.init();
    let r = w.wait_timeout(std::time::Duration::from_secs(10));
    assert_eq!(r, Some(Ok(())));
    assert_eq!(h.summary(), log.expected);
    assert_eq!(h.stats().attempts, 3);
    h.close();
    pool.shutdown();
    reader.shutdown();
}

#[test]
fn threads_one_executor_failing_neighbours_do_not_starve_a_healthy_handle() {
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Threads).unwrap();
    let timer: Arc<dyn Timer> = Arc::new(SystemTimer::start().unwrap());
    let reader = Arc::new(ReaderThread::start());
    let lost_cfg = LedgerConfig {
        max_entries_per_ledger: 10,
        auto_skip_non_recoverable_data: false,
    };
    let lost = write_log(Arc::new(MemoryStore::new()), "lost", lost_cfg, 20);
    lost.ml.mark_ledger_lost(1).unwrap();
    let outage = write_log(
        Arc::new(MemoryStore::new()),
        "outage",
        LedgerConfig::default(),
        50,
    );
    let start = std::time::Instant::now();
    outage.ml.faults().set_policy(move |_| {
        (start.elapsed() < std::time::Duration::from_millis(1_000))
            .then_some(ReadFailureKind::StorageUnavailable)
    });
    let healthy = write_log(
        Arc::new(MemoryStore::new()),
        "healthy",
        LedgerConfig::default(),
        50,
    );
    let mk = |name: &str, log: &Log| {
        PendingAckHandle::new(
            name,
            Arc::clone(&log.cursor),
            Arc::new(MemorySubscription::default()),
            &pool,
            reader.clone(),
            Arc::clone(&timer),
            HandleConfig::default(),
        )
        .unwrap()
    };
    let (hl, ho, hh) = (
        mk("lost", &lost),
        mk("outage", &outage),
        mk("healthy", &healthy),
    );
    let waiters = [hl.ready_waiter(), ho.ready_waiter(), hh.ready_waiter()];
    hl.init();
    ho.init();
    hh.init();
    let t = std::time::Duration::from_secs(10);
    assert_eq!(
        waiters[2].wait_timeout(t),
        Some(Ok(())),
        "healthy neighbour"
    );
    let healthy_ms = start.elapsed().as_millis();
    assert!(matches!(
        waiters[0].wait_timeout(t),
        Some(Err(PendingAckError::InitFailed { .. }))
    ));
    assert_eq!(waiters[1].wait_timeout(t), Some(Ok(())));
    assert_eq!(hl.stats().reads_issued, 1);
    assert_eq!(ho.summary(), outage.expected);
    assert_eq!(hh.summary(), healthy.expected);
    assert!(
        healthy_ms < 250,
        "healthy handle ready during the outage ({healthy_ms} ms)"
    );
    println!(
        "SCENARIO threads: healthy ready at {healthy_ms} ms, outage retries {:?}",
        ho.stats().retry_delays_ms
    );
    for h in [&hl, &ho, &hh] {
        h.close();
    }
    pool.shutdown();
    reader.shutdown();
}
