//! Bucket delayed delivery on the durable store: add delayed messages, move
//! a manual clock forward, take the messages that are due, and recover the
//! tracker from its snapshots after a restart.
//!
//! Run: `cargo run --example delayed`

use std::sync::Arc;

use pulsar_core::delayed::{
    BucketDelayedDeliveryTracker, BucketTrackerConfig, RedbSnapshotStorage, VirtualClock,
};
use pulsar_core::ledger::RedbStore;

fn tracker(
    path: &std::path::Path,
    clock: Arc<VirtualClock>,
) -> Result<BucketDelayedDeliveryTracker, Box<dyn std::error::Error>> {
    let store = RedbStore::open(path)?;
    let storage = Arc::new(RedbSnapshotStorage::new(
        store,
        "persistent://public/default/orders",
        "sub",
    )?);
    let config = BucketTrackerConfig {
        tick_time_ms: 10,
        min_index_count_per_bucket: 4,
        ..BucketTrackerConfig::default()
    };
    Ok(BucketDelayedDeliveryTracker::new(config, storage, clock)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store.redb");
    let clock = Arc::new(VirtualClock::new(1_000));
    {
        let t = tracker(&path, Arc::clone(&clock))?;
        // Ledgers 1..=3 with 5 entries each, each due 100 ms after the
        // previous one. When a message of a new ledger arrives and the open
        // (mutable) bucket holds at least `min_index_count_per_bucket`
        // messages, the bucket is sealed: its snapshot is written to the store.
        for l in 1..=3i64 {
            for e in 0..5i64 {
                t.add_message(l, e, 1_100 + 100 * (5 * (l - 1) + e))?;
            }
        }
        println!(
            "{} delayed messages tracked",
            t.number_of_delayed_messages()
        );
        clock.advance(250);
        let due = t.get_scheduled_messages(100)?;
        println!("at 1250 ms, due: {due:?}");
        t.close();
    }
    // The sealed buckets (ledgers 1 and 2) come back from their snapshots; the
    // open bucket (ledger 3) was in memory only, as in Pulsar, and is
    // re-added when the broker replays those messages.
    let t = tracker(&path, clock)?;
    println!(
        "after a restart: {} delayed messages recovered from the snapshots",
        t.number_of_delayed_messages()
    );
    assert_eq!(t.number_of_delayed_messages(), 10);
    t.verify_invariants()?;
    Ok(())
}
