//! `pulsar-core` command-line interface.

use clap::Parser;

/// Model-checked Rust implementations of Apache Pulsar's bucket delayed
/// delivery, pending-ack replay, PIP-491 permit accounting and the lock-free
/// read-scheduling check.
#[derive(Parser, Debug)]
#[command(name = "pulsar-core", version, about, long_about = None, arg_required_else_help = true)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
}
