//! Replay throughput of the pending-ack log: reads inline on the replay
//! thread (baseline) vs on a separate reader thread, and single-record vs
//! batched (0x0e01) entries. Prints ratios against the inline baseline
//! measured in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use pulsar_core::__model::pending_ack::ReplayAttempt;
use pulsar_core::ledger::{LedgerConfig, ManagedCursor, ManagedLedger, MemoryStore};
use pulsar_core::pending_ack::record::encode_batch;
use pulsar_core::pending_ack::*;
use pulsar_core::Position;

const RECORDS: u64 = 2_000;

fn ack(i: u64) -> PendingAckRecord {
    PendingAckRecord::individual_ack(
        TxnId::new(1, i),
        vec![AckedPosition::whole(Position::new(9, i as i64))],
    )
}

/// A log of `RECORDS` pending (never resolved, so never trimmed) ACKs.
fn log(batched: bool) -> Arc<ManagedCursor> {
    let ml = ManagedLedger::open(
        "bench",
        LedgerConfig::default(),
        Arc::new(MemoryStore::new()),
    )
    .expect("ledger");
    if batched {
        let recs: Vec<PendingAckRecord> = (0..RECORDS).map(ack).collect();
        for chunk in recs.chunks(20) {
            ml.append(&encode_batch(chunk)).expect("append");
        }
    } else {
        for i in 0..RECORDS {
            ml.append(&ack(i).encode()).expect("append");
        }
    }
    Arc::new(ml.open_cursor("__pending_ack_state").expect("cursor"))
}

fn replay_once(cursor: &Arc<ManagedCursor>, dispatcher: Arc<dyn ReadDispatcher>) -> u64 {
    cursor.rewind();
    let attempt = ReplayAttempt::new(
        "bench",
        Arc::clone(cursor),
        dispatcher,
        ReplayConfig::default(),
    )
    .expect("config");
    let mut state = PendingAckState::default();
    let report = attempt.run(&mut state).expect("replay");
    assert_eq!(report.records_applied, RECORDS);
    report.records_applied
}

fn bench(c: &mut Criterion) {
    let single = log(false);
    let batched = log(true);
    let reader: Arc<dyn ReadDispatcher> = Arc::new(ReaderThread::start());
    let mut g = c.benchmark_group("pending_ack_replay_2000_records");
    g.bench_function("inline_reads_single (baseline)", |b| {
        b.iter(|| replay_once(&single, Arc::new(InlineReads)))
    });
    g.bench_function("reader_thread_single", |b| {
        b.iter(|| replay_once(&single, Arc::clone(&reader)))
    });
    g.bench_function("inline_reads_batched_x20", |b| {
        b.iter(|| replay_once(&batched, Arc::new(InlineReads)))
    });
    g.finish();
}

fn mean(f: impl Fn() -> u64) -> Duration {
    for _ in 0..3 {
        f();
    }
    let n = 20;
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed() / n
}

fn ratios() {
    let single = log(false);
    let batched = log(true);
    let reader: Arc<dyn ReadDispatcher> = Arc::new(ReaderThread::start());
    let base = mean(|| replay_once(&single, Arc::new(InlineReads)));
    let thr = mean(|| replay_once(&single, Arc::clone(&reader)));
    let bat = mean(|| replay_once(&batched, Arc::new(InlineReads)));
    println!("ratios vs inline_reads_single (same run, lower is faster):");
    println!("  inline_reads_single      {:>10.3?}  1.00", base);
    println!(
        "  reader_thread_single     {:>10.3?}  {:.2}",
        thr,
        thr.as_secs_f64() / base.as_secs_f64()
    );
    println!(
        "  inline_reads_batched_x20 {:>10.3?}  {:.2}",
        bat,
        bat.as_secs_f64() / base.as_secs_f64()
    );
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    ratios();
}
