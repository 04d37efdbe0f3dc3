//! A pending-ack log read failure after read-ahead must end the replay
//! attempt: the attempt issues no further read, the cursor is
//! rewound so the retry applies every record (also those read ahead and not
//! yet applied), and the replay completes after the backoff.
//!
//! The replay runs on a helper thread under a watchdog: an attempt that
//! keeps re-issuing the failing read (Pulsar's hot loop: an unclassified
//! failure only logged) never returns, and the watchdog fails the test with
//! a named message after a bound instead of hanging the test run.
//!
//! Plain std test: compiled out in loom/shuttle builds.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use pulsar_core::ledger::{LedgerConfig, ManagedLedger, MemoryStore, ReadFailureKind};
use pulsar_core::pending_ack::*;
use pulsar_core::Position;

/// Wall-clock bound for the whole replay (a healthy one takes milliseconds).
const WATCHDOG: Duration = Duration::from_secs(20);
/// Reads a hot loop would exceed quickly; a correct attempt stops at the
/// failing read.
const MAX_READS: usize = 1_000;

#[derive(Debug)]
struct Outcome {
    state: HandleState,
    summary: PendingAckSummary,
    expected: PendingAckSummary,
    stats: HandleStats,
}

/// Writes `txns` transactions, each an individual ack then a commit
/// (one record per entry), and returns the ledger and the summary a
/// complete replay must produce.
fn write_log(txns: u64) -> (Arc<ManagedLedger>, PendingAckSummary) {
    let cfg = LedgerConfig {
        max_entries_per_ledger: 1_000,
        auto_skip_non_recoverable_data: false,
    };
    let ml = ManagedLedger::open("read-failure", cfg, Arc::new(MemoryStore::new())).unwrap();
    let mut expected = PendingAckSummary {
        mark_delete: Position::new(-1, -1),
        ..Default::default()
    };
    for i in 0..txns {
        let t = TxnId::new(1, i);
        let p = Position::new(100, i as i64);
        ml.append(&PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p)]).encode())
            .unwrap();
        if i % 2 == 0 {
            ml.append(&PendingAckRecord::commit(t, AckType::Individual).encode())
                .unwrap();
            expected.deleted.insert(p);
        } else {
            expected
                .individual
                .insert(t, std::collections::BTreeSet::from([p]));
        }
    }
    (ml, expected)
}

/// Replays with read `fail_read` (1-based, of the whole handle) failing
/// with `kind`, on a helper thread; the watchdog bounds wall time and reads.
fn replay_with_failing_read(fail_read: usize, kind: ReadFailureKind) -> Outcome {
    let (ml, expected) = write_log(30);
    let reads = Arc::new(AtomicUsize::new(0));
    {
        let reads = Arc::clone(&reads);
        ml.faults().set_policy(move |_| {
            let n = reads.fetch_add(1, Ordering::SeqCst) + 1;
            (n == fail_read || n > MAX_READS).then_some(kind)
        });
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let cursor = Arc::new(ml.open_cursor("__pending_ack_state").unwrap());
        let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
        let timer = Arc::new(VirtualTimer::new());
        let cfg = HandleConfig {
            replay: ReplayConfig {
                queue_capacity: 20,
                read_batch: 4,
            },
            ..HandleConfig::default()
        };
        let h = PendingAckHandle::new(
            "read-failure",
            cursor,
            Arc::new(MemorySubscription::default()),
            &pool,
            Arc::new(InlineReads),
            Arc::clone(&timer) as Arc<dyn Timer>,
            cfg,
        )
        .unwrap();
        h.init();
        for _ in 0..1_000 {
            pool.run_pending();
            if matches!(h.state(), HandleState::Ready | HandleState::Error) {
                break;
            }
            if !timer.fire_next() {
                break;
            }
        }
        let _ = tx.send(Outcome {
            state: h.state(),
            summary: h.summary(),
            expected,
            stats: h.stats(),
        });
    });
    match rx.recv_timeout(WATCHDOG) {
        Ok(outcome) => outcome,
        Err(_) => panic!(
            "replay livelock: the attempt did not end within {WATCHDOG:?} after read {fail_read} \
             failed with {kind:?} ({} reads issued): a failed read must end the attempt",
            reads.load(Ordering::SeqCst)
        ),
    }
}

#[test]
fn transient_failure_after_read_ahead_ends_the_attempt_and_the_retry_applies_everything() {
    // Reads 1 and 2 succeed (8 entries queued, some unapplied), read 3 fails.
    let o = replay_with_failing_read(3, ReadFailureKind::StorageUnavailable);
    assert_eq!(o.state, HandleState::Ready, "{o:?}");
    assert_eq!(o.stats.attempts, 2, "one failed attempt, one retry: {o:?}");
    assert!(
        o.stats.max_reads_per_attempt <= 16,
        "no read after the failure: {o:?}"
    );
    assert_eq!(
        o.summary, o.expected,
        "the retry must re-read what the failed attempt read ahead"
    );
}

#[test]
fn throttled_read_on_the_first_read_ends_the_attempt() {
    let o = replay_with_failing_read(1, ReadFailureKind::TooManyRequests);
    assert_eq!(o.state, HandleState::Ready, "{o:?}");
    assert_eq!(o.stats.attempts, 2, "{o:?}");
    assert_eq!(o.summary, o.expected);
}
