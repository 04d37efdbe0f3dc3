//! The disk's own limit, measured beside `serve`'s store: a loop of one
//! sequential write of N KiB followed by `fdatasync` (`File::sync_data`, the
//! call redb makes at a durable commit), for the batch sizes a group commit
//! would write. A file filled and synced beforehand is overwritten in order
//! (`overwrite`: no file-size change, so the sync flushes data only: the
//! fastest the disk allows, the bar the benchmark compares `serve` with);
//! one row appends 1 KiB to a growing file (`append`: the sync also commits
//! the new size in the file system's journal), for reference.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Size of the prefilled file the `overwrite` rows cycle through.
const REGION: u64 = 32 * 1024 * 1024;
/// At most this many write + sync rounds per row (a very fast disk ends the
/// row before its time).
const MAX_OPS: u64 = 200_000;

/// One batch size's write + fdatasync loop.
#[derive(Clone, Debug)]
pub struct Row {
    /// `overwrite` (prefilled file) or `append` (growing file).
    pub mode: &'static str,
    pub kib: usize,
    pub ops: u64,
    pub secs: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub load_1m: f64,
}

/// `q` (0..=1) of sorted samples, nearest rank.
pub fn quantile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    f64::from(sorted[rank - 1])
}

/// The 1-minute load average (`/proc/loadavg`), NaN where unreadable.
pub fn load_1m() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn row(mode: &'static str, kib: usize, mut lat: Vec<u32>, elapsed: Duration, load: f64) -> Row {
    let ops = lat.len() as u64;
    let secs = elapsed.as_secs_f64();
    lat.sort_unstable();
    Row {
        mode,
        kib,
        ops,
        secs,
        mean_us: secs * 1e6 / ops.max(1) as f64,
        p50_us: quantile(&lat, 0.50),
        p99_us: quantile(&lat, 0.99),
        load_1m: load,
    }
}

fn timed_loop(
    secs: f64,
    mut op: impl FnMut(u64) -> std::io::Result<()>,
) -> Result<(Vec<u32>, Duration), String> {
    let mut lat = Vec::new();
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(secs);
    let mut i = 0u64;
    while Instant::now() < until && i < MAX_OPS {
        let t = Instant::now();
        op(i).map_err(|e| format!("disk probe: {e}"))?;
        lat.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
        i += 1;
    }
    Ok((lat, t0.elapsed()))
}

/// Measures every size in `kibs` (overwrite), then 1 KiB appends, `secs`
/// each, in files under `dir` that are removed afterwards.
pub fn probe(dir: &Path, kibs: &[usize], secs: f64) -> Result<Vec<Row>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("disk-probe.bin");
    let result = probe_in(&path, kibs, secs);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(path.with_extension("append"));
    result
}

fn probe_in(path: &Path, kibs: &[usize], secs: f64) -> Result<Vec<Row>, String> {
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut f: File = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .map_err(err)?;
    let mib = vec![0u8; 1024 * 1024];
    for _ in 0..REGION / (1024 * 1024) {
        f.write_all(&mib).map_err(err)?;
    }
    f.sync_all().map_err(err)?;
    let mut rows = Vec::new();
    for &kib in kibs {
        let buf = vec![0x5au8; kib * 1024];
        let len = buf.len() as u64;
        let slots = (REGION / len).max(1);
        let load = load_1m();
        let (lat, el) = timed_loop(secs, |i| {
            f.write_all_at(&buf, (i % slots) * len)?;
            f.sync_data()
        })?;
        rows.push(row("overwrite", kib, lat, el, load));
    }
    let apath = path.with_extension("append");
    let mut a = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&apath)
        .map_err(|e| format!("{}: {e}", apath.display()))?;
    let buf = vec![0x5au8; 1024];
    let load = load_1m();
    let (lat, el) = timed_loop(secs, |_| {
        a.write_all(&buf)?;
        a.sync_data()
    })?;
    rows.push(row("append", 1, lat, el, load));
    Ok(rows)
}
