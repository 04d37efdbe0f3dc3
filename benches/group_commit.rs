//! N concurrent persisters of cursor deletion states on one durable redb
//! store (`SyncMode::Immediate`, on the working directory's disk), in the
//! same run: each persister a thread with its own cursor,
//!
//! * `blocking`: `ManagedCursor::persist_deletion_state` per call (one
//!   transaction and one fsync per persist, on the caller's thread; redb
//!   serialises them), the baseline;
//! * `group_commit`: `persist_deletion_state_async(..).wait()` (the
//!   persists that arrive while a commit is in flight share the next
//!   transaction and its one fsync).
//!
//! One iteration = every persister persists once (throughput: N
//! persists). The ratio `blocking / group_commit` of the same run is the
//! number kept (docs/measurements/durable-group-commit.toml).
//!
//! Run: `cargo bench --bench group_commit -- --warm-up-time 1 --measurement-time 5`.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pulsar_core::deletion::CursorDeletionState;
use pulsar_core::ledger::{LedgerConfig, LedgerStore, ManagedCursor, ManagedLedger, RedbStore};
use pulsar_core::Position;

struct Persister {
    cursor: ManagedCursor,
    state: CursorDeletionState,
}

fn setup(n: usize) -> (tempfile::TempDir, Vec<Arc<Persister>>) {
    // On the working directory's disk, never a tmpfs: the fsync is the cost.
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).expect("temp dir");
    let store = Arc::new(RedbStore::open(dir.path().join("bench.redb")).expect("store"));
    let ml = ManagedLedger::open("t", LedgerConfig::default(), store as Arc<dyn LedgerStore>)
        .expect("ledger");
    let payloads: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i; 64]).collect();
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    ml.append_batch(&refs).expect("append");
    let persisters = (0..n)
        .map(|i| {
            let cursor = ml.open_cursor(format!("sub-{i}")).expect("cursor");
            let state = CursorDeletionState::new(cursor.mark_delete_position()).expect("state");
            // A few individually deleted entries: a realistic small record.
            let deleted: Vec<Position> = (0..64).step_by(3).map(|e| Position::new(1, e)).collect();
            state.delete(&deleted, &*ml).expect("delete");
            Arc::new(Persister { cursor, state })
        })
        .collect();
    (dir, persisters)
}

/// Runs `iters` rounds on every persister's thread; the wall time from the
/// common start to the last thread's end.
fn run(persisters: &[Arc<Persister>], iters: u64, group: bool) -> Duration {
    let start = Arc::new(Barrier::new(persisters.len() + 1));
    let threads: Vec<_> = persisters
        .iter()
        .map(|p| {
            let (p, start) = (Arc::clone(p), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..iters {
                    if group {
                        p.cursor
                            .persist_deletion_state_async(&p.state, Vec::new())
                            .wait()
                            .expect("persist");
                    } else {
                        p.cursor
                            .persist_deletion_state(&p.state, &[])
                            .expect("persist");
                    }
                }
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    for t in threads {
        t.join().expect("persister thread");
    }
    t0.elapsed()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("durable_persist");
    g.sample_size(10);
    for n in [1usize, 16, 64] {
        let (_dir, persisters) = setup(n);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("blocking", n), &n, |b, _| {
            b.iter_custom(|iters| run(&persisters, iters, false));
        });
        g.bench_with_input(BenchmarkId::new("group_commit", n), &n, |b, _| {
            b.iter_custom(|iters| run(&persisters, iters, true));
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
