//! `pulsar-core` command-line interface.
//!
//! General behaviour of every subcommand: log lines (the components' WARN /
//! ERROR, or what `RUST_LOG` selects) and progress go to stderr, results to
//! stdout; a result that cannot be written to stdout (closed pipe, full disk)
//! is exit code 2, not a panic.

mod allocator;
mod data_dir;
mod progress;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use pulsar_core::ledger::SyncMode;

mod inspect;
mod serve;
mod swarm;
mod verify;
use pulsar_core::sim::{self, SimOptions, Workload};

use data_dir::DataDir;
use progress::Progress;

/// Exit codes, as `--help` states them.
const EXIT_CODES: &str = "\
Exit codes:
  0  the run completed and the checker found no violation
  1  the run completed and the checker found at least one violation (see the report)
  2  the run could not be carried out or reported: bad arguments, a bad or empty
     workload file, an unusable data dir, a store or component failure, or the
     report could not be written to stdout
  130  interrupted (Ctrl-C / SIGTERM); stderr says whether the data dir was kept

Logging: RUST_LOG selects log lines on stderr (default: errors only; RUST_LOG=warn
adds the components' reactions to injected faults, RUST_LOG=pulsar_core=debug more).
Progress: a bar on a terminal, otherwise a plain line on stderr every 10 s.";

/// Model-checked Rust implementations of Apache Pulsar's bucket delayed
/// delivery, pending-ack replay, PIP-491 permit accounting and the lock-free
/// read-scheduling check.
#[derive(Parser, Debug)]
#[command(name = "pulsar-core", version, about, long_about = None, arg_required_else_help = true, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a seeded, fault-injected, end-to-end simulation of all four
    /// components on the durable store and report loss, duplicates, disorder
    /// and stalls. Exits non-zero on any violation.
    #[command(after_help = EXIT_CODES)]
    Simulate(SimulateArgs),
    /// Decode Pulsar artifacts (frames, commands, entry payloads, bucket
    /// snapshots, pending-ack log entries, roaring bitmaps) or a kept data
    /// dir (opened read-only) to text or JSON.
    Inspect(inspect::InspectArgs),
    /// Check a kept data dir's invariants (opened read-only); exits 1 with
    /// the list of violations.
    Verify(verify::VerifyArgs),
    /// Swarm testing: many small seeded simulate runs, each with its own
    /// workload shape and random subset of fault kinds; one line per run,
    /// stops at the first violation with the command that replays it.
    Swarm(swarm::SwarmArgs),
    /// Serve Pulsar's binary protocol on a loopback (or given) address: a
    /// single node with non-partitioned persistent topics on the redb store,
    /// for the official Pulsar clients. Runs until SIGINT/SIGTERM.
    Serve(serve::ServeArgs),
}

#[derive(clap::Args, Debug)]
struct SimulateArgs {
    /// Workload preset (default, fanout, delayed, txn-outage, permit-churn,
    /// failover) or a path to a TOML workload file. `default` exercises all
    /// four components in one run; the report's component section says,
    /// for any workload, which components did work (a component without
    /// work is NOT EXERCISED, never OK).
    #[arg(long, default_value = "default")]
    workload: String,
    /// RNG seed: the same seed gives the same report.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Override the number of messages published (≥ 1).
    #[arg(long)]
    messages: Option<u64>,
    /// Directory for the redb store; it must not hold a store yet and is kept
    /// after the run (default: a fresh, unpredictably named directory under
    /// the system temp dir ($TMPDIR), removed afterwards, also on Ctrl-C,
    /// unless --keep-data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Keep the default temporary data directory after the run (an explicit
    /// --data-dir is always kept).
    #[arg(long)]
    keep_data: bool,
    /// Turn off the workload's fault injection.
    #[arg(long)]
    no_faults: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Trace validation (build with `--features trace`): write the hook
    /// lines of the components the run drives to this directory, one file
    /// per spec (`<Spec>.ndjson`), one run (tag `t`) per component instance;
    /// `.ci/trace` has TLC check them.
    #[cfg(feature = "trace")]
    #[arg(long)]
    trace_dir: Option<PathBuf>,
    /// No progress output (a bar on a terminal, otherwise a plain line on
    /// stderr every 10 s).
    #[arg(long)]
    quiet: bool,
    /// Watchdog: a run in which no event finishes for this many seconds of
    /// wall time (a component spinning inside one call) prints a livelock
    /// report and exits 1.
    #[arg(long, default_value_t = 10)]
    hang_secs: u64,
    /// Watchdog: stop a run that takes longer than this many seconds of wall
    /// time, as a violation (default: no bound).
    #[arg(long)]
    wall_limit_secs: Option<u64>,
    /// How the store commits. `always`: every commit is fsynced (a restart
    /// after a crash or power loss finds every acknowledged operation).
    /// `deferred`: commits reach the disk only when the store is closed; the
    /// simulator's restarts close the store cleanly, so the report is the same,
    /// but the run no longer exercises power-loss durability, and a kill -9 or
    /// power loss mid-run leaves the store at its last clean close. Much
    /// faster on a real disk. The report's first lines say which was used
    /// (`sync: always` or `sync: deferred`).
    #[arg(long, value_enum, default_value_t = SyncChoice::Always)]
    sync: SyncChoice,
}

/// `--sync` choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SyncChoice {
    /// fsync every commit.
    Always,
    /// fsync when the store is closed.
    Deferred,
}

impl From<SyncChoice> for SyncMode {
    fn from(s: SyncChoice) -> Self {
        match s {
            SyncChoice::Always => SyncMode::Immediate,
            SyncChoice::Deferred => SyncMode::Deferred,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // serve reports why it closed a connection at WARN: a server operator
    // sees it without RUST_LOG; the offline commands stay at errors only.
    init_logging(if matches!(cli.command, Command::Serve(_)) {
        "warn"
    } else {
        "error"
    });
    match cli.command {
        Command::Simulate(args) => simulate(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Swarm(args) => swarm::swarm(args),
        Command::Serve(args) => serve::run(args),
    }
}

/// Log lines to stderr, filtered by `RUST_LOG` (default `default_filter`:
/// errors only for the offline commands, where the components' warnings in a
/// simulation are their reactions to the injected faults, shown with
/// `RUST_LOG=warn`; warnings for `serve`). Colours only on a terminal.
fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Writes `text` to stdout; a closed or full stdout is an error message and
/// exit code 2 instead of a panic.
fn write_stdout(text: &str) -> Result<(), ExitCode> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| {
            eprintln!("error: cannot write the report to stdout: {e}");
            ExitCode::from(2)
        })
}

/// A workload given as a file must have content: a file that sets no field
/// (empty, or only whitespace and comments) is an error, not the defaults.
fn check_workload_file(arg: &str) -> Result<(), String> {
    let path = std::path::Path::new(arg);
    if path.is_file() && !Workload::PRESETS.contains(&arg) {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read workload file {arg}: {e}"))?;
        // A malformed file is left to the workload parser's error.
        if text.parse::<toml::Table>().is_ok_and(|t| t.is_empty()) {
            return Err(format!(
                "workload file {arg} is empty (give at least `name = ...`, or a preset name)"
            ));
        }
    }
    Ok(())
}

fn simulate(args: SimulateArgs) -> ExitCode {
    if let Err(e) = check_workload_file(&args.workload) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let mut workload = match Workload::resolve(&args.workload) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(m) = args.messages {
        workload.messages = m;
    }
    if let Err(e) = workload.validate() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let data_dir = match DataDir::new(args.data_dir.as_deref(), args.keep_data) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // The run's store lives in memory and is saved here at its end.
    if let Err(e) = std::fs::create_dir_all(data_dir.path()) {
        eprintln!("error: data dir {}: {e}", data_dir.path().display());
        return ExitCode::from(2);
    }
    eprintln!("{}", data_dir.start_line());
    data_dir.exit_on_interrupt();
    let opts = SimOptions {
        seed: args.seed,
        data_dir: data_dir.path().to_path_buf(),
        faults: !args.no_faults,
        sabotage: None,
        sync: args.sync.into(),
        watchdog: sim::Watchdog {
            exit_on_hang: Some(std::time::Duration::from_secs(args.hang_secs)),
            wall_limit: args.wall_limit_secs.map(std::time::Duration::from_secs),
            ..sim::Watchdog::default()
        },
        #[cfg(feature = "trace")]
        trace_dir: args.trace_dir.clone(),
        #[cfg(not(feature = "trace"))]
        trace_dir: None,
    };
    let progress = Progress::new(args.quiet);
    let on_progress = |done: u64, total: u64| progress.update(done, total);
    let result = sim::run(&workload, &opts, Some(&on_progress));
    progress.finish();
    eprintln!("{}", data_dir.finish());
    match result {
        Ok(report) => {
            let text = if args.json {
                format!("{}\n", report.to_json())
            } else {
                report.to_string()
            };
            if let Err(code) = write_stdout(&text) {
                return code;
            }
            if report.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
