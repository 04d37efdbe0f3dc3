//! `pulsar-core verify DIR`: check the invariants of a kept store (opened
//! read-only) and exit 1 with the list of violations.
//!
//! | check | what must hold |
//! |---|---|
//! | cursor | mark-delete and every individually deleted range lie within the managed ledger's ledgers; ranges ascending, disjoint, above mark-delete |
//! | bucket | key parses; snapshot present; entry 0 decodes; one segment per metadata entry; each segment's indexes equal its metadata bitmaps; min/max timestamps are the segment's first/last; indexes ascending; ledgers within the bucket's range; no position in two buckets of one cursor; delayed count = Σ bitmap cardinalities = Σ segment indexes |
//! | snapshot table | no snapshot that no cursor property names (snapshot and key commit together) |
//! | pending-ack log | every entry after the log cursor's mark-delete decodes; replay leaves no pending ack on a position the subscription already acknowledged, and none outside the topic's ledgers |

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::json;

use pulsar_core::delayed::snapshot::{decode_metadata, decode_segment, decode_segment_bitmaps};
use pulsar_core::ledger::{StoredCursor, StoredLedger};
use pulsar_core::Position;

use crate::inspect::{load_store, LoadedStore};

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The data dir (holding pulsar-core.redb, or serve.redb of `serve`) or the store file.
    dir: PathBuf,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Whether `p` names a position of `ledgers` (or the position before one
/// of its ledgers' first entry, or [`Position::EARLIEST`]).
fn within(ledgers: &StoredLedger, p: Position) -> bool {
    if p == Position::EARLIEST {
        return true;
    }
    match ledgers.ledgers.get(&p.ledger_id) {
        Some(info) => p.entry_id >= -1 && p.entry_id < info.entries,
        None => false,
    }
}

fn check_cursor(
    name: &str,
    cursor: &str,
    c: &StoredCursor,
    ledgers: Option<&StoredLedger>,
    out: &mut Vec<String>,
) {
    let who = format!("cursor {name} / {cursor}");
    let Some(ledgers) = ledgers else {
        out.push(format!("{who}: its managed ledger has no ledger list"));
        return;
    };
    if !within(ledgers, c.mark_delete) {
        out.push(format!(
            "{who}: mark-delete {} is outside the ledgers {:?}",
            c.mark_delete,
            ledgers.ledgers.keys().collect::<Vec<_>>()
        ));
    }
    let mut prev = c.mark_delete;
    for (lo, hi) in &c.individually_deleted {
        if lo >= hi {
            out.push(format!(
                "{who}: individually deleted range ({lo}, {hi}] is empty or reversed"
            ));
        }
        if *lo < prev {
            out.push(format!("{who}: individually deleted range ({lo}, {hi}] starts below mark-delete or overlaps the previous range (ends {prev})"));
        }
        if !within(ledgers, *hi) {
            out.push(format!(
                "{who}: individually deleted range ({lo}, {hi}] ends outside the ledgers"
            ));
        }
        prev = *hi;
    }
}

/// Runs every check; returns (checks run, violations).
pub fn verify(st: &LoadedStore) -> (u64, Vec<String>) {
    let mut checks = 0u64;
    let mut v = Vec::new();
    let c = &st.contents;
    for ((ml, cursor), cur) in &c.cursors {
        checks += 1;
        check_cursor(ml, cursor, cur, c.ledgers.get(ml), &mut v);
    }
    for (name, l) in &c.ledgers {
        checks += 1;
        let declared: i64 = l
            .ledgers
            .values()
            .filter(|i| !i.lost)
            .map(|i| i.entries)
            .sum();
        let stored = c.entry_stats.get(name).map_or(0, |s| s.0);
        if stored as i64 > declared {
            v.push(format!("managed ledger {name}: {stored} entries stored but its live ledgers declare {declared}"));
        }
    }
    // buckets
    let mut per_cursor: BTreeMap<(String, String), BTreeMap<(i64, u32), String>> = BTreeMap::new();
    for b in &st.buckets {
        checks += 1;
        let who = format!(
            "bucket {} (snapshot {}) of {} / {}",
            b.key, b.snapshot_id, b.managed_ledger, b.cursor
        );
        let Some((start, end)) = b.range else {
            v.push(format!("{who}: malformed bucket key"));
            continue;
        };
        let entries: BTreeMap<u64, &Vec<u8>> = b.entries.iter().map(|(e, d)| (*e, d)).collect();
        let Some(meta_bytes) = entries.get(&0) else {
            v.push(format!("{who}: snapshot missing (no entry 0)"));
            continue;
        };
        let meta = match decode_metadata(b.snapshot_id, meta_bytes) {
            Ok(m) => m,
            Err(e) => {
                v.push(format!("{who}: {e}"));
                continue;
            }
        };
        let n = meta.metadata_list.len() as u64;
        let segment_ids: Vec<u64> = entries.keys().filter(|e| **e > 0).copied().collect();
        if segment_ids != (1..=n).collect::<Vec<_>>() {
            v.push(format!(
                "{who}: metadata lists {n} segments but entries {segment_ids:?} are stored"
            ));
        }
        let mut bitmap_total = 0u64;
        let mut index_total = 0u64;
        for (i, sm) in meta.metadata_list.iter().enumerate() {
            let seg_no = i as u64 + 1;
            let bitmaps = match decode_segment_bitmaps(b.snapshot_id, sm) {
                Ok(bm) => bm,
                Err(e) => {
                    v.push(format!("{who}: segment {seg_no}: {e}"));
                    continue;
                }
            };
            bitmap_total += bitmaps.values().map(|bm| bm.len()).sum::<u64>();
            for l in bitmaps.keys() {
                if *l < start || *l > end {
                    v.push(format!("{who}: segment {seg_no} has ledger {l} outside the bucket range [{start}, {end}]"));
                }
            }
            let Some(bytes) = entries.get(&seg_no) else {
                continue;
            };
            let seg = match decode_segment(b.snapshot_id, seg_no, bytes) {
                Ok(s) => s,
                Err(e) => {
                    v.push(format!("{who}: {e}"));
                    continue;
                }
            };
            index_total += seg.indexes.len() as u64;
            let mut from_indexes: BTreeMap<i64, BTreeSet<u32>> = BTreeMap::new();
            let mut sorted = true;
            for w in seg.indexes.windows(2) {
                if (w[0].timestamp, w[0].ledger_id, w[0].entry_id)
                    > (w[1].timestamp, w[1].ledger_id, w[1].entry_id)
                {
                    sorted = false;
                }
            }
            if !sorted {
                v.push(format!(
                    "{who}: segment {seg_no} indexes are not in (timestamp, ledger, entry) order"
                ));
            }
            for ix in &seg.indexes {
                from_indexes
                    .entry(ix.ledger_id as i64)
                    .or_default()
                    .insert(ix.entry_id as u32);
                let key = (ix.ledger_id as i64, ix.entry_id as u32);
                let slot = per_cursor
                    .entry((b.managed_ledger.clone(), b.cursor.clone()))
                    .or_default();
                if let Some(other) = slot.insert(key, b.key.clone()) {
                    if other != b.key {
                        v.push(format!("{who}: position {}:{} is also in bucket {other} (would be delivered twice)", key.0, key.1));
                    }
                }
            }
            let from_bitmaps: BTreeMap<i64, BTreeSet<u32>> = bitmaps
                .iter()
                .map(|(l, bm)| (*l, bm.iter().collect()))
                .collect();
            if from_indexes != from_bitmaps {
                v.push(format!(
                    "{who}: segment {seg_no} indexes differ from its metadata bitmaps"
                ));
            }
            if let (Some(first), Some(last)) = (seg.indexes.first(), seg.indexes.last()) {
                if first.timestamp != sm.min_schedule_timestamp
                    || last.timestamp != sm.max_schedule_timestamp
                {
                    v.push(format!(
                        "{who}: segment {seg_no} spans {}..={} but its metadata says {}..={}",
                        first.timestamp,
                        last.timestamp,
                        sm.min_schedule_timestamp,
                        sm.max_schedule_timestamp
                    ));
                }
            }
        }
        if bitmap_total != index_total && segment_ids.len() as u64 == n {
            v.push(format!("{who}: delayed count from bitmaps {bitmap_total} != indexes in segments {index_total}"));
        }
    }
    checks += 1;
    if !st.orphan_snapshots.is_empty() {
        v.push(format!(
            "snapshot table: snapshots {:?} are named by no cursor property",
            st.orphan_snapshots
        ));
    }
    // pending-ack logs
    for log in &st.pending_ack_logs {
        checks += 1;
        let who = format!("pending-ack log {}", log.managed_ledger);
        for e in &log.errors {
            v.push(format!("{who}: {e}"));
        }
        let Some(sub) = &log.subscription else {
            v.push(format!(
                "{who}: no subscription cursor matches the log name"
            ));
            continue;
        };
        let cursor = &c.cursors[sub];
        let topic = c.ledgers.get(&sub.0);
        let acked = |p: Position| {
            p <= cursor.mark_delete
                || cursor
                    .individually_deleted
                    .iter()
                    .any(|(lo, hi)| p > *lo && p <= *hi)
        };
        let s = log.state.summary();
        for (txn, ps) in &s.individual {
            for p in ps {
                if acked(*p) {
                    v.push(format!("{who}: txn {txn} holds a pending ack on {p}, which the subscription already acknowledged"));
                }
                if topic.is_some_and(|t| !within(t, *p)) {
                    v.push(format!(
                        "{who}: txn {txn} pending ack {p} is outside the topic's ledgers"
                    ));
                }
            }
        }
    }
    (checks, v)
}

pub fn run(args: VerifyArgs) -> ExitCode {
    let st = match load_store(&args.dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let (checks, violations) = verify(&st);
    let delayed: u64 = st
        .buckets
        .iter()
        .filter_map(|b| {
            b.entries
                .iter()
                .find(|(e, _)| *e == 0)
                .and_then(|(_, d)| decode_metadata(b.snapshot_id, d).ok())
        })
        .flat_map(|m| m.metadata_list.into_iter())
        .filter_map(|s| decode_segment_bitmaps(0, &s).ok())
        .flat_map(|bms| bms.into_values().map(|bm| bm.len()))
        .sum();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "store": st.path.display().to_string(),
                "checks": checks,
                "delayed_messages_in_snapshots": delayed,
                "violations": violations,
                "ok": violations.is_empty(),
            }))
            .unwrap_or_default()
        );
    } else if violations.is_empty() {
        println!(
            "OK: {} — {checks} checks, {} cursors, {} buckets ({delayed} delayed messages in snapshots), {} pending-ack logs",
            st.path.display(),
            st.contents.cursors.len(),
            st.buckets.len(),
            st.pending_ack_logs.len()
        );
    } else {
        println!(
            "FAILED: {} — {} violations in {checks} checks:",
            st.path.display(),
            violations.len()
        );
        for x in &violations {
            println!("  - {x}");
        }
    }
    if violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
