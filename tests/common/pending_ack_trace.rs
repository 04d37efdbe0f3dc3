//! Shared by the two recorders of `specs/TracePendingAckReplay.tla`:
//! `tests/trace_pending_ack.rs` (one thread: manual executor, inline reads,
//! virtual retry timer) and `tests/trace_pending_ack_threads.rs` (shuttle
//! schedules of the replay executor's thread, a reader thread and the test
//! thread firing the retry timer). It holds the trace cfg's constants, the
//! runs (how the log is stored, which reads fail and how), the log set-up and
//! the mapping of the hook lines (src/trace.rs) to the spec's terms: entry
//! numbers 1..=N in log order, N+1 past the end, 0 for an empty poll.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pulsar_core::ledger::{
    LedgerConfig, ManagedCursor, ManagedLedger, MemoryStore, ReadFailureKind,
};
use pulsar_core::pending_ack::{
    AckedPosition, HandleConfig, MemorySubscription, PendingAckHandle, PendingAckRecord,
    ReadDispatcher, ReplayConfig, ReplayExecutorPool, Timer, TxnId,
};
use pulsar_core::Position;
use serde_json::{json, Value};

/// The trace cfg's N, B and Cap.
pub const N: usize = 6;
pub const B: usize = 2;
pub const CAP: usize = 5;

/// The spec actions of src/trace.rs's `pending_ack` hooks.
pub use pulsar_core::trace::pending_ack::ACTIONS as SPEC_ACTIONS;

/// One run: how the log is stored and which reads fail.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    /// Entries per ledger (rollover inside the log when < N).
    pub per_ledger: usize,
    pub auto_skip: bool,
    /// The log's ledgers are lost (every read fails non-recoverably).
    pub lost: bool,
    /// Reads (1-based over the whole run) that fail, and how.
    pub fail: [Option<(usize, ReadFailureKind)>; 2],
    /// Entries read off the cached cursor before the handle starts.
    pub moved: usize,
}

/// A run of N entries in one ledger, failing as `fail` says.
pub const fn run(fail: [Option<(usize, ReadFailureKind)>; 2]) -> Run {
    Run {
        per_ledger: 100,
        auto_skip: false,
        lost: false,
        fail,
        moved: 0,
    }
}

pub fn runs() -> Vec<Run> {
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
pub struct Layout {
    pub log: Vec<Position>,
    pub start_rp: usize,
}

impl Layout {
    /// The layout of `log` with `cursor`'s read position as the start.
    pub fn new(log: Vec<Position>, cursor: &ManagedCursor) -> Self {
        let rp = cursor.read_position();
        let start_rp = 1 + log.iter().filter(|q| **q < rp).count();
        Layout { log, start_rp }
    }
}

/// Run `r`'s pending-ack log: N individual acks of open transactions (no
/// trim: the mark-delete stays before entry 1, as in the spec), stored
/// `r.per_ledger` to a ledger, lost if `r.lost`; its cursor moved `r.moved`
/// entries ahead; reads failing as `r.fail` says (counted from here).
/// Returns the managed ledger, the cursor the handle replays and the log's
/// positions.
pub fn set_up(r: Run, name: &str) -> (Arc<ManagedLedger>, Arc<ManagedCursor>, Vec<Position>) {
    let cfg = LedgerConfig {
        max_entries_per_ledger: r.per_ledger as u32,
        auto_skip_non_recoverable_data: r.auto_skip,
    };
    let ml = ManagedLedger::open(name, cfg, Arc::new(MemoryStore::new())).unwrap();
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
    // A plain std atomic: the fault policy runs inside a read, and under
    // shuttle a facade atomic here would add a scheduling point that the
    // replay's code does not have.
    let reads = Arc::new(AtomicUsize::new(0));
    let fail = r.fail;
    ml.faults().set_policy(move |_| {
        let n = reads.fetch_add(1, Ordering::SeqCst) + 1;
        fail.iter()
            .flatten()
            .find(|(at, _)| *at == n)
            .map(|(_, k)| *k)
    });
    (ml, cursor, log)
}

/// The run's hook lines in spec terms, after its `Init` line.
pub fn to_spec(r: Run, layout: &Layout, lines: Vec<String>) -> Vec<Value> {
    let mut out = vec![json!({
        "action": "Init", "lost": r.lost, "autoSkip": r.auto_skip, "rp": layout.start_rp
    })];
    for l in lines {
        let mut v: Value = serde_json::from_str(&l).unwrap();
        // The managed ledger's own cursor hooks (LedgerCursor) also record.
        if !SPEC_ACTIONS.contains(&v["action"].as_str().unwrap()) {
            continue;
        }
        pulsar_core::trace::pending_ack::to_entry_numbers(&mut v, &layout.log);
        out.push(v);
    }
    out
}

/// The handle a run replays with: the trace cfg's B and Cap, `reads` and
/// `timer` as given, on `pool`.
pub fn handle(
    name: &str,
    cursor: &Arc<ManagedCursor>,
    pool: &ReplayExecutorPool,
    reads: Arc<dyn ReadDispatcher>,
    timer: Arc<dyn Timer>,
) -> PendingAckHandle {
    let config = HandleConfig {
        replay: ReplayConfig {
            queue_capacity: CAP,
            read_batch: B,
        },
        ..HandleConfig::default()
    };
    PendingAckHandle::new(
        name,
        Arc::clone(cursor),
        Arc::new(MemorySubscription::default()),
        pool,
        reads,
        timer,
        config,
    )
    .unwrap()
}

/// Writes one run's `lines` (spec terms, `Init` first) to `out`, each tagged
/// with its run `t` (1-based); returns the lines written.
pub fn write_run(out: &mut impl std::io::Write, t: usize, lines: &[Value]) -> usize {
    for v in lines {
        let mut line = serde_json::Map::new();
        line.insert("t".into(), Value::from(t));
        line.extend(v.as_object().unwrap().clone());
        writeln!(out, "{}", Value::Object(line)).unwrap();
    }
    lines.len()
}

/// Writes `runs` to `path` ([`write_run`], `t` = 1, 2, ...); returns the
/// lines written.
pub fn write_runs(path: &str, runs: &[Vec<Value>]) -> usize {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let steps = runs
        .iter()
        .enumerate()
        .map(|(k, lines)| write_run(&mut out, k + 1, lines))
        .sum();
    out.flush().unwrap();
    steps
}
