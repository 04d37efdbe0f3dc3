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
use std::sync::{mpsc, Arc};
use std::time::Duration;

use pulsar_core::pending_ack::*;
use pulsar_core::trace;
use serde_json::Value;

#[path = "common/pending_ack_trace.rs"]
mod pending_ack_trace;
use pending_ack_trace::*;

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
    let (_ml, cursor, log) = set_up(r, "trace-pending-ack");
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
    let timer = Arc::new(VirtualTimer::new());
    let h = handle(
        "trace",
        &cursor,
        &pool,
        Arc::new(InlineReads),
        Arc::clone(&timer) as Arc<dyn Timer>,
    );
    setup.send(Layout::new(log, &cursor)).unwrap();
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
        // Written run by run: a run cut off below still leaves its lines.
        steps += write_run(&mut out, k + 1, &lines);
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
