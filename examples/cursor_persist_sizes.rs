//! Size and encode/decode time of a cursor's persisted deletion state in
//! Pulsar's two `PositionInfo` forms (MessageRange list, long[] per ledger)
//! and the crate's compact form (portable Roaring per ledger, chunked), for
//! backlogs of 10 k, 1 M and 30 M entries with random and striped ack
//! patterns. Prints the Markdown table whose numbers are
//! docs/measurements/cursor-persist-sizes.toml.
//!
//! ```text
//! cargo run --release --example cursor_persist_sizes -- --full
//! ```
//!
//! Without `--full` (as `.ci/check examples` runs it, in a debug build)
//! only the 10 k-entry rows are measured, one run each.
//!
//! Patterns (ledgers of 50,000 entries, Pulsar's default
//! `managedLedgerMaxEntriesPerLedger`; mark-delete before the first entry,
//! which stays unacknowledged):
//! - random: each entry acknowledged with probability 1/2 (seeded);
//! - striped: every 10th entry unacknowledged (a slow consumer of a
//!   round-robin group).
//!
//! Times are the best of several runs (fewer for 30 M), encode = snapshot →
//! bytes, decode = bytes → snapshot (checked equal to the original).

use std::hint::black_box;
use std::time::{Duration, Instant};

use pulsar_core::deletion::position_info::{
    decode_position_info, encode_position_info, PositionInfoError, PulsarForm,
    PULSAR_MAX_UNACKED_RANGES_TO_PERSIST,
};
use pulsar_core::deletion::{compact, DeletionSnapshot};
use pulsar_core::Position;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use roaring::RoaringBitmap;

const PER_LEDGER: u64 = 50_000;

fn build(backlog: u64, random: bool) -> DeletionSnapshot {
    let mut rng = ChaCha8Rng::seed_from_u64(backlog);
    let mut s = DeletionSnapshot::new(Position::new(1, -1));
    let ledgers = backlog.div_ceil(PER_LEDGER);
    for l in 0..ledgers {
        let n = (backlog - l * PER_LEDGER).min(PER_LEDGER) as u32;
        let mut bits = if random {
            let mut bytes = vec![0u8; n.div_ceil(8) as usize];
            rng.fill_bytes(&mut bytes);
            let mut b = RoaringBitmap::from_lsb0_bytes(0, &bytes);
            b.remove_range(n..);
            b
        } else {
            let mut b = RoaringBitmap::new();
            b.insert_range(0..n);
            for e in (0..n).step_by(10) {
                b.remove(e);
            }
            b
        };
        if l == 0 {
            bits.remove(0);
        }
        s.ledgers.insert(l as i64 + 1, bits);
    }
    s
}

fn best<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut out = None;
    for _ in 0..runs {
        let t = Instant::now();
        let v = black_box(f());
        best = best.min(t.elapsed());
        out = Some(v);
    }
    (best, out.expect("runs >= 1"))
}

fn fmt_bytes(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{:.2} MiB", b as f64 / (1 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

fn fmt_time(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.2} s", d.as_secs_f64())
    } else if d >= Duration::from_millis(1) {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.0} µs", d.as_secs_f64() * 1e6)
    }
}

fn main() {
    println!(
        "| backlog | pattern | ranges | form | bytes | largest store entry | vs long[] | encode | decode | Pulsar default cap (10,000) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let full = std::env::args().any(|a| a == "--full");
    let backlogs: &[u64] = if full {
        &[10_000, 1_000_000, 30_000_000]
    } else {
        &[10_000]
    };
    for &backlog in backlogs {
        let runs = match (full, backlog >= 10_000_000) {
            (false, _) => 1,
            (true, true) => 2,
            (true, false) => 5,
        };
        for random in [true, false] {
            let s = build(backlog, random);
            let ranges = s.range_count();
            let pattern = if random { "random ½" } else { "striped 1/10" };
            let mut long_bytes = 0usize;
            for (name, form) in [
                (
                    "long[] (LongListMap)",
                    PulsarForm::LongArray {
                        max_entries: usize::MAX,
                    },
                ),
                (
                    "MessageRange list",
                    PulsarForm::MessageRanges {
                        max_ranges: usize::MAX,
                    },
                ),
            ] {
                let (enc, bytes) = best(runs, || {
                    encode_position_info(&s, form, &[]).expect("uncapped")
                });
                let (dec, back) = best(runs, || decode_position_info(&bytes).expect("decodes"));
                assert_eq!(back.snapshot, s, "{name} round trip");
                let capped = match form {
                    PulsarForm::LongArray { .. } => PulsarForm::PULSAR_DEFAULT_LONG_ARRAY,
                    PulsarForm::MessageRanges { .. } => PulsarForm::PULSAR_DEFAULT_RANGES,
                };
                let cap = match encode_position_info(&s, capped, &[]) {
                    Ok(_) => "fits".to_string(),
                    Err(PositionInfoError::CapExceeded { needed, unit, .. }) => format!(
                        "exceeded ({needed} {unit} > {PULSAR_MAX_UNACKED_RANGES_TO_PERSIST}): reported"
                    ),
                    Err(e) => panic!("{e}"),
                };
                if long_bytes == 0 {
                    long_bytes = bytes.len();
                }
                println!(
                    "| {backlog} | {pattern} | {ranges} | {name} | {} | {} (one entry) | {:.2}× | {} | {} | {cap} |",
                    fmt_bytes(bytes.len()),
                    fmt_bytes(bytes.len()),
                    bytes.len() as f64 / long_bytes as f64,
                    fmt_time(enc),
                    fmt_time(dec),
                );
            }
            let (enc, chunks) = best(runs, || compact::encode(&s, compact::DEFAULT_CHUNK_BYTES));
            let (dec, back) = best(runs, || compact::decode(&chunks).expect("decodes"));
            assert_eq!(back, s, "compact round trip");
            let total: usize = chunks.iter().map(Vec::len).sum();
            let largest = chunks.iter().map(Vec::len).max().unwrap_or(0);
            println!(
                "| {backlog} | {pattern} | {ranges} | compact (roaring, {} chunk(s)) | {} | {} | {:.2}× | {} | {} | no cap (exact) |",
                chunks.len(),
                fmt_bytes(total),
                fmt_bytes(largest),
                total as f64 / long_bytes as f64,
                fmt_time(enc),
                fmt_time(dec),
            );
        }
    }
}
