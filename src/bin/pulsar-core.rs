//! `pulsar-core` command-line interface.

use clap::Parser;

/// Model-checked Rust implementations of Apache Pulsar's bucket delayed
/// delivery, pending-ack replay, PIP-491 permit accounting and the lock-free
/// read-scheduling check.
#[derive(Parser, Debug)]
#[command(name = "pulsar-core", version, about, long_about = None)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
    println!(
        "pulsar-core {}: no subcommands yet; see --help",
        env!("CARGO_PKG_VERSION")
    );
}
