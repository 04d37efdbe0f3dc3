//! `pulsar-core` command-line interface.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod swarm;
use pulsar_core::sim::{self, SimOptions, Workload};

/// Model-checked Rust implementations of Apache Pulsar's bucket delayed
/// delivery, pending-ack replay, PIP-491 permit accounting and the lock-free
/// read-scheduling check.
#[derive(Parser, Debug)]
#[command(name = "pulsar-core", version, about, long_about = None, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a seeded, fault-injected, end-to-end simulation of all four
    /// components on the durable store and report loss, duplicates, disorder
    /// and stalls. Exits non-zero on any violation.
    Simulate(SimulateArgs),
    /// Swarm testing: many small seeded simulate runs, each with its own
    /// workload shape and random subset of fault kinds; one line per run,
    /// stops at the first violation with the command that replays it.
    Swarm(swarm::SwarmArgs),
}

#[derive(clap::Args, Debug)]
struct SimulateArgs {
    /// Workload preset (fanout, delayed, txn-outage, permit-churn, failover)
    /// or a path to a TOML workload file.
    #[arg(long, default_value = "fanout")]
    workload: String,
    /// RNG seed: the same seed gives the same report.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Override the number of messages published (≥ 1).
    #[arg(long)]
    messages: Option<u64>,
    /// Directory for the redb store; it must not hold a store yet and is kept
    /// after the run (default: a fresh directory under the system temp dir,
    /// removed afterwards, also on Ctrl-C, unless --keep-data).
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
    /// No progress bar.
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Simulate(args) => simulate(args),
        Command::Swarm(args) => swarm::swarm(args),
    }
}

fn simulate(args: SimulateArgs) -> ExitCode {
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
    let (data_dir, remove_after) = match &args.data_dir {
        Some(d) => {
            if d.exists() && !d.is_dir() {
                eprintln!(
                    "error: data dir {} exists and is not a directory",
                    d.display()
                );
                return ExitCode::from(2);
            }
            (d.clone(), false)
        }
        None => {
            let tmp = std::env::temp_dir();
            if !tmp.is_dir() {
                eprintln!(
                    "error: the temp dir {} does not exist (set TMPDIR or pass --data-dir)",
                    tmp.display()
                );
                return ExitCode::from(2);
            }
            let d = tmp.join(format!(
                "pulsar-core-sim-{}-{}",
                std::process::id(),
                args.seed
            ));
            (d, !args.keep_data)
        }
    };
    if remove_after {
        // Ctrl-C / SIGTERM must not leave the temporary store behind.
        let dir = data_dir.clone();
        let _ = ctrlc::set_handler(move || {
            let _ = std::fs::remove_dir_all(&dir);
            eprintln!("interrupted: removed {}", dir.display());
            std::process::exit(130);
        });
    }
    if data_dir.join("pulsar-core.redb").exists() {
        eprintln!(
            "error: data dir {} already holds a store; use an empty directory",
            data_dir.display()
        );
        return ExitCode::from(2);
    }
    let opts = SimOptions {
        seed: args.seed,
        data_dir: data_dir.clone(),
        faults: !args.no_faults,
        sabotage: None,
        watchdog: sim::Watchdog {
            exit_on_hang: Some(std::time::Duration::from_secs(args.hang_secs)),
            wall_limit: args.wall_limit_secs.map(std::time::Duration::from_secs),
            ..sim::Watchdog::default()
        },
    };
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(1);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {elapsed_precise} [{bar:40}] {pos}/{len} acks {per_sec}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let result = sim::run(&workload, &opts, Some(&progress));
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if remove_after {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    match result {
        Ok(report) => {
            if args.json {
                println!("{}", report.to_json());
            } else {
                print!("{report}");
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
