//! criterion: `add_message` and `get_scheduled_messages` throughput of the
//! bucket delayed delivery tracker at 1M messages with Pulsar's default
//! configuration, against a baseline measured in the same run: a plain
//! `BinaryHeap<(timestamp, ledger_id, entry_id)>` (the shape of Pulsar's
//! in-memory tracker). Snapshots go to the in-memory snapshot storage, so
//! the numbers are the tracker's CPU cost (no fsync).
//!
//! Run: `cargo bench --bench delayed_tracker` (short: 10 samples each). The
//! machine is shared; the ratio lines printed at the end are single-run
//! wall-clock ratios measured back to back.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput};
use pulsar_core::delayed::{
    BucketDelayedDeliveryTracker, BucketTrackerConfig, MemorySnapshotStorage, VirtualClock,
};

const N: u64 = 1_000_000;

fn message(i: u64) -> (i64, i64, i64) {
    let ledger = 1 + (i / 10_000) as i64;
    let entry = (i % 10_000) as i64;
    let at = 10_000 + ((i * 7919) % 3_600_000) as i64;
    (ledger, entry, at)
}

fn tracker() -> (BucketDelayedDeliveryTracker, Arc<VirtualClock>) {
    let clock = Arc::new(VirtualClock::new(0));
    let t = BucketDelayedDeliveryTracker::new(
        BucketTrackerConfig::default(),
        Arc::new(MemorySnapshotStorage::new()),
        clock.clone(),
    )
    .expect("empty storage");
    (t, clock)
}

fn fill(t: &BucketDelayedDeliveryTracker) {
    for i in 0..N {
        let (l, e, at) = message(i);
        t.add_message(l, e, at).expect("add");
    }
}

fn drain(t: &BucketDelayedDeliveryTracker, clock: &VirtualClock) -> usize {
    clock.set(10_000_000);
    let mut n = 0;
    loop {
        let batch = t.get_scheduled_messages(1000).expect("get");
        if batch.is_empty() {
            return n;
        }
        n += batch.len();
    }
}

fn heap_fill() -> BinaryHeap<Reverse<(i64, i64, i64)>> {
    let mut h = BinaryHeap::new();
    for i in 0..N {
        let (l, e, at) = message(i);
        h.push(Reverse((at, l, e)));
    }
    h
}

fn heap_drain(mut h: BinaryHeap<Reverse<(i64, i64, i64)>>) -> usize {
    let mut n = 0;
    while let Some(x) = h.pop() {
        black_box(x);
        n += 1;
    }
    n
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("add_message_1M");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    g.throughput(Throughput::Elements(N));
    g.bench_function("bucket_tracker", |b| {
        b.iter_batched(tracker, |(t, _c)| fill(&t), BatchSize::PerIteration)
    });
    g.bench_function("binary_heap_baseline", |b| b.iter(heap_fill));
    g.finish();

    let mut g = c.benchmark_group("get_scheduled_messages_1M");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    g.throughput(Throughput::Elements(N));
    g.bench_function("bucket_tracker", |b| {
        b.iter_batched(
            || {
                let (t, c) = tracker();
                fill(&t);
                (t, c)
            },
            |(t, c)| assert_eq!(drain(&t, &c), N as usize),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("binary_heap_baseline", |b| {
        b.iter_batched(heap_fill, heap_drain, BatchSize::PerIteration)
    });
    g.finish();
}

fn ratios() {
    let (t, c) = tracker();
    let s = Instant::now();
    fill(&t);
    let add = s.elapsed();
    let s = Instant::now();
    let n = drain(&t, &c);
    let get = s.elapsed();
    assert_eq!(n, N as usize);
    let s = Instant::now();
    let h = heap_fill();
    let hadd = s.elapsed();
    let s = Instant::now();
    heap_drain(h);
    let hget = s.elapsed();
    let per = |d: Duration| d.as_nanos() as f64 / N as f64;
    println!(
        "ratio add_message: tracker {:.0} ns/msg vs heap {:.0} ns/msg = {:.1}x",
        per(add),
        per(hadd),
        per(add) / per(hadd)
    );
    println!(
        "ratio get_scheduled_messages: tracker {:.0} ns/msg vs heap {:.0} ns/msg = {:.1}x",
        per(get),
        per(hget),
        per(get) / per(hget)
    );
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
    ratios();
}
