//! Trace recording for `specs/TraceLedgerCursor.tla`: the managed-ledger
//! cursor of `src/ledger` driven by fixed-seed random operation sequences
//! (append batches across ledger rollovers, reads of 1..=3 entries,
//! forward mark-deletes, rewinds). The hook lines (src/trace.rs) hold
//! positions; this recorder flattens them to the spec's entry numbers
//! (entries in append order; `(L, -1)` is the entry before ledger L's
//! first) and writes every run, tagged `t`, to
//! `$PULSAR_TRACE_DIR/LedgerCursor.ndjson` (default `target/traces`).
//! `.ci/check trace` has TLC validate them against LedgerCursor.
#![cfg(all(feature = "trace", not(any(loom, feature = "shuttle"))))]

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;

use pulsar_core::ledger::{LedgerConfig, ManagedLedger, MemoryStore};
use pulsar_core::{trace, Position};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

const RUNS: u64 = 30;
const OPS: usize = 40;
const SEED: u64 = 0x0014_1ed9_e4c0;
/// The trace cfg's MaxEntries.
const MAX_ENTRIES: usize = 12;

fn run(seed: u64) -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let config = LedgerConfig {
        max_entries_per_ledger: 3,
        auto_skip_non_recoverable_data: false,
    };
    let ml = ManagedLedger::open("trace", config, Arc::new(MemoryStore::new())).unwrap();
    trace::start();
    let cursor = ml.open_cursor("sub").unwrap();
    let mut appended: Vec<Position> = Vec::new();
    for _ in 0..OPS {
        match rng.random_range(0..4) {
            0 if appended.len() < MAX_ENTRIES => {
                let n = rng.random_range(1..=2).min(MAX_ENTRIES - appended.len());
                let payloads: Vec<&[u8]> = vec![b"m"; n];
                appended.extend(ml.append_batch(&payloads).unwrap());
            }
            1 => {
                let _ = cursor.read_entries(rng.random_range(1..=3)).unwrap();
            }
            2 => {
                let md = cursor.mark_delete_position();
                let candidates: Vec<Position> =
                    appended.iter().copied().filter(|p| *p >= md).collect();
                if !candidates.is_empty() {
                    let p = candidates[rng.random_range(0..candidates.len())];
                    cursor.mark_delete(p).unwrap();
                }
            }
            _ => cursor.rewind(),
        }
    }
    trace::finish()
}

/// Flattens `[ledger, entry]` to the spec's entry number.
fn flatten(lines: &[String]) -> Vec<Value> {
    let values: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut per_ledger: BTreeMap<i64, i64> = BTreeMap::new();
    for v in values.iter().filter(|v| v["action"] == "AppendEntry") {
        *per_ledger.entry(v["p"][0].as_i64().unwrap()).or_default() += 1;
    }
    let flat = |p: &Value| -> Value {
        let (l, e) = (p[0].as_i64().unwrap(), p[1].as_i64().unwrap());
        let offset: i64 = per_ledger.range(..l).map(|(_, n)| n).sum();
        Value::from(offset + e)
    };
    values
        .into_iter()
        .map(|mut v| {
            for key in ["p", "md", "read"] {
                if let Some(p) = v.get(key).cloned() {
                    v[key] = flat(&p);
                }
            }
            v
        })
        .collect()
}

#[test]
fn record_ledger_cursor_traces() {
    let dir = std::env::var("PULSAR_TRACE_DIR").unwrap_or_else(|_| "target/traces".into());
    std::fs::create_dir_all(&dir).unwrap();
    let path = format!("{dir}/LedgerCursor.ndjson");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut steps = 0;
    for k in 0..RUNS {
        let lines = run(SEED + k);
        for mut v in flatten(&lines) {
            let action = v["action"].clone();
            let obj = v.as_object_mut().unwrap();
            obj.remove("action");
            let mut line = serde_json::Map::new();
            line.insert("t".into(), Value::from(k + 1));
            line.insert("action".into(), action);
            line.extend(obj.clone());
            writeln!(out, "{}", Value::Object(line)).unwrap();
            steps += 1;
        }
    }
    out.flush().unwrap();
    assert!(steps > RUNS as usize * 10, "runs recorded almost nothing");
    eprintln!("recorded {RUNS} traces, {steps} steps: {path}");
}
