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
//!
//! The simulator's network is what the spec's channels describe: frames a
//! connection carries arrive in order (one latency per direction), the
//! broker reads the client's frames as they are written, and a closed
//! connection's frames never arrive (the broker removes its consumers:
//! the spec's `BrokerWriteFailure`, recorded as such).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};

use super::Workload;

/// The spec file names and the actions of each (the hook lines' `action`).
const PERMITS: &str = "PermitConservation";

/// Writes the trace files of one run's `lines` (in recording order) to
/// `dir` (created if missing) and returns, per file written, its name,
/// runs and lines.
///
/// # Errors
/// The directory or a file cannot be written.
pub fn write(
    dir: &Path,
    workload: &Workload,
    lines: &[String],
) -> std::io::Result<Vec<(String, usize, usize)>> {
    std::fs::create_dir_all(dir)?;
    let mut permits: BTreeMap<(u64, u64), Vec<Value>> = BTreeMap::new();
    let mut order: Vec<(u64, u64)> = Vec::new();
    for l in lines {
        let Ok(v) = serde_json::from_str::<Value>(l) else {
            continue;
        };
        if let Some(c) = v.get("c").and_then(Value::as_array) {
            let key = (
                c.first().and_then(Value::as_u64).unwrap_or(0),
                c.get(1).and_then(Value::as_u64).unwrap_or(0),
            );
            let run = permits.entry(key).or_insert_with(|| {
                order.push(key);
                Vec::new()
            });
            run.push(v);
        }
    }
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
            let mut head = init.clone();
            head["t"] = Value::from(t + 1);
            writeln!(out, "{head}")?;
            for mut v in permits.remove(key).unwrap_or_default() {
                v["t"] = Value::from(t + 1);
                writeln!(out, "{v}")?;
                steps += 1;
            }
        }
        out.flush()?;
        written.push((PERMITS.to_string(), order.len(), steps + order.len()));
    }
    Ok(written)
}
