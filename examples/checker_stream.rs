//! The simulator's delivery checker on its own at fan-out scale: what the
//! 400 M-delivery `fanout` run asks of it, without the broker around it.
//!
//! `cargo run --release --example checker_stream -- MESSAGES SUBSCRIPTIONS WINDOW`
//! (default 50,000 × 20, window 10,000, a few seconds, as the CI examples
//! layer runs it; the seed's fan-out scale is `-- 20000000 20 100000`):
//! messages of batch 10 are
//! published in position order with 10,000 Key_Shared keys; each
//! subscription's 10 consumers receive every message in order and
//! acknowledge it WINDOW messages later (the unacknowledged backlog a real
//! run carries). Prints deliveries/s and peak RSS (VmHWM), and fails if the
//! checker reports anything: its memory follows WINDOW, not MESSAGES.

use std::time::Instant;

use pulsar_core::position::Position;
use pulsar_core::sim::checker::{DeliveryChecker, MessageRef, OrderCheck};
use pulsar_core::sim::report::peak_memory_kib;

fn arg(i: usize, default: u64) -> u64 {
    match std::env::args().nth(i) {
        None => default,
        Some(a) => a.parse().unwrap_or_else(|_| {
            eprintln!("checker_stream: argument {i} ({a:?}) is not a whole number; usage: MESSAGES SUBSCRIPTIONS WINDOW");
            std::process::exit(2)
        }),
    }
}

fn main() {
    let messages = arg(1, 50_000);
    let subs = arg(2, 20);
    let window = arg(3, 10_000);
    let names: Vec<String> = (0..subs).map(|s| format!("sub-{s}")).collect();
    let mut c = DeliveryChecker::new(names.clone(), 0, OrderCheck::PerKey);
    let msg = |i: u64| MessageRef {
        position: Position::new(1 + (i / 10 / 50_000) as i64, ((i / 10) % 50_000) as i64),
        batch_index: (i % 10) as u32,
    };
    let key = |i: u64| ((i / 10) % 10_000) as u32;
    let started = Instant::now();
    for i in 0..messages + window {
        if i < messages {
            c.published(msg(i), key(i), 0);
            for name in &names {
                c.delivered(name, (key(i) % 10) as usize, msg(i), i / 1_000, 0);
            }
        }
        if let Some(j) = i.checked_sub(window) {
            for name in &names {
                c.ack_applied(name, (key(j) % 10) as usize, &[msg(j)], i / 1_000);
                c.acked(name, msg(j), i / 1_000);
            }
        }
        if i > 0 && i % 1_000_000 == 0 {
            eprintln!(
                "{i} messages, {:.0} s, peak {} MiB",
                started.elapsed().as_secs_f64(),
                peak_memory_kib().unwrap_or(0) / 1024
            );
        }
    }
    let (counts, first) = c.finish(messages / 1_000 + 1);
    let secs = started.elapsed().as_secs_f64();
    println!(
        "checker_stream: {messages} messages x {subs} subscriptions = {} deliveries, window {window}: {secs:.1} s, {:.0} deliveries/s, peak RSS {} MiB, {} violations",
        counts.delivered,
        counts.delivered as f64 / secs,
        peak_memory_kib().unwrap_or(0) / 1024,
        counts.violations()
    );
    assert_eq!(counts.violations(), 0, "{first:?}");
    assert_eq!(counts.acked, messages * subs);
}
