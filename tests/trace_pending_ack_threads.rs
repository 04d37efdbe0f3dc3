//! Trace recording for `specs/TracePendingAckReplay.tla` from concurrent
//! executions: the pending-ack handle of `src/pending_ack` replaying the
//! same logs and failures as `tests/trace_pending_ack.rs` (N = 6 entries,
//! B = 2 per read, a queue of Cap = 5), but with the replay on the replay
//! executor's own thread ([`ExecutorMode::Threads`]), every read run and
//! completed (or failed) on a [`ReaderThread`], and the test thread firing
//! the virtual retry timer, under fixed-seed shuttle random and PCT
//! (depth 3) schedules. So `read_complete` / `read_failed` race
//! `fill_queue`'s two loads, the queue's polls and the end of the attempt
//! as they do in a broker, and TLC checks each recorded interleaving
//! against the spec (`NoReadAfterFailure`, `RewindBeforeRetry`,
//! `CompleteImpliesFullyApplied`, ...).
//!
//! Each hook sits right after the atomic load or store its spec action
//! stands for, with no scheduling point of shuttle's in between (the trace
//! log is a `std` mutex, not a facade one), so the order of the lines is the
//! order the actions ran in. One exception: `ReadFail` (W1) is recorded as
//! `read_failed` starts, before the failure is stored under its slot's lock;
//! the replay thread reads that slot only after its loop ended, and its loop
//! ends on this failure only after W2, which follows the store. The handle's `init()` runs after recording
//! starts (the executor thread may start the attempt at once): its `HTimer`
//! line (None → Initializing) precedes the spec's initial state, which is
//! already Initializing, and is dropped.
//!
//! Writes `$PULSAR_TRACE_DIR/PendingAckReplayThreads.ndjson` (default
//! `target/traces`); `.ci/trace PendingAckReplay` has TLC validate it after
//! the one-thread recorder's file. A run that does not settle within
//! [`MAX_SPINS`] turns of the test thread is a named livelock; the lines
//! recorded so far are still written for TLC to judge.
#![cfg(all(feature = "shuttle", feature = "trace"))]

use std::sync::Arc;
use std::sync::Mutex as StdMutex;

use pulsar_core::__model::sync::thread;
use pulsar_core::pending_ack::*;
use pulsar_core::trace;
use serde_json::Value;
use shuttle::scheduler::{PctScheduler, RandomScheduler};
use shuttle::{Config, Runner};

#[path = "common/pending_ack_trace.rs"]
mod pending_ack_trace;
use pending_ack_trace::*;

/// Random and PCT schedules per run of [`runs`].
const SCHEDULES: usize = 3;
const SEED: u64 = 0x0014_9ace_d001;
/// Turns of the test thread (fire the retry timer or yield) before a run
/// that has not settled Ready or Error is a livelock.
const MAX_SPINS: usize = 20_000;
/// Lines kept of a run cut off as a livelock.
const CUT_OFF_LINES: usize = 2_000;

/// Every recorded run in spec terms, and the first livelock's description.
static RECORDED: StdMutex<Vec<Vec<Value>>> = StdMutex::new(Vec::new());
static LIVELOCK: StdMutex<Option<String>> = StdMutex::new(None);

/// One execution of run `r`: replay thread, reader thread, timer thread.
fn scenario(r: Run) {
    let (_ml, cursor, log) = set_up(r, "trace-pending-ack-threads");
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Threads).unwrap();
    let reader = Arc::new(ReaderThread::start());
    let timer = Arc::new(VirtualTimer::new());
    let h = handle(
        "trace-threads",
        &cursor,
        &pool,
        reader.clone(),
        Arc::clone(&timer) as Arc<dyn Timer>,
    );
    let layout = Layout::new(log, &cursor);
    trace::start();
    h.init();
    let mut spins = 0;
    let settled = loop {
        if matches!(h.state(), HandleState::Ready | HandleState::Error) {
            break true;
        }
        if spins == MAX_SPINS {
            break false;
        }
        if !timer.fire_next() {
            thread::yield_now();
        }
        spins += 1;
    };
    let mut lines = trace::finish();
    if !settled {
        lines.truncate(CUT_OFF_LINES);
    }
    // init()'s HTimer (None -> Initializing) comes before the spec's Init.
    let is_spec_line = |l: &String| SPEC_ACTIONS.iter().any(|a| l.contains(&format!("\"{a}\"")));
    if let Some(at) = lines.iter().position(is_spec_line) {
        if lines[at].contains("\"HTimer\"") {
            lines.remove(at);
        }
    }
    let spec_lines = to_spec(r, &layout, lines);
    let recorded = spec_lines.len();
    RECORDED.lock().unwrap().push(spec_lines);
    h.close();
    pool.shutdown();
    reader.shutdown();
    if !settled {
        let what = format!(
            "replay livelock: {r:?} did not settle Ready or Error within {MAX_SPINS} turns \
             of the test thread ({recorded} lines recorded)"
        );
        LIVELOCK.lock().unwrap().get_or_insert(what.clone());
        panic!("{what}");
    }
    assert!(recorded > 5, "run {r:?} recorded almost nothing");
}

#[test]
fn record_pending_ack_replay_thread_traces() {
    RECORDED.lock().unwrap().clear();
    let all = runs();
    let outcome = std::panic::catch_unwind(|| {
        for (k, r) in all.iter().copied().enumerate() {
            let seed = SEED + k as u64;
            Runner::new(
                RandomScheduler::new_from_seed(seed, SCHEDULES),
                Config::new(),
            )
            .run(move || scenario(r));
            Runner::new(
                PctScheduler::new_from_seed(seed, 3, SCHEDULES),
                Config::new(),
            )
            .run(move || scenario(r));
        }
    });
    let recorded = std::mem::take(&mut *RECORDED.lock().unwrap());
    let dir = std::env::var("PULSAR_TRACE_DIR").unwrap_or_else(|_| "target/traces".into());
    std::fs::create_dir_all(&dir).unwrap();
    let path = format!("{dir}/PendingAckReplayThreads.ndjson");
    let steps = write_runs(&path, &recorded);
    if let Some(what) = LIVELOCK.lock().unwrap().take() {
        panic!("{what}; the lines so far are in {path}");
    }
    if let Err(e) = outcome {
        std::panic::resume_unwind(e);
    }
    assert_eq!(recorded.len(), all.len() * 2 * SCHEDULES);
    eprintln!("recorded {} traces, {steps} steps: {path}", recorded.len());
}
