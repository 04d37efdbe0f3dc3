//! interop-rust: the Rust Pulsar client magnetar (crates.io `magnetar-driver`)
//! against `pulsar-core serve`, a second real client beside the official
//! Python one (tests/interop).
//!
//! ```text
//! interop-rust run --binary B --workdir W [--scenario plain|txn|txn-ack-probe]
//!                  [--messages N] [--deadline S] [--timeout S] [--no-kill]
//! interop-rust judge W [--scenario plain|txn]     judge a run's W/events.jsonl again
//! interop-rust negative W                         the plain judge against doctored copies of W's log
//! interop-rust negative-txn                       the txn judge against a synthetic log and doctored copies
//! interop-rust serve-bench --binaries LABEL=B[,LABEL=B2] --workdir W --out F.toml
//!                  [--producers 2] [--in-flight 64] [--size 1024] [--consumers 2]
//!                  [--warmup 3] [--secs 10] [--rounds 2] [--disk-secs 1.5] [--command TEXT]
//!                                                 serve's msg/s and SEND->receipt latency against the
//!                                                 disk's fdatasync limit, binaries interleaved (bench.rs)
//! ```
//!
//! Exit status: 0 pass, 1 the judge found violations (or a negative control
//! was not caught), 2 the scenario failed (an error from the client or the
//! broker, printed), 3 the scenario did not finish within `--timeout`
//! (a hang), 64 usage.

mod bench;
mod disk;
mod events;
mod judge;
mod negative;
mod plain;
mod server;
mod txn;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

fn usage(msg: &str) -> ExitCode {
    eprintln!("interop-rust: {msg}\n(see the header of tests/interop-rust/src/main.rs)");
    ExitCode::from(64)
}

struct Args {
    pos: Vec<String>,
    kv: std::collections::HashMap<String, String>,
    flags: Vec<String>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        pos: vec![],
        kv: Default::default(),
        flags: vec![],
    };
    let mut i = 0;
    while i < args.len() {
        let s = &args[i];
        if s == "--no-kill" {
            a.flags.push(s.clone());
        } else if let Some(k) = s.strip_prefix("--") {
            let v = args.get(i + 1).ok_or(format!("{s} needs a value"))?;
            a.kv.insert(k.to_string(), v.clone());
            i += 1;
        } else {
            a.pos.push(s.clone());
        }
        i += 1;
    }
    Ok(a)
}

fn num<T: std::str::FromStr>(a: &Args, k: &str, d: T) -> Result<T, String> {
    match a.kv.get(k) {
        None => Ok(d),
        Some(v) => v.parse().map_err(|_| format!("--{k}: not a number: {v}")),
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse(&argv) {
        Ok(a) => a,
        Err(e) => return usage(&e),
    };
    let scenario =
        a.kv.get("scenario")
            .cloned()
            .unwrap_or_else(|| "plain".into());
    match a.pos.first().map(String::as_str) {
        Some("run") => run(&a, &scenario),
        Some("judge") => match a.pos.get(1) {
            Some(w) => judge_dir(Path::new(w), &scenario),
            None => usage("judge needs the run's workdir"),
        },
        Some("negative") => match a.pos.get(1) {
            Some(w) => match events::read(&Path::new(w).join("events.jsonl"))
                .and_then(|r| Ok((r, frame_lines(Path::new(w))?)))
                .and_then(|(r, f)| negative::plain(&r, &f))
            {
                Ok(0) => {
                    println!("negative controls: every doctored copy caught");
                    ExitCode::SUCCESS
                }
                Ok(n) => {
                    println!("negative controls: {n} NOT caught");
                    ExitCode::from(1)
                }
                Err(e) => {
                    println!("negative controls: {e}");
                    ExitCode::from(1)
                }
            },
            None => usage("negative needs the run's workdir"),
        },
        Some("negative-txn") => match negative::txn() {
            Ok(0) => {
                println!("txn negative controls: every doctored copy caught");
                ExitCode::SUCCESS
            }
            Ok(n) => {
                println!("txn negative controls: {n} NOT caught");
                ExitCode::from(1)
            }
            Err(e) => {
                println!("txn negative controls: {e}");
                ExitCode::from(1)
            }
        },
        Some("serve-bench") => serve_bench(&a),
        _ => usage("expected one of: run, judge, negative, negative-txn, serve-bench"),
    }
}

fn serve_bench(a: &Args) -> ExitCode {
    let (Some(list), Some(workdir), Some(out)) =
        (a.kv.get("binaries"), a.kv.get("workdir"), a.kv.get("out"))
    else {
        return usage("serve-bench needs --binaries, --workdir and --out");
    };
    let mut bins = Vec::new();
    for item in list.split(',').filter(|s| !s.is_empty()) {
        let Some((label, path)) = item.split_once('=') else {
            return usage("--binaries: LABEL=PATH[,LABEL=PATH]");
        };
        bins.push(bench::Binary {
            label: label.to_string(),
            path: PathBuf::from(path),
        });
    }
    if bins.is_empty() {
        return usage("--binaries: no binary");
    }
    let parsed = (|| -> Result<bench::Opts, String> {
        let o = bench::Opts {
            producers: num(a, "producers", 2usize)?,
            in_flight: num(a, "in-flight", 64usize)?,
            size: num(a, "size", 1024usize)?,
            consumers: num(a, "consumers", 2usize)?,
            warmup: Duration::from_secs_f64(num(a, "warmup", 3.0f64)?),
            measure: Duration::from_secs_f64(num(a, "secs", 10.0f64)?),
            rounds: num(a, "rounds", 2usize)?,
            disk_secs: num(a, "disk-secs", 1.5f64)?,
        };
        if o.producers == 0 || o.in_flight == 0 || o.size == 0 || o.rounds == 0 {
            return Err("--producers, --in-flight, --size and --rounds must be above 0".into());
        }
        if o.measure.is_zero() || o.disk_secs.is_nan() || o.disk_secs <= 0.0 {
            return Err("--secs and --disk-secs must be above 0".into());
        }
        Ok(o)
    })();
    let o = match parsed {
        Ok(o) => o,
        Err(e) => return usage(&e),
    };
    let command =
        a.kv.get("command")
            .cloned()
            .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" "));
    match bench::run(&bins, Path::new(workdir), &o, &command, Path::new(out)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("serve-bench: {e}");
            ExitCode::from(2)
        }
    }
}

fn frame_lines(w: &Path) -> Result<Vec<String>, String> {
    let p = w.join("frames.txt");
    std::fs::read_to_string(&p)
        .map(|s| s.lines().map(str::to_string).collect())
        .map_err(|e| format!("{}: {e}", p.display()))
}

fn judge_dir(w: &Path, scenario: &str) -> ExitCode {
    let recs = match events::read(&w.join("events.jsonl")) {
        Ok(r) => r,
        Err(e) => {
            println!("judge: {e}");
            return ExitCode::from(1);
        }
    };
    let mut v = if scenario == "txn" {
        judge::txn(&recs)
    } else {
        judge::plain(&recs)
    };
    match frame_lines(w) {
        Ok(lines) => v.fails.extend(judge::frames(&lines)),
        Err(e) => v.fails.push(("frames".into(), e)),
    }
    print!("{}", v.table);
    let _ = std::fs::write(w.join("table.md"), &v.table);
    v.print();
    if v.fails.is_empty() {
        println!(
            "judge ({scenario}): every check holds ({} records)",
            recs.len()
        );
        ExitCode::SUCCESS
    } else {
        println!("judge ({scenario}): {} violations", v.fails.len());
        ExitCode::from(1)
    }
}

fn run(a: &Args, scenario: &str) -> ExitCode {
    let (Some(binary), Some(workdir)) = (a.kv.get("binary"), a.kv.get("workdir")) else {
        return usage("run needs --binary and --workdir");
    };
    let (messages, deadline, total) = match (
        num(a, "messages", 500u32),
        num(a, "deadline", 60u64),
        num(a, "timeout", 180u64),
    ) {
        (Ok(m), Ok(d), Ok(t)) => (m, d, t),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return usage(&e),
    };
    let workdir = PathBuf::from(workdir);
    if let Err(e) = std::fs::create_dir_all(&workdir) {
        println!("{}: {e}", workdir.display());
        return ExitCode::from(2);
    }
    let log = match events::Log::create(&workdir.join("events.jsonl")) {
        Ok(l) => Arc::new(l),
        Err(e) => {
            println!("events.jsonl: {e}");
            return ExitCode::from(2);
        }
    };
    let port = match a.kv.get("port").map(|p| p.parse::<u16>()) {
        Some(Ok(p)) => p,
        Some(Err(_)) => return usage("--port: not a port"),
        None => match server::free_port() {
            Ok(p) => p,
            Err(e) => {
                println!("no free port: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let mut srv = server::Server::new(Path::new(binary), &workdir, port);
    if let Err(e) = srv.start() {
        println!("{e}");
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            println!("tokio runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = plain::Opts {
        messages,
        deadline: Duration::from_secs(deadline),
        kill: !a.flags.iter().any(|f| f == "--no-kill"),
    };
    let t0 = std::time::Instant::now();
    let result = rt.block_on(async {
        let fut = async {
            match scenario {
                "plain" => plain::run(&mut srv, Arc::clone(&log), &opts).await,
                "txn" => txn::run(&mut srv, Arc::clone(&log)).await,
                "txn-ack-probe" => txn::ack_probe(&srv, Arc::clone(&log)).await.map(|s| {
                    println!("{s}");
                }),
                other => Err(format!("unknown scenario {other}")),
            }
        };
        tokio::time::timeout(Duration::from_secs(total), fut).await
    });
    // No exit path leaves serve running (Drop kills it too).
    srv.kill9();
    // The client's background tasks are not waited for.
    rt.shutdown_timeout(Duration::from_secs(2));
    let secs = t0.elapsed().as_secs_f64();
    match result {
        Err(_) => {
            println!("HANG: the {scenario} scenario did not finish within {total} s (--timeout); events: {}", workdir.join("events.jsonl").display());
            ExitCode::from(3)
        }
        Ok(Err(e)) => {
            println!("{scenario} scenario: {e}");
            println!(
                "(after {secs:.1} s; events: {})",
                workdir.join("events.jsonl").display()
            );
            ExitCode::from(2)
        }
        Ok(Ok(())) => {
            println!("{scenario} scenario finished in {secs:.1} s");
            if scenario == "txn-ack-probe" {
                ExitCode::SUCCESS
            } else {
                judge_dir(&workdir, scenario)
            }
        }
    }
}
