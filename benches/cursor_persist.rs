//! Encode and decode of a cursor's deletion state: Pulsar's long[]
//! `PositionInfo` form (the baseline), Pulsar's MessageRange form and the
//! crate's compact chunked Roaring form, in the same run, at a 1 M-entry
//! backlog (ledgers of 50,000 entries) with random (each entry acked with
//! probability ½) and striped (every 10th entry unacked) patterns. The
//! size table at 10 k / 1 M / 30 M is printed by
//! `cargo run --release --example cursor_persist_sizes -- --full`.
//!
//! Run: `cargo bench --bench cursor_persist -- --warm-up-time 1 --measurement-time 2`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use pulsar_core::deletion::position_info::{
    decode_position_info, encode_position_info, PulsarForm,
};
use pulsar_core::deletion::{compact, DeletionSnapshot};
use pulsar_core::Position;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use roaring::RoaringBitmap;

const BACKLOG: u32 = 1_000_000;
const PER_LEDGER: u32 = 50_000;

fn build(random: bool) -> DeletionSnapshot {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut s = DeletionSnapshot::new(Position::new(1, -1));
    for l in 0..BACKLOG / PER_LEDGER {
        let mut bits = if random {
            let mut bytes = vec![0u8; PER_LEDGER as usize / 8];
            rng.fill_bytes(&mut bytes);
            RoaringBitmap::from_lsb0_bytes(0, &bytes)
        } else {
            let mut b = RoaringBitmap::new();
            b.insert_range(0..PER_LEDGER);
            for e in (0..PER_LEDGER).step_by(10) {
                b.remove(e);
            }
            b
        };
        bits.remove(0);
        s.ledgers.insert(i64::from(l) + 1, bits);
    }
    s
}

fn bench(c: &mut Criterion) {
    let long = PulsarForm::LongArray {
        max_entries: usize::MAX,
    };
    let ranges = PulsarForm::MessageRanges {
        max_ranges: usize::MAX,
    };
    for (pattern, random) in [("random", true), ("striped", false)] {
        let s = build(random);
        let mut g = c.benchmark_group(format!("cursor_persist_1m_{pattern}"));
        g.sample_size(10);
        for (name, form) in [("long_array", long), ("message_ranges", ranges)] {
            let bytes = encode_position_info(&s, form, &[]).unwrap();
            g.bench_function(BenchmarkId::new("encode", name), |b| {
                b.iter(|| black_box(encode_position_info(&s, form, &[]).unwrap()))
            });
            g.bench_function(BenchmarkId::new("decode", name), |b| {
                b.iter(|| black_box(decode_position_info(&bytes).unwrap()))
            });
        }
        let chunks = compact::encode(&s, compact::DEFAULT_CHUNK_BYTES);
        g.bench_function(BenchmarkId::new("encode", "compact"), |b| {
            b.iter(|| black_box(compact::encode(&s, compact::DEFAULT_CHUNK_BYTES)))
        });
        g.bench_function(BenchmarkId::new("decode", "compact"), |b| {
            b.iter(|| black_box(compact::decode(&chunks).unwrap()))
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
