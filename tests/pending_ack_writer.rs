//! Buffered writer, executor pool and classification unit tests (std).
#![cfg(not(any(loom, feature = "shuttle")))]

use std::sync::{Arc, Mutex};

use pulsar_core::ledger::{LedgerConfig, LedgerError, ManagedLedger, MemoryStore};
use pulsar_core::pending_ack::record::decode_entry;
use pulsar_core::pending_ack::*;
use pulsar_core::Position;

type Results = Arc<Mutex<Vec<Result<AppendAck, PendingAckError>>>>;

fn setup(cfg: WriterConfig) -> (Arc<ManagedLedger>, Arc<VirtualTimer>, Arc<BufferedWriter>) {
    let ml =
        ManagedLedger::open("w", LedgerConfig::default(), Arc::new(MemoryStore::new())).unwrap();
    let timer = Arc::new(VirtualTimer::new());
    let w = BufferedWriter::open(Arc::clone(&ml), timer.clone(), cfg).unwrap();
    (ml, timer, w)
}

fn rec(i: u64) -> PendingAckRecord {
    PendingAckRecord::individual_ack(
        TxnId::new(1, i),
        vec![AckedPosition::whole(Position::new(3, i as i64))],
    )
}

fn append(w: &BufferedWriter, r: PendingAckRecord, out: &Results) {
    let out = Arc::clone(out);
    w.append(r, Box::new(move |x| out.lock().unwrap().push(x)));
}

fn batching() -> WriterConfig {
    WriterConfig {
        batch_enabled: true,
        ..WriterConfig::default()
    }
}

#[test]
fn unbatched_appends_go_straight_to_the_ledger() {
    let (ml, timer, w) = setup(WriterConfig::default());
    let out: Results = Default::default();
    append(&w, rec(1), &out);
    assert_eq!(timer.pending(), 0, "no flush timer without batching");
    let a = out.lock().unwrap()[0].clone().unwrap();
    assert_eq!((a.batch_size, a.batch_index), (1, 0));
    assert_eq!(ml.last_confirmed_entry(), a.position);
}

#[test]
fn flushes_at_512_records() {
    let (ml, timer, w) = setup(batching());
    let out: Results = Default::default();
    for i in 0..511 {
        append(&w, rec(i), &out);
    }
    assert!(out.lock().unwrap().is_empty());
    append(&w, rec(511), &out);
    let acks = out.lock().unwrap().clone();
    assert_eq!(acks.len(), 512);
    assert!(acks.iter().all(|a| a.as_ref().unwrap().batch_size == 512));
    assert_eq!(
        ml.ledgers().iter().map(|l| l.1).sum::<i64>(),
        1,
        "one batched entry"
    );
    assert_eq!(w.buffered(), 0);
    assert!(w.has_flush_timer(), "the one-shot timer stays armed");
    let _ = timer;
}

#[test]
fn flushes_at_4_mib_and_writes_oversized_records_alone() {
    let (ml, _timer, w) = setup(batching());
    let out: Results = Default::default();
    // n all-unacked ack_set words over positions whose batches are at most
    // AckedPosition::MAX_BATCH_SIZE (64 * 16384) messages.
    let big = |i: u64, n: usize| {
        let per = AckedPosition::MAX_BATCH_SIZE as usize / 64;
        let positions = (0..n.div_ceil(per))
            .map(|k| {
                let words = per.min(n - k * per);
                AckedPosition {
                    position: Position::new(4, (i * 1000 + k as u64) as i64),
                    batch_size: (64 * words) as i32,
                    ack_set: vec![-1; words],
                }
            })
            .collect();
        PendingAckRecord::individual_ack(TxnId::new(2, i), positions)
    };
    // ~1.1 MiB each (n unpacked words: a tag byte + 10 varint bytes): the
    // 4th reaches 4 MiB.
    for i in 0..4 {
        append(&w, big(i, 105_000), &out);
    }
    assert_eq!(out.lock().unwrap().len(), 4, "byte limit flushed the batch");
    // One record over 4 MiB: written by itself after flushing the buffer.
    append(&w, rec(9), &out);
    append(&w, big(10, 420_000), &out);
    let acks = out.lock().unwrap().clone();
    assert_eq!(acks.len(), 6);
    assert_eq!(acks[4].as_ref().unwrap().batch_size, 1);
    assert_eq!(acks[5].as_ref().unwrap().batch_size, 1);
    assert_eq!(ml.ledgers().iter().map(|l| l.1).sum::<i64>(), 3);
}

#[test]
fn timer_flushes_and_rearms_close_cancels_and_fails_unflushed() {
    let (ml, timer, w) = setup(batching());
    let out: Results = Default::default();
    append(&w, rec(1), &out);
    append(&w, rec(2), &out);
    timer.advance(1);
    assert_eq!(out.lock().unwrap().len(), 2, "1 ms flush");
    assert_eq!(w.timer_runs(), 1);
    assert_eq!(
        timer.pending(),
        1,
        "re-armed once (one-shot, not fixed-rate)"
    );
    timer.advance(5);
    assert_eq!(w.timer_runs(), 6);
    // The flushed entry is in the batched form.
    let lce = ml.last_confirmed_entry();
    let cursor = ml.open_cursor("c").unwrap();
    let e = cursor.read_entries(10).unwrap();
    assert_eq!(e.last().unwrap().position, lce);
    assert_eq!(&e[0].data[..2], &[0x0e, 0x01]);
    assert_eq!(decode_entry(lce, &e[0].data).unwrap().len(), 2);
    append(&w, rec(3), &out);
    assert_eq!(w.close(), 1, "one unflushed callback failed");
    assert_eq!(timer.pending(), 0, "flush timer cancelled");
    assert!(matches!(
        out.lock().unwrap()[2],
        Err(PendingAckError::WriterClosed)
    ));
    assert_eq!(w.close(), 0, "idempotent");
    append(&w, rec(4), &out);
    assert!(matches!(
        out.lock().unwrap()[3],
        Err(PendingAckError::WriterClosed)
    ));
    assert_eq!(w.state(), WriterState::Closed);
}

#[test]
fn bad_configs_and_records_are_typed_errors() {
    let ml =
        ManagedLedger::open("x", LedgerConfig::default(), Arc::new(MemoryStore::new())).unwrap();
    let timer = Arc::new(VirtualTimer::new());
    for cfg in [
        WriterConfig {
            batch_enabled: true,
            max_records: 5,
            ..WriterConfig::default()
        },
        WriterConfig {
            batch_enabled: true,
            max_bytes: 1024,
            ..WriterConfig::default()
        },
        WriterConfig {
            batch_enabled: true,
            max_delay_ms: 0,
            ..WriterConfig::default()
        },
    ] {
        assert!(matches!(
            BufferedWriter::open(Arc::clone(&ml), timer.clone(), cfg),
            Err(PendingAckError::InvalidConfig(_))
        ));
    }
    assert!(ReplayConfig {
        queue_capacity: 10,
        read_batch: 10
    }
    .validate()
    .is_err());
    assert!(ReplayConfig {
        queue_capacity: 10,
        read_batch: 0
    }
    .validate()
    .is_err());
    assert!(ReplayExecutorPool::new(0, ExecutorMode::Manual).is_err());
    let w = BufferedWriter::open(ml, timer, WriterConfig::default()).unwrap();
    let out: Results = Default::default();
    append(
        &w,
        PendingAckRecord::individual_ack(TxnId::new(0, 0), vec![]),
        &out,
    );
    assert!(matches!(
        out.lock().unwrap()[0],
        Err(PendingAckError::InvalidRecord(_))
    ));
}

#[test]
fn executor_assignment_is_stable_and_spreads() {
    let pool = ReplayExecutorPool::new(4, ExecutorMode::Manual).unwrap();
    let a = pool.executor_for("persistent://t/n/topic-1-sub").index();
    assert_eq!(a, pool.executor_for("persistent://t/n/topic-1-sub").index());
    let used: std::collections::BTreeSet<usize> = (0..64)
        .map(|i| pool.executor_for(&format!("topic-{i}")).index())
        .collect();
    assert_eq!(used.len(), 4);
    let ran = Arc::new(Mutex::new(Vec::new()));
    for i in 0..3 {
        let r = Arc::clone(&ran);
        assert!(pool
            .executor(0)
            .submit(Box::new(move || r.lock().unwrap().push(i))));
    }
    assert_eq!(pool.run_pending(), 3);
    assert_eq!(*ran.lock().unwrap(), vec![0, 1, 2], "single-threaded FIFO");
    pool.shutdown();
    assert!(!pool.executor(0).submit(Box::new(|| {})));
}

#[test]
fn classification_matches_the_three_completing_shapes() {
    use FailureDisposition::*;
    let lost = LedgerError::LedgerNotExist { ledger_id: 1 };
    let nr = LedgerError::NonRecoverableData {
        position: Position::new(1, 0),
    };
    let fenced = LedgerError::Fenced { ledger: "l".into() };
    let closed = LedgerError::CursorAlreadyClosed {
        ledger: "l".into(),
        cursor: "c".into(),
    };
    let down = LedgerError::StorageUnavailable {
        reason: "-8".into(),
    };
    assert_eq!(classify(&lost, true), CompletesReplay);
    assert_eq!(classify(&nr, true), CompletesReplay);
    assert_eq!(classify(&lost, false), FailsAttempt);
    assert_eq!(classify(&fenced, false), CompletesReplay);
    assert_eq!(classify(&closed, false), CompletesReplay);
    assert_eq!(classify(&down, true), FailsAttempt);
    assert_eq!(classify(&LedgerError::TooManyRequests, false), FailsAttempt);
    // Retryability of what reaches the handle.
    assert!(!PendingAckError::Ledger(lost).is_retryable());
    assert!(!PendingAckError::Ledger(fenced).is_retryable());
    assert!(PendingAckError::Ledger(down).is_retryable());
    assert!(PendingAckError::Ledger(LedgerError::TooManyRequests).is_retryable());
    assert!(PendingAckError::Ledger(closed).is_retryable());
    assert!(!PendingAckError::Interrupted { name: "h".into() }.is_retryable());
}

/// `ReadyWaiter::wait_timeout` with a timeout the clock cannot represent waits
/// without limit instead of panicking.
#[test]
fn wait_timeout_with_huge_timeout_does_not_panic() {
    use pulsar_core::ledger::{LedgerConfig, ManagedLedger, MemoryStore};
    use pulsar_core::pending_ack::*;
    use std::sync::Arc;
    let store = Arc::new(MemoryStore::new());
    let ml = ManagedLedger::open(
        "t-sub__transaction_pending_ack",
        LedgerConfig::default(),
        store,
    )
    .unwrap();
    let cursor = Arc::new(ml.open_cursor("__pending_ack_state").unwrap());
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
    let timer = Arc::new(VirtualTimer::new());
    let handle = PendingAckHandle::new(
        "t-sub",
        cursor,
        Arc::new(MemorySubscription::default()),
        &pool,
        Arc::new(InlineReads),
        timer,
        HandleConfig::default(),
    )
    .unwrap();
    let waiter = handle.ready_waiter();
    handle.init();
    pool.run_pending();
    assert_eq!(waiter.wait_timeout(std::time::Duration::MAX), Some(Ok(())));
}

#[test]
fn batching_limits_are_valid_at_pulsars_minimums_and_not_below() {
    let at_minimum = WriterConfig {
        batch_enabled: true,
        max_records: 10,
        max_bytes: 128 * 1024,
        max_delay_ms: 1,
    };
    assert!(at_minimum.validate().is_ok());
    for below in [
        WriterConfig {
            max_records: 9,
            ..at_minimum
        },
        WriterConfig {
            max_bytes: 128 * 1024 - 1,
            ..at_minimum
        },
        WriterConfig {
            max_delay_ms: 0,
            ..at_minimum
        },
    ] {
        assert!(
            matches!(below.validate(), Err(PendingAckError::InvalidConfig(_))),
            "{below:?}"
        );
    }
}

#[test]
fn buffered_records_and_flushed_batches_are_counted() {
    let (_ml, timer, w) = setup(batching());
    let out: Results = Default::default();
    assert_eq!((w.buffered(), w.flushes()), (0, 0));
    for i in 0..3 {
        append(&w, rec(i), &out);
    }
    assert_eq!(w.buffered(), 3);
    assert!(timer.fire_next(), "the flush timer");
    assert_eq!((w.buffered(), w.flushes()), (0, 1));
    append(&w, rec(3), &out);
    assert!(timer.fire_next());
    assert_eq!((w.buffered(), w.flushes()), (0, 2));
    assert_eq!(out.lock().unwrap().len(), 4);
    assert!(format!("{w:?}").contains("BufferedWriter"));
}
