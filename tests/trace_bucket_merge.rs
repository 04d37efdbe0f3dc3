//! Trace recording for `specs/TraceBucketMerge.tla`: the bucket delayed
//! delivery tracker of `src/delayed` driven by fixed-seed random operation
//! sequences (add the next message, advance the virtual clock by 1 ms,
//! `get_scheduled_messages`, acknowledge the first unacknowledged delivered
//! message, `trim_and_merge`, crash + recovery + the dispatcher's re-read
//! from the mark-delete, make the next snapshot create or delete fail), on
//! one `FaultyStorage<MemorySnapshotStorage>` shared across the restarts. The hook lines (src/trace.rs, `bucket_merge`) carry the
//! tracker's state in the spec's terms; this recorder adds the environment's
//! lines: `Init` (the spec's constants: delivery times `ts`, `maxT`,
//! `maxIdx`), `Tick` (the clock moved), `ReReadDone` (the re-read after a
//! restart ended), and writes every run, tagged `t`, to
//! `$PULSAR_TRACE_DIR/BucketMerge.ndjson` (default `target/traces`).
//!
//! Mapping to the spec's abstractions: message `p` is entry 0 of ledger `p`
//! (one entry per ledger), delivered at `TS[p]` ms on a virtual clock that
//! starts at 0, with a strict cutoff (`deliver_at_time_strict`); segments are
//! cut by max indexes only (`k` = the run's
//! `max_indexes_per_bucket_snapshot_segment`); the mark-delete is recorded
//! as `(md, -1)` so the spec's `md` (positions `< md` acknowledged) is the
//! first live ledger. Merges are two-way (`trim_and_merge` is called only
//! while at most two buckets exist; automatic trim/merge is off:
//! `max_num_buckets = 0`). A lifetime after a restart does not seal
//! (`min_index_count_per_bucket = u64::MAX`): the spec's `CrashRecover`
//! re-adds atomically, which a seal in the middle of the re-read would not
//! be.
//! `.ci/trace BucketMerge` has TLC validate them.
#![cfg(all(feature = "trace", not(any(loom, feature = "shuttle"))))]

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Arc;

use pulsar_core::delayed::{
    BucketDelayedDeliveryTracker, BucketTrackerConfig, FaultPlan, FaultyStorage,
    MemorySnapshotStorage, VirtualClock,
};
use pulsar_core::{trace, Position};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

const RUNS: u64 = 40;
const OPS: usize = 60;
const SEED: u64 = 0x000b_0c4e_7e55;
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

fn run(seed: u64) -> Vec<Value> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let k = if rng.random_bool(0.7) { 1 } else { MAX_IDX };
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
    let mut next: i64 = 1;
    let mut md: i64 = 1;
    let mut delivered: BTreeSet<i64> = BTreeSet::new();
    let mut crashes = 0;
    for op in 0..OPS {
        match rng.random_range(0..20) {
            0..=7 if next <= TS.len() as i64 => {
                let due = !tracker
                    .add_message(next, 0, TS[next as usize - 1] as i64)
                    .unwrap();
                if due {
                    delivered.insert(next);
                }
                next += 1;
            }
            8..=9 if clock.now_ms() < MAX_T => {
                clock.set(clock.now_ms() + 1);
                flush(&mut lines);
                lines.push(json!({ "action": "Tick", "clock": clock.now_ms() }));
            }
            10..=12 => {
                for p in tracker
                    .get_scheduled_messages(rng.random_range(1..=3))
                    .unwrap()
                {
                    assert_eq!(p.entry_id, 0);
                    delivered.insert(p.ledger_id);
                }
            }
            13..=14 if md < next && delivered.contains(&md) => {
                md += 1;
                tracker.update_mark_delete(Position::new(md, -1));
            }
            15..=17 if tracker.buckets().len() <= 2 => {
                tracker.trim_and_merge().unwrap();
            }
            18 if crashes < MAX_CRASHES && op > OPS / 2 => {
                crashes += 1;
                drop(tracker);
                tracker = BucketDelayedDeliveryTracker::new(
                    config(k, u64::MAX),
                    storage.clone(),
                    clock.clone(),
                )
                .unwrap();
                if md > 1 {
                    tracker.update_mark_delete(Position::new(md, -1));
                }
                for p in md..next {
                    if !tracker
                        .add_message(p, 0, TS[p as usize - 1] as i64)
                        .unwrap()
                    {
                        delivered.insert(p);
                    }
                }
                flush(&mut lines);
                lines.push(json!({ "action": "ReReadDone" }));
            }
            19 => {
                // The next snapshot create (seal or merge) or delete fails.
                let plan = if rng.random_bool(0.5) {
                    FaultPlan {
                        create: FAIL_ONE,
                        ..FaultPlan::default()
                    }
                } else {
                    FaultPlan {
                        delete: FAIL_ONE,
                        ..FaultPlan::default()
                    }
                };
                storage.arm(plan);
            }
            _ => {}
        }
    }
    flush(&mut lines);
    trace::finish();
    lines
}

use pulsar_core::delayed::Clock as _;

#[test]
fn record_bucket_merge_traces() {
    let dir = std::env::var("PULSAR_TRACE_DIR").unwrap_or_else(|_| "target/traces".into());
    std::fs::create_dir_all(&dir).unwrap();
    let path = format!("{dir}/BucketMerge.ndjson");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut steps = 0;
    let mut merges = 0;
    let mut recovers = 0;
    for r in 0..RUNS {
        for v in run(SEED + r) {
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
    eprintln!(
        "recorded {RUNS} traces, {steps} steps ({merges} merges, {recovers} recoveries): {path}"
    );
}
