//! Trace recording for `specs/TraceDeletionLookup.tla`: the lock-free
//! read-scheduling hint of `src/deletion` under fixed-seed shuttle random
//! schedules — two grouped-ack threads, a reset thread (one backward reset,
//! mark-delete back to (1,-1)) and ONE lookup thread (the spec has one
//! reader). Every run's hook lines (src/trace.rs) go to one ndjson file,
//! each line tagged with its run `t`; `.ci/check trace` has TLC validate
//! every run against the spec, so `NoStalePositive` and the epoch re-check
//! (`RRecheck`) are checked on the implementation's own executions.
//!
//! A second scenario runs under fixed-seed PCT (depth 3) schedules: the
//! grouped acks move the mark-delete across the ledger boundary (to the end
//! of ledger 1, then 2:0, 2:1) while the
//! lookup thread queries the entries of ledger 2 above it, so a lookup that
//! combines halves of two published mark-deletes (2:3 from 1:3 → 2:0) is
//! recorded as an `RMarkDelete` the spec cannot follow.
//!
//! The file is `$PULSAR_TRACE_DIR/DeletionLookup.ndjson` (default
//! `target/traces`).
#![cfg(all(feature = "shuttle", feature = "trace"))]

use std::io::Write;
use std::sync::Mutex as StdMutex;

use pulsar_core::__model::sync::{thread, Arc};
use pulsar_core::deletion::{CursorDeletionState, LedgerLayout};
use pulsar_core::{trace, Position};
use shuttle::scheduler::{PctScheduler, RandomScheduler};
use shuttle::{Config, Runner};

/// Runs recorded (one trace each); the spec layer validates all of them.
const RUNS: usize = 400;
const SEED: u64 = 0x0014_7ace_d001;
/// PCT runs of the ledger-boundary scenario.
const BOUNDARY_RUNS: usize = 60;
const BOUNDARY_SEED: u64 = 0x0014_b0d4_d001;

/// Ledgers 1 and 2 with entries 0..=3 (the trace cfg's NumLedgers = 2, MaxEntry = 3).
const ENTRIES: u32 = 4;

static TRACES: StdMutex<Vec<Vec<String>>> = StdMutex::new(Vec::new());

mod common;
use common::p;

fn scenario() {
    trace::start();
    let ledger = LedgerLayout::new([(1, ENTRIES), (2, ENTRIES)]);
    let state = Arc::new(CursorDeletionState::new(p(1, -1)).unwrap());
    let groups: [Vec<Vec<Position>>; 2] = [
        vec![
            vec![p(1, 1), p(1, 0)],
            vec![p(2, 0)],
            vec![p(1, 3)],
            vec![p(2, 2)],
        ],
        vec![
            vec![p(1, 2)],
            vec![p(2, 2), p(2, 1)],
            vec![p(2, 3)],
            vec![p(1, 0)],
        ],
    ];
    let mut handles = Vec::new();
    for mine in groups {
        let (state, ledger) = (Arc::clone(&state), ledger.clone());
        handles.push(thread::spawn(move || {
            for group in &mine {
                state.delete(group, &ledger).unwrap();
            }
        }));
    }
    {
        let (state, ledger) = (Arc::clone(&state), ledger.clone());
        handles.push(thread::spawn(move || {
            thread::yield_now();
            state.reset(p(1, 0), &ledger).unwrap();
        }));
    }
    {
        let state = Arc::clone(&state);
        handles.push(thread::spawn(move || {
            for q in [
                p(1, 0),
                p(1, 2),
                p(2, 1),
                p(1, 1),
                p(2, 0),
                p(1, 3),
                p(2, 2),
                p(1, 0),
            ] {
                state.is_deleted_for_read_scheduling(q.ledger_id, q.entry_id);
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    let lines = trace::finish();
    TRACES.lock().unwrap().push(lines);
}

/// Mark-delete published across the ledger boundary (whole ledger 1, then
/// into ledger 2) while one lookup thread queries ledger 2's entries above
/// it: every answer must come from one published mark-delete.
fn mark_delete_across_ledger_boundary() {
    trace::start();
    let ledger = LedgerLayout::new([(1, ENTRIES), (2, ENTRIES)]);
    let state = Arc::new(CursorDeletionState::new(p(1, -1)).unwrap());
    let writer = {
        let (state, ledger) = (Arc::clone(&state), ledger.clone());
        thread::spawn(move || {
            // Each group fills the acknowledged prefix: the mark-delete
            // advances to its last entry (the spec's `Advance`).
            for group in [
                vec![p(1, 0), p(1, 1), p(1, 2), p(1, 3)],
                vec![p(2, 0)],
                vec![p(2, 1)],
            ] {
                state.delete(&group, &ledger).unwrap();
            }
        })
    };
    let reader = {
        let state = Arc::clone(&state);
        thread::spawn(move || {
            for q in [p(2, 3), p(2, 2), p(2, 3), p(2, 2), p(2, 3), p(1, 3)] {
                state.is_deleted_for_read_scheduling(q.ledger_id, q.entry_id);
            }
        })
    };
    writer.join().unwrap();
    reader.join().unwrap();
    let lines = trace::finish();
    TRACES.lock().unwrap().push(lines);
}

#[test]
fn record_deletion_lookup_traces() {
    TRACES.lock().unwrap().clear();
    let runner = Runner::new(RandomScheduler::new_from_seed(SEED, RUNS), Config::new());
    runner.run(scenario);
    let runner = Runner::new(
        PctScheduler::new_from_seed(BOUNDARY_SEED, 3, BOUNDARY_RUNS),
        Config::new(),
    );
    runner.run(mark_delete_across_ledger_boundary);
    let traces = std::mem::take(&mut *TRACES.lock().unwrap());
    assert_eq!(traces.len(), RUNS + BOUNDARY_RUNS);
    let dir = std::env::var("PULSAR_TRACE_DIR").unwrap_or_else(|_| "target/traces".into());
    std::fs::create_dir_all(&dir).unwrap();
    let path = format!("{dir}/DeletionLookup.ndjson");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut steps = 0;
    for (k, lines) in traces.iter().enumerate() {
        assert!(
            lines.iter().any(|l| l.contains("\"RFinish\"")),
            "run {k} recorded no lookup"
        );
        for line in lines {
            // `{"action":..}` → `{"t":k,"action":..}`
            writeln!(out, "{{\"t\":{},{}", k + 1, &line[1..]).unwrap();
            steps += 1;
        }
    }
    out.flush().unwrap();
    eprintln!("recorded {} traces, {steps} steps: {path}", traces.len());
}
