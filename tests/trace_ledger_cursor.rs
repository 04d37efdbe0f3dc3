//! Trace recording for `specs/TraceLedgerCursor.tla`: the managed-ledger
//! cursor of `src/ledger` driven by the cases of the proptest model test
//! (`tests/ledger_cursor_model.rs`: appends across ledger rollovers, reads of
//! 1..=3 entries, reads with skip, forward, backward and beyond-the-end
//! mark-deletes, rewinds, resets, reopening the managed ledger), generated
//! from a fixed seed and each checked against the
//! reference model while it is recorded. The hook lines (src/trace.rs)
//! hold positions; this recorder flattens them to the spec's entry numbers
//! (entries in append order; `(L, -1)` is the entry before ledger L's
//! first) and writes every case, tagged `t`, to
//! `$PULSAR_TRACE_DIR/LedgerCursor.ndjson` (default `target/traces`).
//! `.ci/trace LedgerCursor` has TLC validate them against LedgerCursor.
#![cfg(all(feature = "trace", not(any(loom, feature = "shuttle"))))]

use std::io::Write;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use pulsar_core::trace;
use serde_json::Value;

#[path = "common/ledger_cursor_model.rs"]
mod ledger_cursor_model;
use ledger_cursor_model::*;

/// Recording is process-global: the tests of this file record one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Cases recorded (one trace each).
const RUNS: u32 = 60;
const OPS: usize = 60;
const SEED: [u8; 32] = *b"pulsar-core trace LedgerCursor 1";
/// The trace cfg's MaxEntries.
const MAX_ENTRIES: usize = 12;

#[test]
fn record_ledger_cursor_traces() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &SEED),
    );
    let strategy = ops(OPS);
    // Every case is recorded, also one the model check fails: TLC judges
    // its lines first (a trace the spec cannot follow is the finding the
    // trace layer exists for); the model failures fail the test after the
    // file is written.
    let mut traces: Vec<Vec<String>> = Vec::new();
    let mut disagreements: Vec<String> = Vec::new();
    for case in 0..RUNS {
        let ops = strategy.new_tree(&mut runner).unwrap().current();
        trace::start();
        let checked = run_case(&ops, MAX_ENTRIES);
        let lines = trace::finish();
        if let Err(e) = checked {
            disagreements.push(format!("case {case}: {e}; ops = {ops:?}"));
        }
        // A case of refused mark-deletes only records nothing.
        if !lines.is_empty() {
            traces.push(lines);
        }
    }
    let dir = std::env::var("PULSAR_TRACE_DIR").unwrap_or_else(|_| "target/traces".into());
    std::fs::create_dir_all(&dir).unwrap();
    let path = format!("{dir}/LedgerCursor.ndjson");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut steps = 0;
    for (k, lines) in traces.iter().enumerate() {
        // The cursor's `deletion` lines (`Persist`) are DeletionLookup's.
        let mut values: Vec<Value> = lines
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|v| trace::ledger_cursor::ACTIONS.contains(&v["action"].as_str().unwrap()))
            .collect();
        trace::ledger_cursor::to_entry_numbers(&mut values);
        for mut v in values {
            let action = v["action"].clone();
            let obj = v.as_object_mut().unwrap();
            for key in ["action", "ml", "cur"] {
                obj.remove(key);
            }
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
    assert!(
        disagreements.is_empty(),
        "the cursor disagreed with the reference model:\n{}",
        disagreements.join("\n")
    );
    eprintln!(
        "recorded {} traces ({RUNS} cases), {steps} steps: {path}",
        traces.len()
    );
}

/// A plain read that returns entries and then reaches a lost ledger (auto-skip
/// on) stops after the entries it returned: its lines end with that read's
/// position, with no skip past the lost ledger, which the next read takes.
#[test]
fn a_read_stopping_before_a_lost_ledger_records_no_skip_past_it() {
    use pulsar_core::ledger::{LedgerConfig, ManagedLedger, MemoryStore};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let config = LedgerConfig {
        max_entries_per_ledger: 3,
        auto_skip_non_recoverable_data: true,
    };
    let ml = ManagedLedger::open("lost", config, std::sync::Arc::new(MemoryStore::new())).unwrap();
    trace::start();
    let cursor = ml.open_cursor("sub").unwrap();
    let appended = ml.append_batch(&[&b"m"[..]; 6]).unwrap();
    ml.mark_ledger_lost(appended[3].ledger_id).unwrap();
    assert_eq!(cursor.read_entries(1).unwrap().len(), 1);
    assert_eq!(cursor.read_entries(10).unwrap().len(), 2);
    let after_first = cursor.read_position();
    assert!(cursor.read_entries(10).unwrap().is_empty());
    let after_skip = cursor.read_position();
    let mut lines: Vec<Value> = trace::finish()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    trace::ledger_cursor::to_entry_numbers(&mut lines);
    let steps: Vec<(String, i64)> = lines
        .iter()
        .filter(|v| {
            trace::ledger_cursor::ACTIONS.contains(&v["action"].as_str().unwrap())
                && v["action"] != "AppendEntry"
                && v["action"] != "Open"
        })
        .map(|v| {
            (
                v["action"].as_str().unwrap().to_string(),
                v["read"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(after_first, appended[3], "stopped at the lost ledger");
    assert!(after_skip > appended[5]);
    assert_eq!(
        steps,
        vec![
            ("Read".to_string(), 1),
            // the read that met the lost ledger is recorded as its runs
            ("ReadRun".to_string(), 3),
            ("SkipTo".to_string(), 6),
        ],
        "{lines:?}"
    );
}
