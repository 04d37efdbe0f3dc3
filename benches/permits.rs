//! Permit return path: the real lock-free `ConsumerPermitState` accumulator
//! (CAS add, threshold swap, Flow request, connection-task flush) against a
//! baseline that keeps the accumulator and the Flow queue under one `Mutex`,
//! measured in the same run; prints the time ratios.
//!
//! One batch = 1000 returns of 1 permit (receiver queue 1000, so two Flow
//! requests) + one connection-task flush. The 1-thread case runs inline;
//! the 2-thread case runs 2 x 1000 returns on two scoped threads (both
//! sides pay the same spawns).
//!
//! `cargo bench --bench permits` (std build only: under `--features
//! shuttle` it compiles but the model primitives would panic outside a
//! shuttle test).

use std::hint::black_box;
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use criterion::Criterion;
use pulsar_core::__model::sync::Arc;
use pulsar_core::permits::client::ClientConnection;
use pulsar_core::permits::ConsumerPermitState;

const RQ: u32 = 1000;
const RETURNS: u32 = 1000;

/// Baseline: accumulator and Flow queue behind one lock.
struct LockedAccumulator {
    inner: StdMutex<(u64, Vec<u32>)>,
}

impl LockedAccumulator {
    fn new() -> Self {
        Self {
            inner: StdMutex::new((0, Vec::new())),
        }
    }

    fn return_permits(&self, n: u32) {
        let mut g = self.inner.lock().unwrap();
        g.0 += u64::from(n);
        if g.0 >= u64::from(RQ / 2) {
            let drained = g.0 as u32;
            g.0 = 0;
            g.1.push(drained);
        }
    }

    fn flush(&self) -> usize {
        std::mem::take(&mut self.inner.lock().unwrap().1).len()
    }
}

struct Real {
    conn: Arc<ClientConnection>,
    state: Arc<ConsumerPermitState>,
}

impl Real {
    fn new() -> Self {
        let conn = Arc::new(ClientConnection::new(1));
        let state = conn.subscribe(1, RQ).unwrap();
        conn.subscribe_succeeded(&state).unwrap();
        conn.take_outbox();
        Self { conn, state }
    }

    fn returns(&self) {
        for _ in 0..RETURNS {
            black_box(self.state.return_permits(1).unwrap());
        }
    }

    fn batch(&self, threads: usize) {
        if threads == 1 {
            self.returns();
        } else {
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| self.returns());
                }
            });
        }
        black_box(self.conn.flush_flows());
        self.conn.take_outbox();
    }
}

fn locked_batch(acc: &LockedAccumulator, threads: usize) {
    let returns = || {
        for _ in 0..RETURNS {
            acc.return_permits(1);
        }
    };
    if threads == 1 {
        returns();
    } else {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(returns);
            }
        });
    }
    black_box(acc.flush());
}

fn bench(c: &mut Criterion) {
    let real = Real::new();
    let acc = LockedAccumulator::new();
    let mut g = c.benchmark_group("permit_returns_1000");
    for threads in [1usize, 2] {
        g.bench_function(format!("atomic_state_{threads}t"), |b| {
            b.iter(|| real.batch(threads))
        });
        g.bench_function(format!("mutex_baseline_{threads}t"), |b| {
            b.iter(|| locked_batch(&acc, threads))
        });
    }
    g.finish();
}

/// Same-run ratio: median over 15 alternating rounds of 200 batches each.
fn ratio(threads: usize) {
    let real = Real::new();
    let acc = LockedAccumulator::new();
    let mut r = Vec::new();
    for _ in 0..15 {
        let t = Instant::now();
        for _ in 0..200 {
            real.batch(threads);
        }
        let atomic = t.elapsed();
        let t = Instant::now();
        for _ in 0..200 {
            locked_batch(&acc, threads);
        }
        let base = t.elapsed();
        r.push(atomic.as_secs_f64() / base.as_secs_f64().max(1e-9));
    }
    r.sort_by(|a, b| a.total_cmp(b));
    println!(
        "permits: atomic ConsumerPermitState / mutex baseline time ratio, {threads} thread(s): {:.2} (median of 15)",
        r[r.len() / 2]
    );
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
        .configure_from_args();
    bench(&mut c);
    c.final_summary();
    ratio(1);
    ratio(2);
}
