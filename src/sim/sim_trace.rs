//! Trace files from simulator runs (cargo feature `trace`;
//! [`SimOptions::trace_dir`](crate::sim::SimOptions::trace_dir)): the hook
//! lines (src/trace.rs) the event loop's components recorded, split into
//! one run per component instance, in the format `specs/Trace<Spec>.tla`
//! reads (`t` the run; each run starts with an `Init` line holding the
//! spec's constants for it, which all runs of one file share).
//!
//! | file                        | instance (run `t`) | Init |
//! |-----------------------------|--------------------|------|
//! | `PermitConservation.ndjson` | one consumer id on one connection (the lines' `c`): its broker consumer in the subscription's `SharedDispatcher` and its client consumer, across its incarnations on that connection | `rq` (the workload's receiver queue), `maxP` (its batch size: the largest P of one command), `maxInc` (the most incarnations one connection had) |
//! | `LedgerCursor@MaxEntries=n,MaxBatch=b.ndjson` | one cursor incarnation (the lines' `ml` and `cur`: from its `Open`, or its first `Recover`, until it is opened anew), with every append of its managed ledger; positions as that managed ledger's entry numbers ([`crate::trace::ledger_cursor::to_entry_numbers`]); one file per managed-ledger length `n`, `b` the longest read of the file | none (the header names `ml` and `cur`) |
//! | `DeletionLookup@MaxEntry=e,MaxResets=r,MaxIds=i.ndjson` | one cursor deletion state (the lines' `ds`, from its `Open`): a subscription's, or the one a broker restart recovered, with its cursor's `Persist` lines (store writes) while it is the cursor's state | the state's `Open` (mark-delete and deleted ranges; a recovered one also `pred`, the run of its cursor's previous state); the first line also the topic's ledger layout (`layout`, the spec's `LastEntry`) |
//! | `PendingAckReplay@N=n,B=b,Cap=c,MaxTransient=m,MaxNonrec=k.ndjson` | one pending-ack handle (the lines' `h`, from the engine's `Init` line when it creates the handle) from its first attempt until it settles Ready or Error; one file per log length `n` (the spec's N is a constant); `m` the most transient read failures one of its runs saw (at least 3), `k` the most single non-recoverable ones of a log not lost | `lost`, `autoSkip`, `rp` (the start read position as an entry number) |
//! | `BucketMerge@MaxCrashes=c.ndjson` | one subscription's delayed trackers (the lines' `st.trk`, joined by the engine's `Tracker` lines), across its restarts; only with one entry per ledger (otherwise counted as `BucketMerge (dropped: ...)`); positions renumbered 1..NP over every tracker's delayed messages in ledger order, the spec's clock the cutoff (`now + delayed_tick_ms`), `Tick` lines where it moved; a later tracker's `Recover` (a restart: the spec's `Crash`, the persisted mark-delete in the `Ack` after it) starts a re-read whose `Add` lines interleave with the rest; `c` the most restarts of one run (at least 1) | `ts` (delivery times), `maxT`, `maxIdx` (100) |
//!
//! A file name `Spec@K=V,...` names the trace cfg's constants that differ
//! per file: `.ci/trace` writes them into its copy of `specs/Trace<Spec>.cfg`.
//!
//! A pending-ack run whose log is partly lost is not written (the spec's
//! `lost` is the whole log), nor one whose log is lost with auto-skip on (the
//! managed ledger skips the lost entries inside the read; the spec models
//! auto-skip as a completing read failure): each is counted in the returned
//! list as `PendingAckReplay (dropped: REASON)`. A handle closed before it
//! settled (the broker restarted during its replay or its retry backoff: the
//! spec closes a handle only while a read callback is lost) and one still
//! replaying when the run ended are written as prefixes: their `Init` line
//! carries `cut` (the reason), every line must still be followed, and the
//! trace spec does not require them to end settled; they are counted as
//! `PendingAckReplay (prefix: ...)`.
//! Positions map to entry numbers as in `tests/trace_pending_ack.rs`: the
//! log's entries after the mark-delete are 1..N in order, N+1 is past the
//! end, 0 an empty poll.
//!
//! The simulator's network is what the spec's channels describe: frames a
//! connection carries arrive in order (one latency per direction), the
//! broker reads the client's frames as they are written, and a closed
//! connection's frames never arrive (the broker removes its consumers:
//! the spec's `BrokerWriteFailure`, recorded as such).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};

use super::Workload;
use crate::position::Position;
use crate::trace::pending_ack;

/// The spec file names and the actions of each (the hook lines' `action`).
const PERMITS: &str = "PermitConservation";

/// Writes the trace files of one run's `lines` (in recording order) to
/// `dir` (created if missing) and returns, per file written, its name,
/// runs and lines (also written to `dir/summary.tsv`, tab-separated, with
/// the dropped pending-ack runs' entries).
///
/// # Errors
/// The directory or a file cannot be written.
pub fn write(
    dir: &Path,
    workload: &Workload,
    topic: &str,
    lines: &[String],
) -> std::io::Result<Vec<(String, usize, usize)>> {
    std::fs::create_dir_all(dir)?;
    let mut permits: BTreeMap<(u64, u64), Vec<Value>> = BTreeMap::new();
    let mut order: Vec<(u64, u64)> = Vec::new();
    // Consumers of raw clients (no PIP-491 client state): not written.
    let mut raw: BTreeSet<(u64, u64)> = BTreeSet::new();
    for l in lines {
        let Ok(v) = serde_json::from_str::<Value>(l) else {
            continue;
        };
        // A `deletion` line's `c` is a position (its `MarkDelete`'s target),
        // and every `deletion` line names its state (`ds`).
        if v.get("ds").is_some() {
            continue;
        }
        if let Some(c) = v.get("c").and_then(Value::as_array) {
            let key = (
                c.first().and_then(Value::as_u64).unwrap_or(0),
                c.get(1).and_then(Value::as_u64).unwrap_or(0),
            );
            if v["action"] == "RawClient" {
                raw.insert(key);
                continue;
            }
            let run = permits.entry(key).or_insert_with(|| {
                order.push(key);
                Vec::new()
            });
            run.push(v);
        }
    }
    order.retain(|key| !raw.contains(key));
    let mut written = Vec::new();
    if !order.is_empty() {
        let max_inc = permits
            .values()
            .map(|run| 1 + run.iter().filter(|v| v["action"] == "Replace").count())
            .max()
            .unwrap_or(1);
        let init = json!({
            "action": "Init",
            "rq": workload.receiver_queue_size,
            "maxP": workload.batch_size.max(1),
            "maxInc": max_inc,
        });
        let path = dir.join(format!("{PERMITS}.ndjson"));
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path)?);
        let mut steps = 0;
        for (t, key) in order.iter().enumerate() {
            steps += write_run(&mut out, t + 1, &init, &permits[key])?;
        }
        out.flush()?;
        written.push((PERMITS.to_string(), order.len(), steps));
    }
    if !raw.is_empty() {
        written.push((
            format!("{PERMITS} (dropped: a raw client's consumer)"),
            raw.len(),
            0,
        ));
    }
    written.extend(write_pending_ack(dir, lines)?);
    written.extend(write_ledger_cursor(dir, lines)?);
    written.extend(write_deletion_lookup(dir, topic, lines)?);
    written.extend(write_bucket_merge(dir, workload, lines)?);
    let mut summary = std::io::BufWriter::new(std::fs::File::create(dir.join("summary.tsv"))?);
    for (name, runs, steps) in &written {
        writeln!(summary, "{name}\t{runs}\t{steps}")?;
    }
    summary.flush()?;
    Ok(written)
}

const PENDING_ACK: &str = "PendingAckReplay";

/// One pending-ack handle's run: its `Init` data and its lines.
struct HandleRun {
    log: Vec<Position>,
    /// The replay's read batch and queue capacity (the trace cfg's B and
    /// Cap): the `Init` line's `b` and `cap` (the broker core's handles
    /// write them; a run whose `Init` has neither is dropped).
    b: u64,
    cap: u64,
    init: Value,
    lines: Vec<Value>,
    partial_loss: bool,
    /// init()'s own HTimer (None -> Initializing) precedes the spec's
    /// initial state, which is already Initializing: it is not written.
    skip_first_timer: bool,
}

impl HandleRun {
    fn settled(&self) -> bool {
        self.lines.last().is_some_and(|v| {
            v["action"] == "HDone" && (v["state"] == "Ready" || v["state"] == "Error")
        })
    }

    /// The most `ReadFail` lines of kind `k` in one of `runs`.
    fn most_read_failures<'a>(runs: impl Iterator<Item = &'a HandleRun>, k: &str) -> usize {
        runs.map(|r| {
            r.lines
                .iter()
                .filter(|v| v["action"] == "ReadFail" && v["k"] == k)
                .count()
        })
        .max()
        .unwrap_or(0)
    }
}

/// Writes one run `t` (1-based): `head` (its `Init` line), then `lines`,
/// each tagged with `t`; returns the lines written.
fn write_run<'a>(
    out: &mut impl Write,
    t: usize,
    head: &Value,
    lines: impl IntoIterator<Item = &'a Value>,
) -> std::io::Result<usize> {
    let mut head = head.clone();
    head["t"] = Value::from(t);
    writeln!(out, "{head}")?;
    let mut n = 1;
    for v in lines {
        let mut v = v.clone();
        v["t"] = Value::from(t);
        writeln!(out, "{v}")?;
        n += 1;
    }
    Ok(n)
}

/// Writes the `PendingAckReplay@...` files; returns name, runs and lines per
/// file, then one entry per reason runs were dropped (name `PendingAckReplay
/// (dropped: REASON)`, the runs, 0 lines).
fn write_pending_ack(dir: &Path, lines: &[String]) -> std::io::Result<Vec<(String, usize, usize)>> {
    let mut open: BTreeMap<String, HandleRun> = BTreeMap::new();
    let mut done: Vec<HandleRun> = Vec::new();
    let mut dropped: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut close =
        |mut run: HandleRun, dropped: &mut BTreeMap<&'static str, usize>, at_end: bool| {
            if run.partial_loss {
                *dropped.entry("dropped: log partly lost").or_default() += 1;
                return;
            }
            if run.init["lost"] == true && run.init["autoSkip"] == true {
                // The managed ledger skips a lost ledger's entries inside
                // the read; the spec models auto-skip as a completing failure.
                *dropped
                    .entry("dropped: lost log with auto-skip")
                    .or_default() += 1;
                return;
            }
            if !run.settled() {
                let cut = if at_end {
                    "still replaying at the end of the run"
                } else {
                    "closed before it settled"
                };
                run.init["cut"] = Value::from(cut);
                *dropped
                    .entry(if at_end {
                        "prefix: still replaying at the end of the run"
                    } else {
                        "prefix: closed before it settled"
                    })
                    .or_default() += 1;
            }
            done.push(run);
        };
    for l in lines {
        let Ok(v) = serde_json::from_str::<Value>(l) else {
            continue;
        };
        let Some(h) = v.get("h").and_then(Value::as_str).map(str::to_string) else {
            continue;
        };
        let action = v["action"].as_str().unwrap_or_default();
        match action {
            "Init" => {
                if let Some(prev) = open.remove(&h) {
                    close(prev, &mut dropped, false);
                }
                let log: Vec<Position> = v["log"]
                    .as_array()
                    .map(|ps| {
                        ps.iter()
                            .map(|p| {
                                Position::new(
                                    p[0].as_i64().unwrap_or(0),
                                    p[1].as_i64().unwrap_or(0),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let (Some(b), Some(cap)) = (v["b"].as_u64(), v["cap"].as_u64()) else {
                    // Not a broker core handle's `Init` (trace::pending_ack::opened
                    // writes both): the spec's B and Cap are unknown.
                    *dropped
                        .entry("dropped: Init without the replay's read batch and capacity")
                        .or_default() += 1;
                    continue;
                };
                let mut run = HandleRun {
                    log,
                    b,
                    cap,
                    init: Value::Null,
                    lines: Vec::new(),
                    partial_loss: false,
                    skip_first_timer: true,
                };
                run.init = json!({
                    "action": "Init",
                    "lost": v["lost"],
                    "autoSkip": v["autoSkip"],
                    "rp": pending_ack::entry_number(&run.log, &v["rp"]),
                });
                open.insert(h, run);
            }
            "PartialLoss" => {
                if let Some(run) = open.get_mut(&h) {
                    run.partial_loss = true;
                }
            }
            a if pending_ack::ACTIONS.contains(&a) => {
                let Some(run) = open.get_mut(&h) else {
                    continue;
                };
                if std::mem::take(&mut run.skip_first_timer) && a == "HTimer" {
                    continue;
                }
                let mut v = v.clone();
                if let Some(m) = v.as_object_mut() {
                    m.remove("h");
                }
                pending_ack::to_entry_numbers(&mut v, &run.log);
                run.lines.push(v);
            }
            _ => {}
        }
    }
    for (_, run) in std::mem::take(&mut open) {
        close(run, &mut dropped, true);
    }
    let mut by_n: BTreeMap<(usize, u64, u64), Vec<HandleRun>> = BTreeMap::new();
    for run in done {
        by_n.entry((run.log.len(), run.b, run.cap))
            .or_default()
            .push(run);
    }
    let mut written = Vec::new();
    for ((n, b, cap), runs) in by_n {
        let transient = HandleRun::most_read_failures(runs.iter(), "transient").max(3);
        let nonrec =
            HandleRun::most_read_failures(runs.iter().filter(|r| r.init["lost"] != true), "nonrec");
        let name = format!(
            "{PENDING_ACK}@N={n},B={b},Cap={cap},MaxTransient={transient},MaxNonrec={nonrec}"
        );
        let mut out =
            std::io::BufWriter::new(std::fs::File::create(dir.join(format!("{name}.ndjson")))?);
        let mut steps = 0;
        for (t, run) in runs.iter().enumerate() {
            steps += write_run(&mut out, t + 1, &run.init, &run.lines)?;
        }
        out.flush()?;
        written.push((name, runs.len(), steps));
    }
    for (why, count) in dropped {
        written.push((format!("{PENDING_ACK} ({why})"), count, 0));
    }
    Ok(written)
}

const LEDGER_CURSOR: &str = "LedgerCursor";

/// One cursor incarnation's run: from its `Open` or first `Recover` (a
/// cursor opened again after it was deleted starts a new run) to the end,
/// with its managed ledger's appends (those before it opened included).
struct CursorRun {
    ml: String,
    cur: String,
    lines: Vec<Value>,
}

/// Writes the `LedgerCursor@MaxEntries=n,MaxBatch=b` files: one run per
/// cursor incarnation, positions as entry numbers of its managed ledger,
/// one file per managed-ledger length `n` (the spec's MaxEntries), `b` the
/// longest read of the file's runs; returns name, runs and lines per file.
fn write_ledger_cursor(
    dir: &Path,
    lines: &[String],
) -> std::io::Result<Vec<(String, usize, usize)>> {
    // Every managed ledger's lines, in recording order.
    let mut by_ml: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for l in lines {
        let Ok(v) = serde_json::from_str::<Value>(l) else {
            continue;
        };
        if !crate::trace::ledger_cursor::ACTIONS.contains(&v["action"].as_str().unwrap_or_default())
        {
            continue; // a `deletion` line naming its cursor (`Persist`, `Cursor`)
        }
        if let Some(ml) = v.get("ml").and_then(Value::as_str) {
            by_ml.entry(ml.to_string()).or_default().push(v);
        }
    }
    let mut runs: Vec<(usize, CursorRun)> = Vec::new();
    for (ml, mut values) in by_ml {
        let n = crate::trace::ledger_cursor::to_entry_numbers(&mut values);
        let mut appends: Vec<Value> = Vec::new();
        let mut open: BTreeMap<String, CursorRun> = BTreeMap::new();
        for mut v in values {
            let cur = v.get("cur").and_then(Value::as_str).map(str::to_string);
            if let Some(m) = v.as_object_mut() {
                m.remove("ml");
                m.remove("cur");
            }
            let Some(cur) = cur else {
                for run in open.values_mut() {
                    run.lines.push(v.clone());
                }
                appends.push(v);
                continue;
            };
            if v["action"] == "Open" {
                if let Some(prev) = open.remove(&cur) {
                    runs.push((n, prev));
                }
            }
            let run = open.entry(cur.clone()).or_insert_with(|| CursorRun {
                ml: ml.clone(),
                cur,
                lines: appends.clone(),
            });
            run.lines.push(v);
        }
        runs.extend(open.into_values().map(|run| (n, run)));
    }
    let mut by_n: BTreeMap<usize, Vec<CursorRun>> = BTreeMap::new();
    for (n, run) in runs {
        by_n.entry(n).or_default().push(run);
    }
    let mut written = Vec::new();
    for (n, runs) in by_n {
        let batch = runs
            .iter()
            .flat_map(|r| &r.lines)
            .filter_map(|v| match v["action"].as_str() {
                Some("Read") => v["k"].as_i64(),
                Some("ReadRun") => Some(v["last"].as_i64()? - v["first"].as_i64()? + 1),
                _ => None,
            })
            .max()
            .unwrap_or(1)
            .max(1);
        let name = format!("{LEDGER_CURSOR}@MaxEntries={},MaxBatch={batch}", n.max(1));
        let mut out =
            std::io::BufWriter::new(std::fs::File::create(dir.join(format!("{name}.ndjson")))?);
        let mut steps = 0;
        for (t, run) in runs.iter().enumerate() {
            let head = json!({ "action": "Init", "ml": run.ml, "cur": run.cur });
            steps += write_run(&mut out, t + 1, &head, &run.lines)?;
        }
        out.flush()?;
        written.push((name, runs.len(), steps));
    }
    Ok(written)
}

const DELETION_LOOKUP: &str = "DeletionLookup";

/// The ledger ids of the positions a `DeletionLookup` line names.
fn deletion_ledgers(v: &Value) -> Vec<i64> {
    let mut out = Vec::new();
    for k in ["md", "p", "c", "q", "rmd"] {
        if let Some(l) = v.get(k).and_then(|p| p.get(0)).and_then(Value::as_i64) {
            out.push(l);
        }
    }
    for r in v
        .get("ranges")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for p in r.as_array().into_iter().flatten() {
            out.extend(p.get(0).and_then(Value::as_i64));
        }
    }
    out
}

/// Writes `DeletionLookup@MaxEntry=e,MaxResets=r,MaxIds=i.ndjson`: one run
/// per cursor deletion state (the lines' `ds`: every subscription's state,
/// a broker restart's recovered one a new run, each from its `Open`), in
/// creation order. The first line also holds `layout`, the topic's managed
/// ledger as `[ledger id, last entry id]` pairs from its `AppendEntry`
/// lines (a ledger a line names that holds no entry: -1), which the trace
/// spec takes as `LastEntry`. `e` is the highest entry id, `r` the most
/// resets of one run (at least 1), `i` a bound on the bitmaps one run
/// creates (one per `Ack` at most, plus one per ledger for the `Open`).
///
/// Recovery across restarts (`RecoveredAsPersisted`): a `Cursor` line
/// joins a state to its cursor (`ml`, `cur`); the cursor's `Persist` lines
/// (its store writes) go to the run of the state joined to it last, in
/// recording order (a new cursor's first record, saved before its state
/// exists, right after that state's `Open`). A state joined to a cursor
/// that already had one (the cursor recovered from the store: no
/// `LedgerCursor` `Open` of a new cursor in between) gets `pred` on its
/// `Open`: the run of that previous state. The returned list also counts
/// them, as `DeletionLookup (linked: recovered from a predecessor run)`.
fn write_deletion_lookup(
    dir: &Path,
    topic: &str,
    lines: &[String],
) -> std::io::Result<Vec<(String, usize, usize)>> {
    let mut layout: BTreeMap<i64, i64> = BTreeMap::new();
    let mut runs: BTreeMap<u64, Vec<Value>> = BTreeMap::new();
    // Per cursor (ml, cur): the state joined to it last, and the `Persist`
    // lines of a new cursor not yet joined to its state.
    let mut joined: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut unjoined: BTreeMap<(String, String), Vec<Value>> = BTreeMap::new();
    // Per state: the state its cursor had before it.
    let mut pred: BTreeMap<u64, u64> = BTreeMap::new();
    // Every state a `Cursor` line joined to its cursor.
    let mut cursor_states: BTreeSet<u64> = BTreeSet::new();
    // States of another managed ledger's cursors: not written.
    let mut other_topic: BTreeSet<u64> = BTreeSet::new();
    for l in lines {
        let Ok(mut v) = serde_json::from_str::<Value>(l) else {
            continue;
        };
        if v["action"] == "AppendEntry" && v["ml"] == topic {
            if let (Some(lid), Some(e)) = (v["p"][0].as_i64(), v["p"][1].as_i64()) {
                let last = layout.entry(lid).or_insert(-1);
                *last = (*last).max(e);
            }
            continue;
        }
        let cursor = match (v["ml"].as_str(), v["cur"].as_str()) {
            (Some(ml), Some(cur)) => Some((ml.to_string(), cur.to_string())),
            _ => None,
        };
        match (v["action"].as_str(), cursor) {
            // A new cursor (no store record): its states have no predecessor.
            (Some("Open"), Some(c)) => {
                joined.remove(&c);
                unjoined.remove(&c);
                continue;
            }
            (Some("Persist"), Some(c)) => {
                if let Some(m) = v.as_object_mut() {
                    m.remove("ml");
                    m.remove("cur");
                }
                match joined.get(&c) {
                    Some(ds) => runs.entry(*ds).or_default().push(v),
                    None => unjoined.entry(c).or_default().push(v),
                }
                continue;
            }
            (Some("Cursor"), Some(c)) => {
                let Some(ds) = v["ds"].as_u64() else { continue };
                if c.0 != topic {
                    // Another managed ledger's cursor (the node engine's
                    // second topic): the layout is `topic`'s.
                    other_topic.insert(ds);
                    continue;
                }
                cursor_states.insert(ds);
                if let Some(prev) = joined.insert(c.clone(), ds) {
                    pred.insert(ds, prev);
                }
                runs.entry(ds)
                    .or_default()
                    .extend(unjoined.remove(&c).unwrap_or_default());
                continue;
            }
            _ => {}
        }
        let Some(ds) = v.get("ds").and_then(Value::as_u64) else {
            continue;
        };
        if let Some(m) = v.as_object_mut() {
            m.remove("ds");
        }
        runs.entry(ds).or_default().push(v);
    }
    let runs: Vec<(u64, Vec<Value>)> = runs
        .into_iter()
        .filter(|(ds, run)| {
            !other_topic.contains(ds) && run.first().is_some_and(|v| v["action"] == "Open")
        })
        .collect();
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    let (states, runs): (Vec<u64>, Vec<Vec<Value>>) = runs.into_iter().unzip();
    let t_of: BTreeMap<u64, usize> = states
        .iter()
        .enumerate()
        .map(|(t, ds)| (*ds, t + 1))
        .collect();
    // A joined state without a run would leave its cursor's recovery
    // unchecked (no `pred`, its `Persist` lines dropped): an error, not a
    // silently weaker trace.
    if let Some(ds) = cursor_states.iter().find(|ds| !t_of.contains_key(ds)) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{DELETION_LOOKUP}: a Cursor line joins state {ds}, which has no run from an \
                 Open line: its cursor's recovery cannot be linked"
            ),
        ));
    }
    for v in runs.iter().flatten() {
        for l in deletion_ledgers(v) {
            layout.entry(l).or_insert(-1);
        }
    }
    let count = |run: &[Value], action: &str| run.iter().filter(|v| v["action"] == action).count();
    let max_entry = layout.values().copied().max().unwrap_or(0).max(0);
    let max_resets = runs
        .iter()
        .map(|r| count(r, "ResetBegin"))
        .max()
        .unwrap_or(0)
        .max(1);
    let max_ids = runs.iter().map(|r| count(r, "Ack")).max().unwrap_or(0) + layout.len() + 1;
    let name =
        format!("{DELETION_LOOKUP}@MaxEntry={max_entry},MaxResets={max_resets},MaxIds={max_ids}");
    let mut out =
        std::io::BufWriter::new(std::fs::File::create(dir.join(format!("{name}.ndjson")))?);
    let mut steps = 0;
    let mut linked = 0;
    for (t, run) in runs.iter().enumerate() {
        let mut head = run[0].clone();
        if t == 0 {
            head["layout"] = layout.iter().map(|(l, e)| json!([l, e])).collect();
        }
        if let Some(p) = pred.get(&states[t]).and_then(|p| t_of.get(p)) {
            head["pred"] = Value::from(*p);
            linked += 1;
        }
        steps += write_run(&mut out, t + 1, &head, &run[1..])?;
    }
    out.flush()?;
    let mut written = vec![(name, runs.len(), steps)];
    if linked > 0 {
        written.push((
            format!("{DELETION_LOOKUP} (linked: recovered from a predecessor run)"),
            linked,
            0,
        ));
    }
    Ok(written)
}

const BUCKET_MERGE: &str = "BucketMerge";

/// Writes `BucketMerge.ndjson`: one run per subscription with a delayed
/// tracker (its trackers' lines, `st.trk`, joined across restarts by the
/// engine's `Tracker` lines), in the spec's terms. Only for one entry per
/// ledger (`max_entries_per_ledger = 1`; the hooks name positions by
/// ledger, and a bucket's ledger range is then an interval of positions):
/// otherwise nothing is written and the summary says so. Positions: the
/// delayed messages any tracker was given, numbered 1..NP in ledger order
/// (every run shares them, hence `TS`); a bucket range `[lo, hi]` of ledgers
/// becomes the positions in it; a mark-delete `(L, e)` the first position
/// above it. Time: the spec's clock is the tracker's cutoff (`now +
/// delayed_tick_ms`, not strict), `TS` the delivery times; a `Tick` line
/// precedes a line whose clock moved (forward only). The `Init` line holds
/// `ts`, `maxT` (the last clock) and `maxIdx` (100, the engine's
/// max indexes per segment; its time step, 5 s, must not cut: the
/// workload keeps a bucket's delivery times within it). The first
/// tracker's `Recover` (nothing in storage) is not written; a later one is
/// a restart (the spec's `Crash`), its re-read the `Add` lines of positions
/// added before it, which interleave with the other lines.
fn write_bucket_merge(
    dir: &Path,
    workload: &Workload,
    lines: &[String],
) -> std::io::Result<Vec<(String, usize, usize)>> {
    let mut sub_of: BTreeMap<u64, String> = BTreeMap::new();
    let mut by_trk: Vec<(u64, Value)> = Vec::new();
    // What the trackers' cutoff adds to their clock and their indexes per
    // segment: the broker core's `Tracker` lines say (`tick`, `maxIdx`);
    // without them, the workload's tick and 100 indexes.
    let mut tick = workload.delayed_tick_ms as i64;
    let mut max_idx = 100;
    for l in lines {
        let Ok(v) = serde_json::from_str::<Value>(l) else {
            continue;
        };
        if v["action"] == "Tracker" {
            if let (Some(t), Some(s)) = (v["trk"].as_u64(), v["sub"].as_str()) {
                sub_of.insert(t, s.to_string());
            }
            if let Some(t) = v["tick"].as_i64() {
                tick = t;
            }
            if let Some(m) = v["maxIdx"].as_i64() {
                max_idx = m;
            }
            continue;
        }
        if let Some(t) = v
            .get("st")
            .and_then(|st| st.get("trk"))
            .and_then(Value::as_u64)
        {
            by_trk.push((t, v));
        }
    }
    if by_trk.is_empty() {
        return Ok(Vec::new());
    }
    if workload.max_entries_per_ledger != 1 {
        return Ok(vec![(
            format!("{BUCKET_MERGE} (dropped: max_entries_per_ledger is not 1)"),
            sub_of.values().collect::<BTreeSet<_>>().len(),
            0,
        )]);
    }
    // Positions: every ledger a tracker was given, with its delivery time.
    let mut at: BTreeMap<i64, i64> = BTreeMap::new();
    for (_, v) in &by_trk {
        if v["action"] == "Add" {
            if let (Some(p), Some(a)) = (v["p"].as_i64(), v["at"].as_i64()) {
                at.insert(p, a);
            }
        }
    }
    // TLC's integers are 32-bit: times on an epoch clock (the node
    // engine's) are shifted so the earliest clock or delivery time is 0
    // (a shift of every time keeps every comparison the spec makes).
    let earliest = by_trk
        .iter()
        .filter_map(|(_, v)| v["st"]["clock"].as_i64())
        .map(|c| c + tick)
        .chain(at.values().copied())
        .min()
        .unwrap_or(0);
    let base = if earliest > i64::from(i32::MAX) {
        earliest
    } else {
        0
    };
    for a in at.values_mut() {
        *a -= base;
    }
    let num: BTreeMap<i64, i64> = at
        .keys()
        .enumerate()
        .map(|(i, l)| (*l, i as i64 + 1))
        .collect();
    let np = num.len() as i64;
    let pos = |l: &Value| -> Value { l.as_i64().and_then(|l| num.get(&l)).copied().into() };
    let first_from = |l: i64| -> i64 { num.range(l..).next().map_or(np + 1, |(_, n)| *n) };
    let last_to = |l: i64| -> i64 { num.range(..=l).next_back().map_or(0, |(_, n)| *n) };
    let seqs = |v: &Value| -> Value {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|s| {
                        s.as_array()
                            .map(|s| s.iter().map(pos).collect::<Value>())
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let map_st = |st: &Value| -> Value {
        let set = |k: &str| -> Value {
            st[k]
                .as_array()
                .map(|a| a.iter().map(pos).collect())
                .unwrap_or_default()
        };
        let buckets: Vec<Value> = st["buckets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|b| {
                json!([
                    first_from(b[0].as_i64().unwrap_or(0)),
                    last_to(b[1].as_i64().unwrap_or(0)),
                    b[2]
                ])
            })
            .collect();
        json!({
            "clock": st["clock"].as_i64().unwrap_or(0) + tick - base,
            "index": set("index"),
            "counter": st["counter"],
            "queue": set("queue"),
            "mheap": set("mheap"),
            "buckets": buckets,
        })
    };
    let mut runs: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut max_t = 0i64;
    let mut crashes: BTreeMap<String, usize> = BTreeMap::new();
    let mut first_trk: BTreeMap<String, u64> = BTreeMap::new();
    // Per run: its clock.
    let mut clocks: BTreeMap<String, i64> = BTreeMap::new();
    for (t, v) in &by_trk {
        let Some(sub) = sub_of.get(t) else { continue };
        let run = runs.entry(sub.clone()).or_default();
        let clock = clocks.entry(sub.clone()).or_insert(0);
        let mut v = v.clone();
        let st = map_st(&v["st"]);
        let c = st["clock"].as_i64().unwrap_or(0);
        max_t = max_t.max(c);
        if c > *clock {
            run.push(json!({ "action": "Tick", "clock": c }));
            *clock = c;
        }
        v["st"] = st;
        if let Some(a) = v["at"].as_i64() {
            v["at"] = (a - base).into();
        }
        match v["action"].as_str().unwrap_or_default() {
            "Recover" => {
                if *first_trk.entry(sub.clone()).or_insert(*t) == *t {
                    continue; // the subscription's first tracker: nothing stored
                }
                *crashes.entry(sub.clone()).or_default() += 1;
            }
            "Add" | "Pop" => v["p"] = pos(&v["p"]),
            "LoadNextSegment" | "Trim" => {
                v["lo"] = first_from(v["lo"].as_i64().unwrap_or(0)).into()
            }
            "Seal" => v["segs"] = seqs(&v["segs"]),
            "Merge" => {
                v["segs"] = seqs(&v["segs"]);
                v["srcs"] = v["srcs"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|l| Value::from(first_from(l.as_i64().unwrap_or(0))))
                            .collect()
                    })
                    .unwrap_or_default();
            }
            "Ack" => {
                let (l, e) = (v["md"].as_i64().unwrap_or(0), v["e"].as_i64().unwrap_or(-1));
                v["md"] = first_from(if e >= 0 { l + 1 } else { l }).into();
            }
            _ => {}
        }
        run.push(v);
    }
    let ts: Vec<i64> = at.values().copied().collect();
    let max_crashes = crashes.values().copied().max().unwrap_or(0).max(1);
    let init = json!({ "action": "Init", "ts": ts, "maxT": max_t, "maxIdx": max_idx });
    let name = format!("{BUCKET_MERGE}@MaxCrashes={max_crashes}");
    let mut out =
        std::io::BufWriter::new(std::fs::File::create(dir.join(format!("{name}.ndjson")))?);
    let mut steps = 0;
    for (t, run) in runs.values().enumerate() {
        steps += write_run(&mut out, t + 1, &init, run)?;
    }
    out.flush()?;
    Ok(vec![(name, runs.len(), steps)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn line(v: Value) -> String {
        v.to_string()
    }

    /// Handle `h`'s lines: its `Init` (log `[[7,0],[7,1]]`, read position
    /// at the first entry), init()'s HTimer, then `body`.
    fn handle_run(h: &str, body: &[Value]) -> Vec<String> {
        let mut lines = vec![
            line(
                json!({"action": "Init", "h": h, "log": [[7, 0], [7, 1]], "rp": [7, 0], "lost": false, "autoSkip": false, "b": 4, "cap": 16}),
            ),
            line(json!({"action": "HTimer", "h": h})),
        ];
        lines.extend(body.iter().map(|v| {
            let mut v = v.clone();
            v["h"] = Value::from(h);
            line(v)
        }));
        lines
    }

    /// PermitConservation runs: one per consumer id on one connection; a
    /// raw client's consumer (`RawClient`: no PIP-491 client state) is not
    /// written, and a `deletion` line's `c` (a `MarkDelete` target, with
    /// its state's `ds`) is not a consumer.
    #[test]
    fn permit_runs_leave_out_raw_clients_and_deletion_lines() {
        let lines = vec![
            line(json!({"action": "BrokerRecv", "c": [1, 1], "f": "sub"})),
            line(json!({"action": "RawClient", "c": [2, 1]})),
            line(json!({"action": "BrokerRecv", "c": [2, 1], "f": "sub"})),
            line(json!({"action": "BrokerRecv", "c": [2, 1], "f": "flow", "n": 500})),
            line(json!({"action": "MarkDelete", "ds": 4, "c": [3, 0]})),
            line(json!({"action": "BrokerRecv", "c": [1, 1], "f": "flow", "n": 10})),
        ];
        let workload = Workload {
            receiver_queue_size: 10,
            ..Workload::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let written = write(dir.path(), &workload, "topic", &lines).unwrap();
        assert!(
            written.contains(&(PERMITS.to_string(), 1, 3)),
            "{written:?}"
        );
        assert!(written.contains(&(
            format!("{PERMITS} (dropped: a raw client's consumer)"),
            1,
            0
        )));
        let file = read_file(dir.path(), PERMITS);
        assert!(file
            .iter()
            .all(|v| v["c"] == json!([1, 1]) || v["action"] == "Init"));
    }

    /// A tracker on an epoch clock (the node engine's): times are shifted
    /// so the earliest is 0 (TLC's integers are 32-bit), the cutoff offset
    /// and segment size come from its `Tracker` line.
    #[test]
    fn bucket_merge_shifts_epoch_times_and_takes_the_trackers_tick() {
        let e = 1_700_000_000_000i64;
        let st = |clock: i64, index: &[i64]| {
            json!({"clock": clock, "index": index, "counter": index.len(), "queue": [],
                   "mheap": index, "buckets": [], "trk": 9})
        };
        let lines: Vec<String> = [
            json!({"action": "Tracker", "trk": 9, "sub": "t/sub-0", "tick": 0, "maxIdx": 7}),
            json!({"action": "Recover", "st": st(e, &[])}),
            json!({"action": "Add", "p": 10, "at": e + 500, "due": false, "st": st(e + 100, &[10])}),
        ]
        .into_iter()
        .map(line)
        .collect();
        let workload = Workload {
            max_entries_per_ledger: 1,
            delayed_tick_ms: 100,
            ..Workload::default()
        };
        let dir = tempfile::tempdir().unwrap();
        write_bucket_merge(dir.path(), &workload, &lines).unwrap();
        let file = read_file(dir.path(), "BucketMerge@MaxCrashes=1");
        assert_eq!(
            file[0],
            json!({"action": "Init", "ts": [500], "maxT": 100, "maxIdx": 7, "t": 1})
        );
        assert_eq!(file[1], json!({"action": "Tick", "clock": 100, "t": 1}));
        assert_eq!(
            (&file[2]["at"], &file[2]["st"]["clock"]),
            (&json!(500), &json!(100))
        );
    }

    fn read_file(dir: &Path, name: &str) -> Vec<Value> {
        std::fs::read_to_string(dir.join(format!("{name}.ndjson")))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn pending_ack_runs_are_split_per_handle_mapped_to_entry_numbers_and_named_by_constants() {
        let settled = [
            json!({"action": "HStart", "rp": [7, 0]}),
            json!({"action": "Poll", "entry": [7, 1]}),
            json!({"action": "Poll", "entry": null}),
            json!({"action": "REnd", "outcome": "complete", "rp": [8, 0]}),
            json!({"action": "HDone", "state": "Ready"}),
        ];
        let closed = [
            json!({"action": "HStart", "rp": [7, 0]}),
            json!({"action": "ReadFail", "k": "transient"}),
            json!({"action": "HDone", "state": "None"}),
        ];
        let mut lines = handle_run("a", &closed);
        // A second handle of the same name (the broker restarted): `a`'s
        // first run ends there, unsettled.
        lines.extend(handle_run("b", &settled));
        lines.extend(handle_run("a", &settled));
        lines.push(line(json!({"action": "Ack", "p": [1, 2]})));
        let partial = handle_run("c", &settled);
        lines.insert(lines.len(), partial[0].clone());
        lines.push(line(json!({"action": "PartialLoss", "h": "c"})));
        lines.extend(partial[1..].iter().cloned());
        let mut lost_skipped = handle_run("d", &settled);
        lost_skipped[0] = line(
            json!({"action": "Init", "h": "d", "log": [[7, 0], [7, 1]], "rp": [7, 0], "lost": true, "autoSkip": true, "b": 4, "cap": 16}),
        );
        lines.extend(lost_skipped);

        let dir = tempfile::tempdir().unwrap();
        let written = write_pending_ack(dir.path(), &lines).unwrap();
        let name = "PendingAckReplay@N=2,B=4,Cap=16,MaxTransient=3,MaxNonrec=0";
        assert_eq!(
            written,
            vec![
                (name.to_string(), 3, 3 + 3 + 5 + 5),
                (
                    "PendingAckReplay (dropped: log partly lost)".to_string(),
                    1,
                    0
                ),
                (
                    "PendingAckReplay (dropped: lost log with auto-skip)".to_string(),
                    1,
                    0
                ),
                (
                    "PendingAckReplay (prefix: closed before it settled)".to_string(),
                    1,
                    0
                ),
            ]
        );
        let file = read_file(dir.path(), name);
        // Runs in the order they ended; the cut one first.
        assert_eq!(file[0]["action"], "Init");
        assert_eq!(file[0]["cut"], "closed before it settled");
        assert_eq!(file[0]["rp"], 1);
        assert_eq!(
            file[1]["action"], "HStart",
            "init()'s HTimer is not written"
        );
        assert!(file.iter().all(|v| v.get("h").is_none()));
        let polls: Vec<&Value> = file
            .iter()
            .filter(|v| v["action"] == "Poll")
            .map(|v| &v["entry"])
            .collect();
        assert_eq!(
            polls,
            [
                &Value::from(2),
                &Value::from(0),
                &Value::from(2),
                &Value::from(0)
            ]
        );
        let ends: Vec<&Value> = file
            .iter()
            .filter(|v| v["action"] == "REnd")
            .map(|v| &v["rp"])
            .collect();
        assert_eq!(
            ends,
            [&Value::from(3), &Value::from(3)],
            "past the end is N + 1"
        );
        let runs: BTreeSet<u64> = file.iter().map(|v| v["t"].as_u64().unwrap()).collect();
        assert_eq!(runs, BTreeSet::from([1, 2, 3]));
    }

    /// One run per cursor incarnation, each with its managed ledger's
    /// appends (also those before it opened), positions as entry numbers of
    /// that managed ledger (ledger 3's first entry follows ledger 2's two).
    #[test]
    fn ledger_cursor_runs_are_split_per_cursor_incarnation_with_their_ledgers_appends() {
        let c = |action: &str, cur: &str, fields: Value| {
            let mut v = fields;
            v["action"] = action.into();
            v["ml"] = "topic".into();
            v["cur"] = cur.into();
            line(v)
        };
        let append = |ml: &str, l: i64, e: i64| {
            line(json!({"action": "AppendEntry", "ml": ml, "p": [l, e]}))
        };
        let lines = vec![
            append("topic", 2, 0),
            c("Open", "a", json!({"md": [2, -1], "read": [2, 0]})),
            append("topic", 2, 1),
            append("other", 9, 0),
            c("Read", "a", json!({"k": 2, "read": [3, 0]})),
            c("Open", "b", json!({"md": [2, -1], "read": [2, 0]})),
            append("topic", 3, 0),
            c(
                "ReadRun",
                "b",
                json!({"first": [3, 0], "last": [3, 0], "read": [3, 1]}),
            ),
            // `a` deleted and created again: a new incarnation
            c("Open", "a", json!({"md": [2, -1], "read": [2, 0]})),
            c("MarkDelete", "a", json!({"md": [3, 0], "read": [3, 1]})),
        ];
        let dir = tempfile::tempdir().unwrap();
        let written = write_ledger_cursor(dir.path(), &lines).unwrap();
        let name = "LedgerCursor@MaxEntries=3,MaxBatch=2";
        assert_eq!(written, vec![(name.to_string(), 3, 6 + 6 + 6)]);
        let file = read_file(dir.path(), name);
        let run = |t: u64| -> Vec<Value> {
            file.iter()
                .filter(|v| v["t"] == t)
                .map(|v| {
                    let mut v = v.clone();
                    v.as_object_mut().unwrap().remove("t");
                    v
                })
                .collect()
        };
        // first `a`: appends before and after its Open, its read, until
        // its second Open (the other managed ledger's append is not in it)
        assert_eq!(
            run(1),
            vec![
                json!({"action": "Init", "ml": "topic", "cur": "a"}),
                json!({"action": "AppendEntry", "p": 0}),
                json!({"action": "Open", "md": -1, "read": 0}),
                json!({"action": "AppendEntry", "p": 1}),
                json!({"action": "Read", "k": 2, "read": 2}),
                json!({"action": "AppendEntry", "p": 2}),
            ]
        );
        // second `a`: every earlier append of `topic`, then its own lines
        assert_eq!(
            run(2),
            vec![
                json!({"action": "Init", "ml": "topic", "cur": "a"}),
                json!({"action": "AppendEntry", "p": 0}),
                json!({"action": "AppendEntry", "p": 1}),
                json!({"action": "AppendEntry", "p": 2}),
                json!({"action": "Open", "md": -1, "read": 0}),
                json!({"action": "MarkDelete", "md": 2, "read": 3}),
            ]
        );
        assert_eq!(run(3)[0]["cur"], "b");
        assert_eq!(
            run(3).last().unwrap(),
            &json!({"action": "ReadRun", "first": 2, "last": 2, "read": 3})
        );
    }

    /// One run per deletion state (`ds`), in creation order, each from its
    /// `Open`; the first line carries the topic's layout (a ledger only a
    /// line names holds no entry: -1); other managed ledgers' appends and
    /// other specs' lines (a permits `d`) are not taken.
    #[test]
    fn deletion_lookup_runs_are_split_per_state_with_the_topics_layout() {
        let topic = crate::sim::node::TOPIC;
        let append = |ml: &str, l: i64, e: i64| {
            line(json!({"action": "AppendEntry", "ml": ml, "p": [l, e]}))
        };
        let d = |ds: u64, v: Value| {
            let mut v = v;
            v["ds"] = ds.into();
            line(v)
        };
        let lines = vec![
            d(2, json!({"action": "Open", "md": [3, -1], "ranges": []})),
            append(topic, 3, 0),
            append(topic, 3, 1),
            append("other", 9, 5),
            d(
                1,
                json!({"action": "Open", "md": [3, 0], "ranges": [[[3, 0], [3, 1]]]}),
            ),
            line(json!({"action": "ClientReceive", "c": [1, 1], "d": 1, "stale": false})),
            d(2, json!({"action": "Ack", "p": [3, 1]})),
            d(1, json!({"action": "ResetBegin", "epoch": 1})),
            d(2, json!({"action": "MarkDelete", "c": [4, -1]})),
            d(2, json!({"action": "Advance", "md": [4, -1]})),
            // a state whose Open was not recorded is not written
            d(7, json!({"action": "Ack", "p": [3, 0]})),
        ];
        let dir = tempfile::tempdir().unwrap();
        let written = write_deletion_lookup(dir.path(), topic, &lines).unwrap();
        let name = "DeletionLookup@MaxEntry=1,MaxResets=1,MaxIds=4";
        assert_eq!(written, vec![(name.to_string(), 2, 2 + 4)]);
        let file = read_file(dir.path(), name);
        assert_eq!(
            file,
            vec![
                json!({"t": 1, "action": "Open", "md": [3, 0], "ranges": [[[3, 0], [3, 1]]],
                       "layout": [[3, 1], [4, -1]]}),
                json!({"t": 1, "action": "ResetBegin", "epoch": 1}),
                json!({"t": 2, "action": "Open", "md": [3, -1], "ranges": []}),
                json!({"t": 2, "action": "Ack", "p": [3, 1]}),
                json!({"t": 2, "action": "MarkDelete", "c": [4, -1]}),
                json!({"t": 2, "action": "Advance", "md": [4, -1]}),
            ]
        );
    }

    /// A cursor's states across restarts: its `Persist` lines go to the
    /// run of the state joined to it last (a new cursor's first record,
    /// saved before its state exists, right after that state's `Open`); a
    /// state recovered from the store names its predecessor's run in
    /// `pred`; a cursor created anew (a `LedgerCursor` `Open`) starts
    /// without one; other cursors' persists (no state joined) are dropped.
    #[test]
    fn deletion_lookup_links_a_recovered_state_to_its_cursors_previous_state() {
        let topic = crate::sim::node::TOPIC;
        let c = |action: &str, cur: &str, v: Value| {
            let mut v = v;
            v["action"] = action.into();
            v["ml"] = topic.into();
            v["cur"] = cur.into();
            line(v)
        };
        let d = |ds: u64, v: Value| {
            let mut v = v;
            v["ds"] = ds.into();
            line(v)
        };
        let joined = |ds: u64, cur: &str| {
            line(json!({"action": "Cursor", "ds": ds, "ml": topic, "cur": cur}))
        };
        let lines = vec![
            c("Open", "a", json!({"md": [3, -1], "read": [3, 0]})),
            c("Persist", "a", json!({"md": [3, -1], "ranges": []})),
            d(1, json!({"action": "Open", "md": [3, -1], "ranges": []})),
            joined(1, "a"),
            line(json!({"action": "AppendEntry", "ml": topic, "p": [3, 0]})),
            line(json!({"action": "AppendEntry", "ml": topic, "p": [3, 1]})),
            d(1, json!({"action": "Ack", "p": [3, 1]})),
            c(
                "Persist",
                "a",
                json!({"md": [3, -1], "ranges": [[[3, 0], [3, 1]]]}),
            ),
            line(
                json!({"action": "Persist", "ml": "other", "cur": "x", "md": [9, 0], "ranges": []}),
            ),
            // restart: `a` recovered
            c("Recover", "a", json!({"md": [3, -1], "read": [3, 0]})),
            d(
                2,
                json!({"action": "Open", "md": [3, -1], "ranges": [[[3, 0], [3, 1]]]}),
            ),
            joined(2, "a"),
            // `a` deleted and created anew: no predecessor
            c("Open", "a", json!({"md": [3, 1], "read": [4, 0]})),
            c("Persist", "a", json!({"md": [3, 1], "ranges": []})),
            d(3, json!({"action": "Open", "md": [3, 1], "ranges": []})),
            joined(3, "a"),
        ];
        let dir = tempfile::tempdir().unwrap();
        let written = write_deletion_lookup(dir.path(), topic, &lines).unwrap();
        let name = "DeletionLookup@MaxEntry=1,MaxResets=1,MaxIds=3";
        assert_eq!(
            written,
            vec![
                (name.to_string(), 3, 4 + 1 + 2),
                (
                    "DeletionLookup (linked: recovered from a predecessor run)".to_string(),
                    1,
                    0
                ),
            ]
        );
        let file = read_file(dir.path(), name);
        let actions: Vec<(u64, &str)> = file
            .iter()
            .map(|v| (v["t"].as_u64().unwrap(), v["action"].as_str().unwrap()))
            .collect();
        assert_eq!(
            actions,
            [
                (1, "Open"),
                (1, "Persist"),
                (1, "Ack"),
                (1, "Persist"),
                (2, "Open"),
                (3, "Open"),
                (3, "Persist"),
            ]
        );
        assert!(file
            .iter()
            .all(|v| v.get("ml").is_none() && v.get("cur").is_none()));
        assert_eq!(file[3]["ranges"], json!([[[3, 0], [3, 1]]]));
        assert!(file[0].get("pred").is_none());
        assert_eq!(file[4]["pred"], 1);
        assert!(
            file[5].get("pred").is_none(),
            "a new cursor has no predecessor"
        );
    }

    /// A `Cursor` line joining a state that has no run (no `Open` line
    /// recorded for it) is an error: that cursor's recovery would go
    /// unchecked, not fail.
    #[test]
    fn deletion_lookup_refuses_a_cursor_line_naming_a_state_without_a_run() {
        let topic = crate::sim::node::TOPIC;
        let lines = vec![
            line(json!({"action": "Open", "ds": 1, "md": [3, -1], "ranges": []})),
            line(json!({"action": "Cursor", "ds": 7, "ml": topic, "cur": "a"})),
        ];
        let dir = tempfile::tempdir().unwrap();
        let err = write_deletion_lookup(dir.path(), topic, &lines).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("state 7"), "{err}");
    }

    /// A subscription's tracker lines: its first tracker (empty storage) and
    /// the one a restart recovered, in the hooks' terms (ledgers, the
    /// tracker's clock).
    fn bucket_merge_lines() -> Vec<String> {
        let st =
            |clock: u64, index: &[i64], queue: &[i64], mheap: &[i64], buckets: Value, trk: u64| {
                json!({"clock": clock, "index": index, "counter": index.len(), "queue": queue,
                   "mheap": mheap, "buckets": buckets, "trk": trk})
            };
        [
            json!({"action": "Tracker", "trk": 1, "sub": "sub-0"}),
            json!({"action": "Recover", "st": st(0, &[], &[], &[], json!([]), 1)}),
            json!({"action": "Ack", "md": -1, "e": -1, "st": st(0, &[], &[], &[], json!([]), 1)}),
            json!({"action": "Add", "p": 10, "at": 5000, "due": false,
                   "st": st(0, &[10], &[], &[10], json!([]), 1)}),
            json!({"action": "Add", "p": 30, "at": 7000, "due": false,
                   "st": st(0, &[10, 30], &[], &[10, 30], json!([]), 1)}),
            json!({"action": "Seal", "segs": [[10, 30]],
                   "st": st(0, &[10, 30], &[10, 30], &[], json!([[10, 30, 1]]), 1)}),
            json!({"action": "Add", "p": 40, "at": 9000, "due": false,
                   "st": st(1000, &[10, 30, 40], &[10, 30], &[40], json!([[10, 30, 1]]), 1)}),
            json!({"action": "Tracker", "trk": 2, "sub": "sub-0"}),
            json!({"action": "Recover",
                   "st": st(1000, &[10, 30], &[10, 30], &[], json!([[10, 30, 1]]), 2)}),
            json!({"action": "Ack", "md": 20, "e": 0,
                   "st": st(1000, &[30], &[10, 30], &[], json!([[10, 30, 1]]), 2)}),
            json!({"action": "Add", "p": 40, "at": 9000, "due": false,
                   "st": st(1000, &[30, 40], &[10, 30], &[40], json!([[10, 30, 1]]), 2)}),
        ]
        .into_iter()
        .map(line)
        .collect()
    }

    #[test]
    fn bucket_merge_joins_a_subscriptions_trackers_into_one_run_with_dense_positions() {
        let workload = Workload {
            max_entries_per_ledger: 1,
            delayed_tick_ms: 100,
            ..Workload::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let written = write_bucket_merge(dir.path(), &workload, &bucket_merge_lines()).unwrap();
        let name = "BucketMerge@MaxCrashes=1";
        assert_eq!(written, vec![(name.to_string(), 1, 11)]);
        let file = read_file(dir.path(), name);
        let actions: Vec<&str> = file.iter().map(|v| v["action"].as_str().unwrap()).collect();
        // The first tracker's Recover (nothing stored) is not a spec step; the
        // restart's is, followed by the mark-delete it is handed and its
        // re-read. A Tick precedes each line whose clock moved.
        assert_eq!(
            actions,
            ["Init", "Tick", "Ack", "Add", "Add", "Seal", "Tick", "Add", "Recover", "Ack", "Add"]
        );
        assert!(file.iter().all(|v| v["t"] == 1));
        // Ledgers 10, 30, 40 are positions 1, 2, 3; the clock is the cutoff
        // (the tracker's clock + delayed_tick_ms).
        assert_eq!(
            file[0],
            json!({"action": "Init", "ts": [5000, 7000, 9000], "maxT": 1100, "maxIdx": 100, "t": 1})
        );
        assert_eq!(
            (&file[1]["clock"], &file[6]["clock"]),
            (&json!(100), &json!(1100))
        );
        assert_eq!(file[2]["md"], 1);
        assert_eq!(
            (&file[3]["p"], &file[4]["p"], &file[7]["p"]),
            (&json!(1), &json!(2), &json!(3))
        );
        assert_eq!(file[5]["segs"], json!([[1, 2]]));
        assert_eq!(file[5]["st"]["buckets"], json!([[1, 2, 1]]));
        assert_eq!(
            file[8]["st"],
            json!({"clock": 1100, "index": [1, 2], "counter": 2, "queue": [1, 2], "mheap": [],
                   "buckets": [[1, 2, 1]]})
        );
        // Mark-delete (20, 0): the first position above it is ledger 30's.
        assert_eq!(file[9]["md"], 2);
        assert_eq!(file[10]["p"], 3);
        assert_eq!(file[10]["st"]["index"], json!([2, 3]));
    }

    #[test]
    fn bucket_merge_is_dropped_unless_one_entry_per_ledger() {
        let workload = Workload {
            max_entries_per_ledger: 200,
            ..Workload::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let written = write_bucket_merge(dir.path(), &workload, &bucket_merge_lines()).unwrap();
        assert_eq!(
            written,
            vec![(
                "BucketMerge (dropped: max_entries_per_ledger is not 1)".to_string(),
                1,
                0
            )]
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
