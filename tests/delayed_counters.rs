//! The tracker's background-work counters (`TrackerStats`) count each event
//! once, and the dispatcher's timer contract (`next_timer_delay_ms`,
//! `on_timer_fired`, Pulsar's `updateTimer` / `run`).
#![cfg(not(any(loom, feature = "shuttle")))]

use std::sync::Arc;

use pulsar_core::delayed::{
    BucketDelayedDeliveryTracker, BucketTrackerConfig, FaultyStorage, MemorySnapshotStorage,
    RecoveryPolicy, TrackerStats, VirtualClock,
};

fn cfg() -> BucketTrackerConfig {
    BucketTrackerConfig {
        tick_time_ms: 1,
        deliver_at_time_strict: true,
        min_index_count_per_bucket: 2,
        max_time_step_per_bucket_snapshot_segment_ms: 10,
        max_indexes_per_bucket_snapshot_segment: 1,
        max_num_buckets: -1,
        recovery_policy: RecoveryPolicy::Fail,
    }
}

fn drain(t: &BucketDelayedDeliveryTracker) -> usize {
    let mut n = 0;
    for _ in 0..1_000 {
        let got = t.get_scheduled_messages(100).unwrap();
        if got.is_empty() {
            return n;
        }
        n += got.len();
    }
    panic!("get_scheduled_messages never ran dry");
}

/// Two sealed buckets of three one-index segments each (ledgers 1 and 2),
/// plus (3,0) in the mutable bucket.
fn two_buckets(
    storage: Arc<FaultyStorage<Arc<MemorySnapshotStorage>>>,
    clock: Arc<VirtualClock>,
) -> BucketDelayedDeliveryTracker {
    let t = BucketDelayedDeliveryTracker::new(cfg(), storage, clock).unwrap();
    for (l, e, ts) in [
        (1, 0, 10),
        (1, 1, 20),
        (1, 2, 30),
        (2, 0, 15),
        (2, 1, 25),
        (2, 2, 35),
        (3, 0, 100),
    ] {
        assert!(t.add_message(l, e, ts).unwrap());
    }
    t
}

#[test]
fn counters_count_seals_segment_loads_deletes_and_recovery() {
    let mem = Arc::new(MemorySnapshotStorage::new());
    let storage = Arc::new(FaultyStorage::new(mem.clone()));
    let clock = Arc::new(VirtualClock::new(0));
    let t = two_buckets(storage.clone(), clock.clone());
    assert_eq!(
        t.stats(),
        TrackerStats {
            seals: 2,
            ..TrackerStats::default()
        }
    );
    drop(t);
    // Restart: both buckets come back from their snapshots.
    let t = BucketDelayedDeliveryTracker::new(cfg(), storage.clone(), clock.clone()).unwrap();
    assert_eq!(
        t.stats(),
        TrackerStats {
            recovered_buckets: 2,
            ..TrackerStats::default()
        }
    );
    clock.set(50);
    assert_eq!(drain(&t), 6);
    // Segments 2 and 3 of each bucket loaded, then each exhausted bucket's
    // snapshot deleted.
    assert_eq!(
        t.stats(),
        TrackerStats {
            recovered_buckets: 2,
            segment_loads: 4,
            snapshot_deletes: 2,
            ..TrackerStats::default()
        }
    );
}

/// At recovery a bucket whose every segment's max timestamp is at or below
/// the cutoff is expired: its snapshot is deleted (the dispatcher's re-read
/// delivers its messages); a bucket with a later segment resumes from it.
#[test]
fn recovery_skips_a_bucket_expired_up_to_the_cutoff_and_resumes_the_other() {
    let mem = Arc::new(MemorySnapshotStorage::new());
    let storage = Arc::new(FaultyStorage::new(mem.clone()));
    let clock = Arc::new(VirtualClock::new(0));
    drop(two_buckets(storage.clone(), clock.clone()));
    // Ledger 1's segments end at 10, 20, 30; ledger 2's at 15, 25, 35.
    clock.set(30);
    let t = BucketDelayedDeliveryTracker::new(cfg(), storage, clock).unwrap();
    let stats = t.stats();
    assert_eq!(
        (
            stats.recovered_buckets,
            stats.skipped_buckets,
            stats.snapshot_deletes
        ),
        (1, 1, 1)
    );
    let buckets = t.buckets();
    assert_eq!(buckets.len(), 1);
    assert_eq!(buckets[0].0.start_ledger_id, 2);
    assert_eq!(
        (buckets[0].2, buckets[0].3),
        (3, 3),
        "resumes at segment 3 of 3"
    );
    assert_eq!(t.number_of_delayed_messages(), 1);
}

/// A segment read that fails is counted and retried: the head is kept and
/// nothing is lost once the storage answers again. Trim counts the buckets
/// it removes once mark-delete has passed them.
#[test]
fn failed_segment_loads_and_trimmed_buckets_are_counted() {
    let mem = Arc::new(MemorySnapshotStorage::new());
    let storage = Arc::new(FaultyStorage::new(mem.clone()));
    let clock = Arc::new(VirtualClock::new(0));
    let t = two_buckets(storage.clone(), clock.clone());
    clock.set(50);
    storage.arm(pulsar_core::delayed::FaultPlan {
        read: 100,
        ..Default::default()
    });
    let first = t.get_scheduled_messages(100).unwrap();
    assert!(t.stats().segment_load_failures >= 1, "{:?}", t.stats());
    storage.arm(pulsar_core::delayed::FaultPlan::default());
    assert_eq!(first.len() + drain(&t), 6);

    let t = two_buckets(
        Arc::new(FaultyStorage::new(Arc::new(MemorySnapshotStorage::new()))),
        Arc::new(VirtualClock::new(0)),
    );
    // Bucket [1,1] lies wholly below the mark-delete ledger 2.
    t.update_mark_delete(pulsar_core::Position::new(2, -1));
    t.trim_and_merge().unwrap();
    assert_eq!(t.stats().trimmed_buckets, 1);
    assert_eq!(t.buckets().len(), 1);
}

/// Pulsar's `updateTimer`: the delay is `max(target − now, last tick + tick
/// − now)`, where the last tick is when the timer last fired; a closed
/// tracker asks for no timer.
#[test]
fn the_timer_waits_for_the_target_and_at_least_one_tick_after_it_fired() {
    let clock = Arc::new(VirtualClock::new(0));
    let t = BucketDelayedDeliveryTracker::new(
        BucketTrackerConfig {
            tick_time_ms: 100,
            ..cfg()
        },
        Arc::new(MemorySnapshotStorage::new()),
        clock.clone(),
    )
    .unwrap();
    assert!(t.add_message(1, 0, 70).unwrap());
    assert_eq!(t.next_timer_delay_ms(), Some(100), "first tick at 0 + 100");
    clock.set(50);
    t.on_timer_fired();
    clock.set(60);
    // target 70 − 60 = 10, tick floor 50 + 100 − 60 = 90.
    assert_eq!(t.next_timer_delay_ms(), Some(90));
    clock.set(160);
    assert!(t.add_message(1, 1, 400).unwrap());
    assert_eq!(t.next_timer_delay_ms(), None, "target 70 already past");
    assert_eq!(t.get_scheduled_messages(10).unwrap().len(), 1);
    assert_eq!(t.next_timer_delay_ms(), Some(240), "target 400 − 160");
    // Acknowledged: nothing is tracked, even if a stale heap entry is left.
    t.update_mark_delete(pulsar_core::Position::new(1, 1));
    assert_eq!(t.number_of_delayed_messages(), 0);
    assert_eq!(t.next_timer_delay_ms(), None, "nothing tracked");
    assert!(t.add_message(2, 0, 500).unwrap());
    t.close();
    assert_eq!(t.next_timer_delay_ms(), None, "closed");
}
