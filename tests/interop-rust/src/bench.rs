//! `interop-rust serve-bench`: `pulsar-core serve` under a real client
//! (magnetar), measured against the disk's own limit in the same run.
//!
//! Load: P producers (one client, so one connection, each) keep the
//! in-flight total of SENDs outstanding between them (64 by default: 32
//! each), 1 KiB messages, no client-side batching, each send answered by
//! its durable SEND_RECEIPT; C consumers on one Shared subscription
//! acknowledge every message (grouped every 100 ms, as the Java client's
//! default `acknowledgmentGroupTime`). After a warm-up, a window of
//! `--secs`: receipts and receives completed in it give msg/s produced and
//! consumed; every send started in it gives one SEND → receipt latency.
//!
//! Disk: right before every serve run, [`crate::disk::probe`] in the data
//! directory that serve then gets (its file removed before serve starts):
//! write N KiB + fdatasync in a loop for 1, 4, 16 KiB and the in-flight
//! batch (64 KiB), and 1 KiB appends. The ratios of a serve run use the
//! rows of its own probe (a shared disk's sync cost moves by the minute): the disk's group-commit limit is
//! `in-flight / mean(write batch + fdatasync)` msg/s (every sync carrying
//! the whole in-flight batch), one small fsync is the 1 KiB row's mean
//! (its p50 and p99 are reported beside it).
//!
//! Rounds interleave the binaries (A B A B), each serve on a fresh data
//! dir; the 1-minute load average is recorded with every measurement.

use crate::disk::{self, load_1m, quantile};
use crate::plain;
use crate::server::{free_port, Server};
use magnetar::proto::pb::command_subscribe::{InitialPosition, SubType};
use magnetar::OutgoingMessage;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{Barrier, Semaphore};
use tokio::time::timeout;

const OP: Duration = Duration::from_secs(15);
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// After the window: how long consumers may take to receive what was sent.
const DRAIN: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct Opts {
    pub producers: usize,
    /// SENDs outstanding at once, over all producers.
    pub in_flight: usize,
    pub size: usize,
    pub consumers: usize,
    pub warmup: Duration,
    pub measure: Duration,
    pub rounds: usize,
    pub disk_secs: f64,
}

impl Opts {
    /// KiB the in-flight batch holds (what one group commit would write).
    fn batch_kib(&self) -> usize {
        (self.in_flight * self.size).div_ceil(1024).max(1)
    }
}

pub struct Binary {
    pub label: String,
    pub path: PathBuf,
}

#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
}

impl Window {
    fn contains(&self, t: Instant) -> bool {
        t >= self.start && t < self.end
    }
}

#[derive(Default)]
struct Stats {
    /// SEND → receipt of every send started in the window, µs.
    lat_us: Mutex<Vec<u32>>,
    receipts_in_window: AtomicU64,
    receipts: AtomicU64,
    send_errors: AtomicU64,
    received_in_window: AtomicU64,
    received: AtomicU64,
    receive_errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// Fixed once every consumer is subscribed, before the first send.
    window: OnceLock<Window>,
}

impl Stats {
    fn error(&self, e: String) {
        let mut g = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert(e);
    }
}

/// One serve run's numbers.
#[derive(Clone, Debug)]
pub struct Run {
    pub round: usize,
    /// Index of the disk probe taken right before this run.
    pub probe: usize,
    pub label: String,
    pub produced_msg_s: f64,
    pub consumed_msg_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub receipts: u64,
    pub send_errors: u64,
    pub received: u64,
    pub receive_errors: u64,
    pub serve_cpu_s: f64,
    pub client_cpu_s: f64,
    pub load_before: f64,
    pub load_after: f64,
    pub first_error: Option<String>,
}

/// utime + stime of a process in seconds (`/proc/PID/stat`, clock ticks of
/// 1/100 s, Linux's USER_HZ).
fn cpu_s(pid: &str) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // Fields after the parenthesised command name: state is field 3,
    // utime 14, stime 15.
    let Some(rest) = s.rfind(')').map(|i| &s[i + 2..]) else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    match (tick(11), tick(12)) {
        (Some(u), Some(s)) => (u + s) / 100.0,
        _ => f64::NAN,
    }
}

async fn producer(
    url: String,
    topic: String,
    i: usize,
    in_flight: usize,
    size: usize,
    w: Window,
    st: Arc<Stats>,
) -> Result<(), String> {
    let client = plain::client(&url, OP).await?;
    let producer = client
        .producer(&topic)
        .name(format!("bench-p{i}"))
        .send_timeout(SEND_TIMEOUT)
        .create()
        .await
        .map_err(|e| format!("producer {i}: {e}"))?;
    let sem = Arc::new(Semaphore::new(in_flight));
    let mut seq = 0u64;
    while Instant::now() < w.end {
        let permit = Arc::clone(&sem)
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let mut body = vec![0u8; size];
        let tag = seq.to_be_bytes();
        let n = tag.len().min(body.len());
        body[..n].copy_from_slice(&tag[..n]);
        seq += 1;
        let sent = Instant::now();
        let f = OutgoingMessage::with_payload(body).send(&producer);
        let st = Arc::clone(&st);
        tokio::spawn(async move {
            let r = timeout(SEND_TIMEOUT, f).await;
            let done = Instant::now();
            drop(permit);
            match r {
                Ok(Ok(_)) => {
                    st.receipts.fetch_add(1, Ordering::Relaxed);
                    if w.contains(done) {
                        st.receipts_in_window.fetch_add(1, Ordering::Relaxed);
                    }
                    if w.contains(sent) {
                        let us = u32::try_from(done.duration_since(sent).as_micros())
                            .unwrap_or(u32::MAX);
                        st.lat_us.lock().unwrap_or_else(|p| p.into_inner()).push(us);
                    }
                }
                Ok(Err(e)) => {
                    st.send_errors.fetch_add(1, Ordering::Relaxed);
                    st.error(format!("send: {e}"));
                }
                Err(_) => {
                    st.send_errors.fetch_add(1, Ordering::Relaxed);
                    st.error(format!("send: no receipt within {SEND_TIMEOUT:?}"));
                }
            }
        });
    }
    // Every send answered (each task holds a permit until its receipt).
    let all = u32::try_from(in_flight).unwrap_or(u32::MAX);
    let drained = timeout(SEND_TIMEOUT + Duration::from_secs(5), sem.acquire_many(all)).await;
    let _ = timeout(Duration::from_secs(5), producer.close()).await;
    let _ = timeout(Duration::from_secs(5), client.close()).await;
    match drained {
        Ok(Ok(_)) => Ok(()),
        _ => Err(format!(
            "producer {i}: sends still unanswered after the window"
        )),
    }
}

async fn consumer(
    url: String,
    topic: String,
    i: usize,
    st: Arc<Stats>,
    ready: Arc<Barrier>,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let client = plain::client(&url, OP).await?;
    let c = client
        .consumer(&topic)
        .subscription("bench")
        .subscription_type(SubType::Shared)
        .name(format!("bench-c{i}"))
        .initial_position(InitialPosition::Earliest)
        .receiver_queue_size(1000)
        .ack_group_time(Duration::from_millis(100))
        .subscribe()
        .await
        .map_err(|e| format!("consumer {i}: subscribe: {e}"))?;
    ready.wait().await;
    while !stop.load(Ordering::Acquire) {
        match c.receive_with_timeout(Duration::from_millis(200)).await {
            Ok(Some(m)) => {
                let now = Instant::now();
                st.received.fetch_add(1, Ordering::Relaxed);
                if st.window.get().is_some_and(|w| w.contains(now)) {
                    st.received_in_window.fetch_add(1, Ordering::Relaxed);
                }
                c.ack_grouped(m.message_id);
            }
            Ok(None) => {}
            Err(e) => {
                st.receive_errors.fetch_add(1, Ordering::Relaxed);
                st.error(format!("receive: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let _ = timeout(Duration::from_secs(5), c.close()).await;
    let _ = timeout(Duration::from_secs(5), client.close()).await;
    Ok(())
}

/// Drives one serve at `url` (process `pid`) through warm-up and window.
async fn load(url: String, pid: String, o: Opts) -> Result<Run, String> {
    let topic = "persistent://public/default/serve-bench".to_string();
    let st = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(o.consumers + 1));
    let mut consumers = Vec::new();
    for i in 0..o.consumers {
        consumers.push(tokio::spawn(consumer(
            url.clone(),
            topic.clone(),
            i,
            Arc::clone(&st),
            Arc::clone(&ready),
            Arc::clone(&stop),
        )));
    }
    timeout(Duration::from_secs(30), ready.wait())
        .await
        .map_err(|_| "consumers did not subscribe within 30 s".to_string())?;
    let t0 = Instant::now();
    let w = Window {
        start: t0 + o.warmup,
        end: t0 + o.warmup + o.measure,
    };
    let _ = st.window.set(w);
    let per = o.in_flight.div_ceil(o.producers.max(1)).max(1);
    let mut producers = Vec::new();
    for i in 0..o.producers {
        producers.push(tokio::spawn(producer(
            url.clone(),
            topic.clone(),
            i,
            per,
            o.size,
            w,
            Arc::clone(&st),
        )));
    }
    tokio::time::sleep_until(w.start.into()).await;
    let (serve0, client0, load_before) = (cpu_s(&pid), cpu_s("self"), load_1m());
    tokio::time::sleep_until(w.end.into()).await;
    let (serve1, client1, load_after) = (cpu_s(&pid), cpu_s("self"), load_1m());
    let mut err = None;
    for (i, h) in producers.into_iter().enumerate() {
        match timeout(SEND_TIMEOUT + Duration::from_secs(20), h).await {
            Err(_) => err = Some(format!("HANG: producer {i} did not finish")),
            Ok(Err(e)) => err = Some(format!("producer {i} task: {e}")),
            Ok(Ok(Err(e))) => err = Some(e),
            Ok(Ok(Ok(()))) => {}
        }
    }
    let until = Instant::now() + DRAIN;
    while Instant::now() < until
        && st.received.load(Ordering::Relaxed) < st.receipts.load(Ordering::Relaxed)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Release);
    for (i, h) in consumers.into_iter().enumerate() {
        match timeout(Duration::from_secs(20), h).await {
            Err(_) => err = err.or(Some(format!("HANG: consumer {i} did not stop"))),
            Ok(Err(e)) => err = err.or(Some(format!("consumer {i} task: {e}"))),
            Ok(Ok(Err(e))) => err = err.or(Some(e)),
            Ok(Ok(Ok(()))) => {}
        }
    }
    if let Some(e) = err {
        return Err(e);
    }
    let first_error = st
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut lat = std::mem::take(&mut *st.lat_us.lock().unwrap_or_else(|p| p.into_inner()));
    if lat.is_empty() {
        return Err(format!(
            "no send started in the window was answered (first error: {first_error:?})"
        ));
    }
    lat.sort_unstable();
    let secs = o.measure.as_secs_f64();
    Ok(Run {
        round: 0,
        probe: 0,
        label: String::new(),
        produced_msg_s: st.receipts_in_window.load(Ordering::Relaxed) as f64 / secs,
        consumed_msg_s: st.received_in_window.load(Ordering::Relaxed) as f64 / secs,
        p50_ms: quantile(&lat, 0.50) / 1000.0,
        p99_ms: quantile(&lat, 0.99) / 1000.0,
        max_ms: quantile(&lat, 1.0) / 1000.0,
        receipts: st.receipts.load(Ordering::Relaxed),
        send_errors: st.send_errors.load(Ordering::Relaxed),
        received: st.received.load(Ordering::Relaxed),
        receive_errors: st.receive_errors.load(Ordering::Relaxed),
        serve_cpu_s: serve1 - serve0,
        client_cpu_s: client1 - client0,
        load_before,
        load_after,
        first_error,
    })
}

/// One serve of `bin` on a fresh data dir under `dir`, driven by [`load`].
fn serve_run(
    rt: &tokio::runtime::Runtime,
    bin: &Binary,
    dir: &Path,
    o: &Opts,
) -> Result<Run, String> {
    let _ = std::fs::remove_dir_all(dir.join("data"));
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let port = free_port().map_err(|e| format!("no free port: {e}"))?;
    let mut srv = Server::new(&bin.path, dir, port).unrecorded();
    srv.start()?;
    let pid = srv.pid().map(|p| p.to_string()).unwrap_or_default();
    // Warm-up + window + the producers' last receipts + drain + closing.
    let bound = o.warmup + o.measure + SEND_TIMEOUT + DRAIN + Duration::from_secs(60);
    let r = rt.block_on(async { timeout(bound, load(srv.url(), pid, o.clone())).await });
    let stopped = srv.stop();
    let _ = std::fs::remove_dir_all(dir.join("data"));
    let mut run = match r {
        Err(_) => return Err(format!("HANG: the load did not finish within {bound:?}")),
        Ok(r) => r?,
    };
    match stopped {
        Ok(0) => {}
        Ok(rc) => {
            return Err(format!(
                "serve exited {rc} at SIGTERM (log in {})",
                dir.display()
            ))
        }
        Err(e) => return Err(e),
    }
    run.label = bin.label.clone();
    Ok(run)
}

fn first_line(path: &str, key: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    })
}

/// CPU model, cores, kernel, and the file system `dir` lives on.
fn machine(dir: &Path) -> String {
    let cpu = first_line("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let canon = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut fs = String::from("unknown file system");
    let mut best = 0;
    if let Ok(m) = std::fs::read_to_string("/proc/mounts") {
        for l in m.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() >= 3 && canon.starts_with(f[1]) && f[1].len() >= best {
                best = f[1].len();
                fs = format!("{} on {} ({})", f[2], f[0], f[1]);
            }
        }
    }
    format!("{cpu}, {cores} cores (shared with other builds), Linux {kernel}, data dir on {fs}")
}

fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (mut s, mut n) = (0.0, 0.0);
    for x in v {
        s += x;
        n += 1.0;
    }
    if n > 0.0 {
        s / n
    } else {
        f64::NAN
    }
}

/// A run's two bars, from the rows of its disk probe.
#[derive(Clone, Copy)]
struct Bars {
    /// `in_flight` / mean(write of the in-flight batch + fdatasync), msg/s.
    limit_msg_s: f64,
    /// One small fsync (1 KiB write + fdatasync): mean, p50, p99, ms.
    fsync_mean_ms: f64,
    fsync_p50_ms: f64,
    fsync_p99_ms: f64,
}

fn bars(rows: &[disk::Row], o: &Opts) -> Bars {
    let kib = o.batch_kib();
    let find = |k: usize| rows.iter().find(|r| r.mode == "overwrite" && r.kib == k);
    let small = find(1);
    Bars {
        limit_msg_s: find(kib).map_or(f64::NAN, |r| o.in_flight as f64 * 1e6 / r.mean_us),
        fsync_mean_ms: small.map_or(f64::NAN, |r| r.mean_us / 1000.0),
        fsync_p50_ms: small.map_or(f64::NAN, |r| r.p50_us / 1000.0),
        fsync_p99_ms: small.map_or(f64::NAN, |r| r.p99_us / 1000.0),
    }
}

const NO_BARS: Bars = Bars {
    limit_msg_s: f64::NAN,
    fsync_mean_ms: f64::NAN,
    fsync_p50_ms: f64::NAN,
    fsync_p99_ms: f64::NAN,
};

/// Every round (disk probe, then each binary), written as TOML to `out`.
pub fn run(
    bins: &[Binary],
    workdir: &Path,
    o: &Opts,
    command: &str,
    out: &Path,
) -> Result<(), String> {
    std::fs::create_dir_all(workdir).map_err(|e| format!("{}: {e}", workdir.display()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let mut kibs = vec![1, 4, 16, o.batch_kib()];
    kibs.sort_unstable();
    kibs.dedup();
    let date = utc_now();
    // One disk probe right before every serve run, in the data dir that
    // serve then gets: (round, the run's label, rows).
    let mut disks: Vec<(usize, String, Vec<disk::Row>)> = Vec::new();
    let mut runs: Vec<Run> = Vec::new();
    for round in 1..=o.rounds {
        for bin in bins {
            let dir = workdir.join(format!("r{round}-{}", bin.label));
            let rows = disk::probe(&dir.join("data"), &kibs, o.disk_secs)?;
            for r in &rows {
                println!(
                    "round {round} disk {} {:>3} KiB + fdatasync: {:>6} ops, mean {:.0} us, p50 {:.0} us, p99 {:.0} us (load {:.1})",
                    r.mode, r.kib, r.ops, r.mean_us, r.p50_us, r.p99_us, r.load_1m
                );
            }
            let b = bars(&rows, o);
            let (limit, fsync) = (b.limit_msg_s, b.fsync_mean_ms);
            println!(
                "round {round} disk: group-commit limit {limit:.0} msg/s at {} in flight, one small fsync {fsync:.2} ms mean ({:.2} ms p50, {:.2} ms p99)",
                o.in_flight, b.fsync_p50_ms, b.fsync_p99_ms
            );
            disks.push((round, bin.label.clone(), rows));
            let mut r = serve_run(&rt, bin, &dir, o)
                .map_err(|e| format!("{} round {round}: {e}", bin.label))?;
            r.round = round;
            r.probe = disks.len() - 1;
            println!(
                "round {round} {}: produced {:.0} msg/s, consumed {:.0} msg/s, SEND->receipt p50 {:.2} ms p99 {:.2} ms max {:.1} ms; {:.2} x disk limit, p99 {:.1} x fsync; serve CPU {:.1} s, client CPU {:.1} s, load {:.1}->{:.1}",
                r.label, r.produced_msg_s, r.consumed_msg_s, r.p50_ms, r.p99_ms, r.max_ms,
                r.produced_msg_s / limit, r.p99_ms / fsync, r.serve_cpu_s, r.client_cpu_s,
                r.load_before, r.load_after
            );
            runs.push(r);
        }
    }
    rt.shutdown_timeout(Duration::from_secs(2));
    let toml = report(bins, workdir, o, command, &date, &disks, &runs);
    if let Some(d) = out.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    std::fs::write(out, toml).map_err(|e| format!("{}: {e}", out.display()))?;
    println!("serve-bench: wrote {}", out.display());
    Ok(())
}

fn report(
    bins: &[Binary],
    workdir: &Path,
    o: &Opts,
    command: &str,
    date: &str,
    disks: &[(usize, String, Vec<disk::Row>)],
    runs: &[Run],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "what = \"pulsar-core serve under a real client (magnetar 1.7.4), against the disk's own limit measured in the same run\""
    );
    let _ = writeln!(s, "machine = {:?}", machine(workdir));
    let _ = writeln!(s, "date = {date:?}");
    let _ = writeln!(s, "command = {command:?}");
    let _ = writeln!(
        s,
        "method = \"\"\"\n{} producers (one connection each) keep {} SENDs in flight between them, {}-byte messages, \
no client batching, durable SEND_RECEIPTs; {} consumers on one Shared subscription ack every message \
(grouped every 100 ms). {} s warm-up, then a {} s window: msg/s = receipts (receives) completed in it; \
latency = SEND -> receipt of every send started in it. Right before every serve run the disk is measured in the data \
dir that serve then gets: write N KiB + fdatasync in a loop ({} s per size; `overwrite` = a \
prefilled file rewritten in order, `append` = a growing file). group_commit_limit_msg_s = {} / mean \
time of one {} KiB write + fdatasync (every sync carrying the whole in-flight batch); one small fsync = \
the 1 KiB row: its mean is the bar (on this shared virtual disk a sync is bimodal, tens of µs when \
the host absorbs it, milliseconds when other writers queue ahead, so the p50 alone understates what \
a durable write costs), its p50 and p99 are kept beside it. Ratios of a run use the disk probe taken right before it. Rounds interleave the binaries; \
every serve starts on a fresh data dir. CPU seconds are those spent in the window; load_1m is \
/proc/loadavg's first field.\n\"\"\"",
        o.producers,
        o.in_flight,
        o.size,
        o.consumers,
        o.warmup.as_secs_f64(),
        o.measure.as_secs_f64(),
        o.disk_secs,
        o.in_flight,
        o.batch_kib()
    );
    let _ = writeln!(s, "goal = \"produced >= 0.5 x group_commit_limit_msg_s with {} in flight; p99 <= 3 x fsync_mean_ms (issue 36)\"", o.in_flight);
    let _ = writeln!(s);
    let _ = writeln!(s, "[params]");
    let _ = writeln!(s, "producers = {}", o.producers);
    let _ = writeln!(s, "in_flight = {}", o.in_flight);
    let _ = writeln!(s, "message_bytes = {}", o.size);
    let _ = writeln!(s, "consumers = {}", o.consumers);
    let _ = writeln!(s, "warmup_s = {}", o.warmup.as_secs_f64());
    let _ = writeln!(s, "window_s = {}", o.measure.as_secs_f64());
    let _ = writeln!(s, "rounds = {}", o.rounds);
    let _ = writeln!(s, "disk_s_per_size = {}", o.disk_secs);
    for b in bins {
        let _ = writeln!(
            s,
            "\n[[binary]]\nlabel = {:?}\npath = {:?}",
            b.label,
            b.path.display().to_string()
        );
    }
    for (round, label, rows) in disks {
        let b = bars(rows, o);
        let _ = writeln!(
            s,
            "\n[[disk_probe]] # right before the serve run of this round and label\nround = {round}\nbefore = {label:?}\ngroup_commit_limit_msg_s = {:.0}\nfsync_mean_ms = {:.3}\nfsync_p50_ms = {:.3}\nfsync_p99_ms = {:.3}",
            b.limit_msg_s, b.fsync_mean_ms, b.fsync_p50_ms, b.fsync_p99_ms
        );
        for r in rows {
            let _ = writeln!(
                s,
                "\n[[disk]]\nround = {round}\nbefore = {label:?}\nmode = {:?}\nkib = {}\nops = {}\nsecs = {:.2}\nmean_us = {:.0}\np50_us = {:.0}\np99_us = {:.0}\nmsg_s_if_each_sync_carried_the_batch = {:.0}\nload_1m = {:.2}",
                r.mode,
                r.kib,
                r.ops,
                r.secs,
                r.mean_us,
                r.p50_us,
                r.p99_us,
                r.kib as f64 * 1024.0 / o.size as f64 * 1e6 / r.mean_us,
                r.load_1m
            );
        }
    }
    for r in runs {
        let b = disks
            .get(r.probe)
            .map_or(NO_BARS, |(_, _, rows)| bars(rows, o));
        let _ = writeln!(
            s,
            "\n[[run]]\nround = {}\nlabel = {:?}\nproduced_msg_s = {:.0}\nconsumed_msg_s = {:.0}\np50_ms = {:.3}\np99_ms = {:.3}\nmax_ms = {:.3}\nreceipts = {}\nsend_errors = {}\nreceived = {}\nreceive_errors = {}\nserve_cpu_s = {:.2}\nclient_cpu_s = {:.2}\nload_1m_before = {:.2}\nload_1m_after = {:.2}\nvs_group_commit_limit = {:.3}\np99_vs_fsync_mean = {:.2}\np99_vs_fsync_p99 = {:.2}",
            r.round,
            r.label,
            r.produced_msg_s,
            r.consumed_msg_s,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.receipts,
            r.send_errors,
            r.received,
            r.receive_errors,
            r.serve_cpu_s,
            r.client_cpu_s,
            r.load_before,
            r.load_after,
            r.produced_msg_s / b.limit_msg_s,
            r.p99_ms / b.fsync_mean_ms,
            r.p99_ms / b.fsync_p99_ms
        );
        if let Some(e) = &r.first_error {
            let _ = writeln!(s, "first_error = {e:?}");
        }
    }
    let mut base: Option<(f64, f64)> = None;
    for b in bins {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.label == b.label).collect();
        let bars_of = |r: &Run| {
            disks
                .get(r.probe)
                .map_or(NO_BARS, |(_, _, rows)| bars(rows, o))
        };
        let produced = mean(mine.iter().map(|r| r.produced_msg_s));
        let p99 = mean(mine.iter().map(|r| r.p99_ms));
        let vs_limit = mean(
            mine.iter()
                .map(|r| r.produced_msg_s / bars_of(r).limit_msg_s),
        );
        let vs_fsync = mean(mine.iter().map(|r| r.p99_ms / bars_of(r).fsync_mean_ms));
        let _ = writeln!(
            s,
            "\n[[summary]] # means over the label's rounds\nlabel = {:?}\nproduced_msg_s = {produced:.0}\nconsumed_msg_s = {:.0}\np50_ms = {:.3}\np99_ms = {p99:.3}\nvs_group_commit_limit = {vs_limit:.3}\np99_vs_fsync_mean = {vs_fsync:.2}\nthroughput_goal_met = {}\nlatency_goal_met = {}",
            b.label,
            mean(mine.iter().map(|r| r.consumed_msg_s)),
            mean(mine.iter().map(|r| r.p50_ms)),
            vs_limit >= 0.5,
            vs_fsync <= 3.0
        );
        match base {
            None => base = Some((produced, p99)),
            Some((bp, bl)) => {
                let _ = writeln!(
                    s,
                    "produced_vs_{0} = {1:.2}\np99_vs_{0} = {2:.2}",
                    bins[0]
                        .label
                        .replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
                    produced / bp,
                    p99 / bl
                );
            }
        }
    }
    s
}
