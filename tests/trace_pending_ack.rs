//! Trace recording for `specs/TracePendingAckReplay.tla`: the pending-ack
//! handle of `src/pending_ack` replaying a log of N = 6 entries (open
//! transactions' acks: no trim, so the mark-delete stays before entry 1 as
//! in the spec) with the spec's B = 2 entries per read and a queue of
//! Cap = 5, on a manual replay executor, a virtual retry timer and inline
//! reads (every step on one thread, so the hook lines are in the order the
//! actions ran). The runs inject the failures the spec's environment may:
//! transient failures after read-ahead (one or two per run), the completing
//! shapes (fenced, cursor closed), a lost ledger with and without
//! auto-skip, and a cached cursor whose read position starts anywhere.
//!
//! The hook lines (src/trace.rs) hold positions; this recorder maps them to
//! the spec's entry numbers (1..=N in log order, N+1 past the end, 0 for an
//! empty poll), prepends an `Init` line per run pinning the environment's
//! initial choices (`lost`, `autoSkip`, the start read position), and
//! writes every run, tagged `t`, to `$PULSAR_TRACE_DIR/PendingAckReplay.ndjson`
//! (default `target/traces`). `.ci/trace PendingAckReplay` has TLC
//! validate them.
#![cfg(all(feature = "trace", not(any(loom, feature = "shuttle"))))]

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use pulsar_core::ledger::{LedgerConfig, ManagedLedger, MemoryStore, ReadFailureKind};
use pulsar_core::pending_ack::*;
use pulsar_core::{trace, Position};
use serde_json::{json, Value};

/// The trace cfg's N, B and Cap.
const N: usize = 6;
const B: usize = 2;
const CAP: usize = 5;

/// The hook lines of src/trace.rs's `pending_ack` module.
const SPEC_ACTIONS: [&str; 15] = [
    "HStart",
    "RLoop",
    "FqRoom",
    "FqCount",
    "FqFlag",
    "FqIssue",
    "FqRet",
    "Poll",
    "REnd",
    "EnvTake",
    "ReadOk",
    "ReadFail",
    "EnvFinish",
    "HDone",
    "HTimer",
];

/// One run: how the log is stored and which reads fail.
#[derive(Clone, Copy, Debug)]
struct Run {
    /// Entries per ledger (rollover inside the log when < N).
    per_ledger: usize,
    auto_skip: bool,
    /// The log's ledgers are lost (every read fails non-recoverably).
    lost: bool,
    /// Reads (1-based over the whole run) that fail, and how.
    fail: [Option<(usize, ReadFailureKind)>; 2],
    /// Entries read off the cached cursor before the handle starts.
    moved: usize,
}

const fn run(fail: [Option<(usize, ReadFailureKind)>; 2]) -> Run {
    Run {
        per_ledger: 100,
        auto_skip: false,
        lost: false,
        fail,
        moved: 0,
    }
}

fn runs() -> Vec<Run> {
    use ReadFailureKind::*;
    let mut v = vec![run([None, None])];
    for r in 1..=4 {
        v.push(run([Some((r, StorageUnavailable)), None]));
        v.push(run([Some((r, TooManyRequests)), None]));
        v.push(run([Some((r, Fenced)), None]));
        v.push(run([Some((r, CursorAlreadyClosed)), None]));
    }
    v.push(run([
        Some((2, StorageUnavailable)),
        Some((4, TooManyRequests)),
    ]));
    v.push(run([
        Some((1, TooManyRequests)),
        Some((2, StorageUnavailable)),
    ]));
    v.push(run([Some((3, StorageUnavailable)), Some((5, Fenced))]));
    // A lost ledger without auto-skip: every read fails non-recoverably.
    // (With auto-skip the managed ledger skips the lost ledger's entries
    // inside the read, as Pulsar's OpReadEntry does: the read succeeds
    // empty and the replay ends drained, explained by auto-skip. The spec
    // models auto-skip as a completing read failure instead, so that run
    // is not one it can follow; see the module docs of src/pending_ack.)
    v.push(Run {
        lost: true,
        ..run([None, None])
    });
    for moved in [2, 4, N] {
        v.push(Run {
            moved,
            ..run([Some((2, StorageUnavailable)), None])
        });
        v.push(Run {
            moved,
            ..run([None, None])
        });
    }
    v.push(Run {
        per_ledger: 4,
        ..run([Some((3, StorageUnavailable)), None])
    });
    v
}

/// What a recorded run maps its hook lines with: the log's positions in
/// order and the cursor's read position (entry number) at the start.
struct Layout {
    log: Vec<Position>,
    start_rp: usize,
}

/// Wall-clock bound of one run (a healthy one takes milliseconds): a replay
/// that never ends (a failed read that does not end the attempt re-issues it
/// forever) is cut off, and the first lines it recorded are still written
/// for TLC to judge before the test fails with a named livelock.
const WATCHDOG: Duration = Duration::from_secs(5);
/// Lines kept of a run cut off by the watchdog.
const CUT_OFF_LINES: usize = 2_000;

/// Records one run on a helper thread under [`WATCHDOG`]; returns its lines
/// (spec terms) and the handle's end state (`None`: cut off).
fn record(r: Run) -> (Vec<Value>, Option<HandleState>) {
    let (setup_tx, setup_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let state = drive(r, &setup_tx);
        let _ = done_tx.send((trace::finish(), state));
    });
    let layout: Layout = setup_rx.recv().expect("the run's setup failed");
    let (lines, state) = match done_rx.recv_timeout(WATCHDOG) {
        Ok((lines, state)) => (lines, Some(state)),
        Err(_) => {
            // A spinning replay records fast: keep a prefix TLC can load.
            let mut lines = trace::finish();
            lines.truncate(CUT_OFF_LINES);
            (lines, None)
        }
    };
    (to_spec(r, &layout, lines), state)
}

/// Sets the run up, reports its [`Layout`], records it; returns the end state.
fn drive(r: Run, setup: &mpsc::Sender<Layout>) -> HandleState {
    let cfg = LedgerConfig {
        max_entries_per_ledger: r.per_ledger as u32,
        auto_skip_non_recoverable_data: r.auto_skip,
    };
    let ml = ManagedLedger::open("trace-pending-ack", cfg, Arc::new(MemoryStore::new())).unwrap();
    let mut log = Vec::new();
    for i in 0..N as u64 {
        let t = TxnId::new(1, i);
        let p = Position::new(100, i as i64);
        let rec = PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p)]);
        log.push(ml.append(&rec.encode()).unwrap());
    }
    if r.lost {
        let ledgers: std::collections::BTreeSet<i64> = log.iter().map(|p| p.ledger_id).collect();
        for l in ledgers {
            ml.mark_ledger_lost(l).unwrap();
        }
    }
    let cursor = Arc::new(ml.open_cursor("__pending_ack_state").unwrap());
    let mut moved = 0;
    while moved < r.moved {
        moved += cursor.read_entries(N).unwrap().len();
    }
    let reads = Arc::new(AtomicUsize::new(0));
    {
        let reads = Arc::clone(&reads);
        let fail = r.fail;
        ml.faults().set_policy(move |_| {
            let n = reads.fetch_add(1, Ordering::SeqCst) + 1;
            fail.iter()
                .flatten()
                .find(|(at, _)| *at == n)
                .map(|(_, k)| *k)
        });
    }
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
    let timer = Arc::new(VirtualTimer::new());
    let config = HandleConfig {
        replay: ReplayConfig {
            queue_capacity: CAP,
            read_batch: B,
        },
        ..HandleConfig::default()
    };
    let h = PendingAckHandle::new(
        "trace",
        Arc::clone(&cursor),
        &pool,
        Arc::new(InlineReads),
        Arc::clone(&timer) as Arc<dyn Timer>,
        config,
    )
    .unwrap();
    let rp = cursor.read_position();
    let start_rp = 1 + log.iter().filter(|q| **q < rp).count();
    setup.send(Layout { log, start_rp }).unwrap();
    // The spec's initial state is already Initializing: record from here.
    h.init();
    trace::start();
    for _ in 0..100 {
        pool.run_pending();
        if matches!(h.state(), HandleState::Ready | HandleState::Error) || !timer.fire_next() {
            break;
        }
    }
    h.state()
}

/// The run's hook lines in spec terms, after its `Init` line.
fn to_spec(r: Run, layout: &Layout, lines: Vec<String>) -> Vec<Value> {
    let index = |p: &Value| -> usize {
        let p = Position::new(p[0].as_i64().unwrap(), p[1].as_i64().unwrap());
        1 + layout.log.iter().filter(|q| **q < p).count()
    };
    let mut out = vec![json!({
        "action": "Init", "lost": r.lost, "autoSkip": r.auto_skip, "rp": layout.start_rp
    })];
    for l in lines {
        let mut v: Value = serde_json::from_str(&l).unwrap();
        // The managed ledger's own cursor hooks (LedgerCursor) also record.
        if !SPEC_ACTIONS.contains(&v["action"].as_str().unwrap()) {
            continue;
        }
        for key in ["rp", "entry"] {
            match v.get(key).cloned() {
                Some(Value::Null) => v[key] = Value::from(0),
                Some(p) => v[key] = Value::from(index(&p)),
                None => {}
            }
        }
        if v["state"] == "Initializing" {
            v["state"] = Value::from("Init");
        }
        out.push(v);
    }
    out
}

#[test]
fn record_pending_ack_replay_traces() {
    let dir = std::env::var("PULSAR_TRACE_DIR").unwrap_or_else(|_| "target/traces".into());
    std::fs::create_dir_all(&dir).unwrap();
    let path = format!("{dir}/PendingAckReplay.ndjson");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let (mut steps, mut settled) = (0, 0);
    let all = runs();
    for (k, r) in all.iter().enumerate() {
        let (lines, state) = record(*r);
        for v in &lines {
            let mut line = serde_json::Map::new();
            line.insert("t".into(), Value::from(k + 1));
            line.extend(v.as_object().unwrap().clone());
            writeln!(out, "{}", Value::Object(line)).unwrap();
            steps += 1;
        }
        out.flush().unwrap();
        let Some(state) = state else {
            panic!(
                "replay livelock: run {} ({r:?}) did not settle within {WATCHDOG:?}; \
                 its {} lines so far are in {path}",
                k + 1,
                lines.len()
            );
        };
        assert!(lines.len() > 5, "run {r:?} recorded almost nothing");
        settled += usize::from(matches!(state, HandleState::Ready | HandleState::Error));
    }
    eprintln!(
        "recorded {} traces, {steps} steps ({settled} settled Ready/Error): {path}",
        all.len()
    );
}
