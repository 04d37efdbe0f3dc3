//! The components embedded in a tokio broker without blocking its runtime:
//! producers' sends are appended with `ManagedLedger::append_async` and
//! their receipts wait for durability with `.await`; a consumer's acks are
//! persisted with `ManagedCursor::persist_deletion_state_async`; a
//! completion callback feeds a tokio channel. No `spawn_blocking`: the
//! durable writes run on the store's group-commit writer thread, which
//! gives every write that arrives during a commit the next transaction and
//! its one fsync.
//!
//! The runtime is single-threaded on purpose: a call that blocked on an
//! fsync would stall every task, which the ticker task would see as a late
//! tick; the run prints its worst lateness next to the commits and sends.
//! (Reads, `read_entries`, are store reads from redb's page cache: they do
//! not fsync and are short.)
//!
//! Run: `cargo run --example tokio_broker` (tokio is a dev-dependency; the
//! library does not depend on it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pulsar_core::deletion::CursorDeletionState;
use pulsar_core::ledger::{LedgerConfig, LedgerStore, ManagedLedger, RedbStore};
use pulsar_core::Position;

const PRODUCERS: usize = 64;
const SENDS_PER_PRODUCER: usize = 40;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    // Durable: every commit is fsynced (SyncMode::Immediate).
    let store = Arc::new(RedbStore::open(dir.path().join("broker.redb"))?);
    let topic = ManagedLedger::open(
        "persistent://public/default/orders",
        LedgerConfig::default(),
        store.clone() as Arc<dyn LedgerStore>,
    )?;
    let cursor = Arc::new(topic.open_cursor("sub")?);
    let acks = Arc::new(CursorDeletionState::new(cursor.mark_delete_position())?);

    // The runtime's pulse: a 1 ms ticker; its worst lateness says whether
    // anything blocked the (only) runtime thread.
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let ticker = tokio::spawn(async move {
        let mut worst = Duration::ZERO;
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = Instant::now();
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now = Instant::now();
                    worst = worst.max(now.duration_since(last).saturating_sub(Duration::from_millis(1)));
                    last = now;
                }
                _ = stop_rx.changed() => return worst,
            }
        }
    });

    // Producers: each send is a SEND whose receipt goes out only once the
    // entry is durable (`.await` on the completion).
    let started = Instant::now();
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let topic = Arc::clone(&topic);
        producers.push(tokio::spawn(async move {
            let mut receipts = Vec::with_capacity(SENDS_PER_PRODUCER);
            for i in 0..SENDS_PER_PRODUCER {
                let position = topic
                    .append_async(format!("producer {p} message {i}").into_bytes())
                    .await?;
                receipts.push(position);
            }
            Ok::<_, pulsar_core::ledger::LedgerError>(receipts)
        }));
    }
    let mut sent = 0;
    for p in producers {
        sent += p.await??.len();
    }
    let send_elapsed = started.elapsed();

    // The consumer: read everything, acknowledge every other message
    // individually, and persist the acknowledgements; the callback form
    // feeds a tokio channel (no runtime-specific future needed).
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut read = 0;
    while cursor.has_more_entries() {
        let entries = cursor.read_entries(500)?;
        read += entries.len();
        let acked: Vec<Position> = entries
            .iter()
            .map(|e| e.position)
            .filter(|p| p.entry_id % 2 == 0)
            .collect();
        acks.delete(&acked, &*topic)?;
        let tx = tx.clone();
        cursor
            .persist_deletion_state_async(&acks, Vec::new())
            .on_complete(move |r| {
                let _ = tx.send(r);
            });
    }
    drop(tx);
    let mut persisted = 0;
    while let Some(r) = rx.recv().await {
        r?;
        persisted += 1;
    }

    stop_tx.send(true)?;
    let worst_tick = ticker.await?;
    let stats = store.group_commit_stats().expect("the group committer ran");
    println!(
        "sent {sent} messages from {PRODUCERS} producers in {:.0} ms ({:.0} msg/s, each receipt after its fsync); \
         read {read}, {persisted} ack persists; {} commits for {} writes (largest batch {}); \
         worst ticker lateness {:.1} ms",
        send_elapsed.as_secs_f64() * 1e3,
        sent as f64 / send_elapsed.as_secs_f64(),
        stats.commits,
        stats.writes,
        stats.largest_batch,
        worst_tick.as_secs_f64() * 1e3,
    );
    assert_eq!(sent, PRODUCERS * SENDS_PER_PRODUCER);
    assert_eq!(read, sent);
    assert!(
        stats.commits < stats.writes,
        "group commit shared no fsync: {stats:?}"
    );
    // Everything acknowledged is durable: a restarted broker reads it back.
    let recovered = cursor.recover_deletion_state()?;
    assert!(recovered.is_message_deleted(Position::new(1, 0)));
    assert!(!recovered.is_message_deleted(Position::new(1, 1)));
    Ok(())
}
