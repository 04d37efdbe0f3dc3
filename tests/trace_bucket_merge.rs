//! Trace recording for `specs/TraceBucketMerge.tla`: the bucket delayed
//! delivery tracker of `src/delayed` driven by proptest cases generated
//! from a fixed seed (add the next message, advance the virtual clock by
//! 1 ms, `get_scheduled_messages`, acknowledge the first unacknowledged
//! delivered message, `trim_and_merge`, crash + recovery + the dispatcher's
//! re-read from the mark-delete, make the next snapshot create or delete
//! fail), on one `FaultyStorage<MemorySnapshotStorage>` shared across the
//! restarts. Each case is also checked against a reference model while it
//! is recorded: nothing delivered twice in one tracker lifetime, nothing
//! delivered before its time or without being held, nothing due left
//! behind by a short `get` without an injected fault, the tracker's count
//! equal to the messages it holds, and `verify_invariants` after every
//! step. The hook lines (src/trace.rs, `bucket_merge`) carry the
//! tracker's state in the spec's terms; this recorder adds the environment's
//! lines: `Init` (the spec's constants: delivery times `ts`, `maxT`,
//! `maxIdx`) and `Tick` (the clock moved), and writes every case, tagged
//! `t`, to
//! `$PULSAR_TRACE_DIR/BucketMerge.ndjson` (default `target/traces`); a
//! model disagreement fails the test after the file is written, so TLC
//! judges the lines first.
//!
//! Mapping to the spec's abstractions: message `p` is entry 0 of ledger `p`
//! (one entry per ledger), delivered at `TS[p]` ms on a virtual clock that
//! starts at 0, with a strict cutoff (`deliver_at_time_strict`); segments are
//! cut by max indexes only (`k` = the run's
//! `max_indexes_per_bucket_snapshot_segment`); the mark-delete is recorded
//! as `(md, -1)` so the spec's `md` (positions `< md` acknowledged) is the
//! first live ledger. Merges are two-way (`trim_and_merge` is called only
//! while at most two buckets exist; automatic trim/merge is off:
//! `max_num_buckets = 0`). The re-read after a restart offers every
//! position from the mark-delete in order (the spec's `ReRead`), sealing
//! as the first lifetime does.
//! `.ci/trace BucketMerge` has TLC validate them.
#![cfg(all(feature = "trace", not(any(loom, feature = "shuttle"))))]

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use pulsar_core::delayed::Clock as _;
use pulsar_core::delayed::{
    BucketDelayedDeliveryTracker, BucketTrackerConfig, FaultPlan, FaultyStorage,
    MemorySnapshotStorage, VirtualClock,
};
use pulsar_core::{trace, Position};
use serde_json::{json, Value};

const RUNS: u64 = 120;
const OPS: usize = 60;
const SEED: [u8; 32] = *b"pulsar-core trace BucketMerge  1";
/// Delivery time (ms) of message `p` (ledger `p`, 1-based): the spec's TS.
const TS: [u64; 8] = [4, 2, 6, 3, 7, 5, 8, 6];
/// The clock's range: the spec's MaxT.
const MAX_T: u64 = 9;
/// Largest max-indexes-per-segment a run uses: the spec's MaxIdx.
const MAX_IDX: i64 = 2;
/// Restarts per run: at most the trace cfg's MaxCrashes.
const MAX_CRASHES: usize = 1;
/// Injected failures that make one snapshot create or delete fail after the
/// tracker's retries (1 + `STORAGE_RETRIES`).
const FAIL_ONE: u32 = 4;

/// One step of a case. A step whose precondition does not hold when it is
/// reached does nothing (the spec's action would not be enabled).
#[derive(Debug, Clone, Copy)]
enum Op {
    /// Add the next message (while fewer than `TS.len()` were added).
    Add,
    /// The clock moves 1 ms (up to `MAX_T`).
    Tick,
    /// `get_scheduled_messages(n)`, n in 1..=3.
    Get(usize),
    /// The mark-delete moves past the first message if it was delivered.
    Ack,
    /// `trim_and_merge` (only while at most two buckets exist: the spec
    /// merges two).
    TrimMerge,
    /// Restart (second half of the case, at most `MAX_CRASHES`): a new
    /// tracker on the same storage, then the dispatcher's re-read from the
    /// mark-delete.
    Restart,
    /// The next snapshot create (seal or merge) fails after the retries.
    FailCreate,
    /// The next snapshot delete fails after the retries.
    FailDelete,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => Just(Op::Add),
        2 => Just(Op::Tick),
        3 => (1usize..=3).prop_map(Op::Get),
        2 => Just(Op::Ack),
        3 => Just(Op::TrimMerge),
        1 => Just(Op::Restart),
        1 => prop_oneof![Just(Op::FailCreate), Just(Op::FailDelete)],
    ]
}

/// A case: the segment size `k` (1 most often; `MAX_IDX`) and its steps.
fn case() -> impl Strategy<Value = (i64, Vec<Op>)> {
    (
        prop_oneof![7 => Just(1i64), 3 => Just(MAX_IDX)],
        proptest::collection::vec(op(), OPS / 2..=OPS),
    )
}

fn config(k: i64, min_count: u64) -> BucketTrackerConfig {
    BucketTrackerConfig {
        tick_time_ms: 1,
        deliver_at_time_strict: true,
        min_index_count_per_bucket: min_count,
        max_time_step_per_bucket_snapshot_segment_ms: u64::MAX / 4,
        max_indexes_per_bucket_snapshot_segment: k,
        max_num_buckets: 0,
        ..BucketTrackerConfig::default()
    }
}

/// The reference model of one case: what the dispatcher has handed the
/// tracker and what it got back.
#[derive(Default)]
struct Model {
    /// Tracked (held for later delivery) in the current tracker lifetime.
    pending: BTreeSet<i64>,
    /// Delivered in the current lifetime (a restart starts a new one).
    lifetime: BTreeSet<i64>,
    /// Delivered in any lifetime (the acknowledgement rule).
    ever: BTreeSet<i64>,
}

impl Model {
    fn delivered(&mut self, p: i64) -> Result<(), String> {
        if !self.lifetime.insert(p) {
            return Err(format!("message {p} delivered twice in one lifetime"));
        }
        self.ever.insert(p);
        self.pending.remove(&p);
        Ok(())
    }

    /// The dispatcher offers message `p` (first read or re-read).
    fn offer(
        &mut self,
        tracker: &BucketDelayedDeliveryTracker,
        p: i64,
        now: u64,
    ) -> Result<(), String> {
        let at = TS[p as usize - 1];
        let tracked = tracker
            .add_message(p, 0, at as i64)
            .map_err(|e| format!("add_message({p}): {e}"))?;
        if tracked {
            if at <= now {
                return Err(format!("message {p} due at {at} held at {now}"));
            }
            self.pending.insert(p);
            Ok(())
        } else if at > now {
            Err(format!("message {p} due at {at} refused at {now}"))
        } else {
            self.delivered(p)
        }
    }
}

/// Runs one case, recording its lines; the first disagreement with the
/// model (if any) is returned with them, after the case ran to its end.
fn run(k: i64, ops: &[Op]) -> (Vec<Value>, Option<String>) {
    let min_count = 2;
    let clock = Arc::new(VirtualClock::new(0));
    let storage = Arc::new(FaultyStorage::new(MemorySnapshotStorage::new()));
    let mut tracker =
        BucketDelayedDeliveryTracker::new(config(k, min_count), storage.clone(), clock.clone())
            .unwrap();
    let mut lines: Vec<Value> =
        vec![json!({ "action": "Init", "ts": TS, "maxT": MAX_T, "maxIdx": MAX_IDX })];
    let flush = |lines: &mut Vec<Value>| {
        lines.extend(
            trace::finish()
                .iter()
                .map(|l| serde_json::from_str::<Value>(l).unwrap()),
        );
        trace::start();
    };
    trace::start();
    let mut m = Model::default();
    let mut next: i64 = 1;
    let mut md: i64 = 1;
    let mut crashes = 0;
    let mut first_error: Option<String> = None;
    for (i, op) in ops.iter().enumerate() {
        let now = clock.now_ms();
        let step: Result<(), String> = match *op {
            Op::Add if next <= TS.len() as i64 => {
                next += 1;
                m.offer(&tracker, next - 1, now)
            }
            Op::Tick if now < MAX_T => {
                clock.set(now + 1);
                flush(&mut lines);
                lines.push(json!({ "action": "Tick", "clock": now + 1 }));
                Ok(())
            }
            Op::Get(n) => {
                let injected = storage.injected();
                let got = tracker.get_scheduled_messages(n).unwrap();
                let mut r = Ok(());
                for p in &got {
                    assert_eq!(p.entry_id, 0);
                    let p = p.ledger_id;
                    if !m.pending.contains(&p) {
                        r = r.and(Err(format!("message {p} delivered but not held")));
                    } else if TS[p as usize - 1] > now {
                        r = r.and(Err(format!("message {p} delivered before its time")));
                    }
                    r = r.and(m.delivered(p));
                }
                if got.len() < n && storage.injected() == injected {
                    let due: Vec<i64> = m
                        .pending
                        .iter()
                        .copied()
                        .filter(|p| TS[*p as usize - 1] <= now)
                        .collect();
                    if !due.is_empty() {
                        r = r.and(Err(format!("due messages {due:?} not delivered")));
                    }
                }
                r
            }
            Op::Ack if md < next && m.ever.contains(&md) && !m.pending.contains(&md) => {
                md += 1;
                tracker.update_mark_delete(Position::new(md, -1));
                Ok(())
            }
            Op::TrimMerge if tracker.buckets().len() <= 2 => {
                tracker.trim_and_merge().unwrap();
                Ok(())
            }
            Op::Restart if crashes < MAX_CRASHES && i > ops.len() / 2 => {
                crashes += 1;
                drop(tracker);
                tracker = BucketDelayedDeliveryTracker::new(
                    config(k, min_count),
                    storage.clone(),
                    clock.clone(),
                )
                .unwrap();
                m.pending.clear();
                m.lifetime.clear();
                if md > 1 {
                    tracker.update_mark_delete(Position::new(md, -1));
                }
                let mut r = Ok(());
                for p in md..next {
                    r = r.and(m.offer(&tracker, p, now));
                }
                r
            }
            Op::FailCreate => {
                storage.arm(FaultPlan {
                    create: FAIL_ONE,
                    ..FaultPlan::default()
                });
                Ok(())
            }
            Op::FailDelete => {
                storage.arm(FaultPlan {
                    delete: FAIL_ONE,
                    ..FaultPlan::default()
                });
                Ok(())
            }
            _ => Ok(()),
        };
        let step = step
            .and_then(|()| {
                tracker
                    .verify_invariants()
                    .map_err(|e| format!("tracker invariants: {e:?}"))
            })
            .and_then(|()| {
                let count = tracker.number_of_delayed_messages();
                if count == m.pending.len() as u64 {
                    Ok(())
                } else {
                    Err(format!("count {count}, model holds {:?}", m.pending))
                }
            });
        if let (Err(e), None) = (step, &first_error) {
            first_error = Some(format!("step {i} ({op:?}): {e}"));
        }
    }
    flush(&mut lines);
    trace::finish();
    (lines, first_error)
}

#[test]
fn record_bucket_merge_traces() {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &SEED),
    );
    let strategy = case();
    let dir = std::env::var("PULSAR_TRACE_DIR").unwrap_or_else(|_| "target/traces".into());
    std::fs::create_dir_all(&dir).unwrap();
    let path = format!("{dir}/BucketMerge.ndjson");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut steps = 0;
    let mut merges = 0;
    let mut recovers = 0;
    // Cases with a merge after a delivery: the state where a merge could
    // persist a dispatched message (the merge-persists-dispatched control).
    let mut merges_after_delivery = 0;
    // Every case is recorded, also one that disagrees with the model: TLC
    // judges its lines first; the disagreements fail the test after the
    // file is written.
    let mut disagreements = Vec::new();
    for r in 0..RUNS {
        let (k, ops) = strategy.new_tree(&mut runner).unwrap().current();
        let (lines, error) = run(k, &ops);
        if let Some(e) = error {
            disagreements.push(format!("case {r} (k = {k}): {e}; ops = {ops:?}"));
        }
        let delivered_at = lines
            .iter()
            .position(|v| v["action"] == "Pop" && v["delivered"] == true);
        merges_after_delivery += usize::from(
            delivered_at.is_some_and(|d| lines[d..].iter().any(|v| v["action"] == "Merge")),
        );
        for v in lines {
            let mut line = serde_json::Map::new();
            line.insert("t".into(), Value::from(r + 1));
            let obj = v.as_object().unwrap();
            line.extend(obj.clone());
            merges += usize::from(v["action"] == "Merge");
            recovers += usize::from(v["action"] == "Recover");
            writeln!(out, "{}", Value::Object(line)).unwrap();
            steps += 1;
        }
    }
    out.flush().unwrap();
    assert!(steps > RUNS as usize * 10, "runs recorded almost nothing");
    assert!(
        merges > 0 && recovers > 0,
        "no merge ({merges}) or no recovery ({recovers}) recorded"
    );
    assert!(merges_after_delivery > 0, "no case merged after a delivery");
    assert!(
        disagreements.is_empty(),
        "the tracker disagreed with the reference model:\n{}",
        disagreements.join("\n")
    );
    eprintln!(
        "recorded {RUNS} traces, {steps} steps ({merges} merges, {recovers} recoveries, \
         {merges_after_delivery} cases merged after a delivery): {path}"
    );
}
