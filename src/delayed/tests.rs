//! Unit tests of the tracker's behaviour (merge keeps segment 1, no
//! duplicate delivery, counter = runtime bitmap cardinality).

use std::sync::Arc;

use super::*;
use crate::position::Position;

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

struct Fixture {
    clock: Arc<VirtualClock>,
    mem: Arc<MemorySnapshotStorage>,
    faulty: Arc<FaultyStorage<Arc<MemorySnapshotStorage>>>,
}

impl Fixture {
    fn new() -> Self {
        let mem = Arc::new(MemorySnapshotStorage::new());
        Self {
            clock: Arc::new(VirtualClock::new(0)),
            faulty: Arc::new(FaultyStorage::new(mem.clone())),
            mem,
        }
    }

    fn tracker(
        &self,
        config: BucketTrackerConfig,
    ) -> Result<BucketDelayedDeliveryTracker, DelayedError> {
        BucketDelayedDeliveryTracker::new(config, self.faulty.clone(), self.clock.clone())
    }
}

use crate::test_support::p;

/// Delivers everything due. Every non-empty batch delivers at least one
/// tracked message, so the drain ends after at most `tracked + 1` calls; a
/// tracker that keeps returning messages fails here instead of spinning.
fn drain(t: &BucketDelayedDeliveryTracker) -> Vec<Position> {
    let mut all = Vec::new();
    let bound = t.number_of_delayed_messages() + 1;
    for _ in 0..bound {
        let got = t.get_scheduled_messages(100).unwrap();
        if got.is_empty() {
            return all;
        }
        all.extend(got);
    }
    panic!(
        "get_scheduled_messages still returned messages after {bound} calls \
         (more than the tracked messages): {} delivered, first {:?}",
        all.len(),
        &all[..all.len().min(8)]
    );
}

/// The adds (ledger_id, entry_id, deliver-at ms) that make two sealed
/// buckets A = [1,1] and B = [2,2] of three one-index segments each (with
/// `cfg()`), plus (3,0) in the mutable bucket.
pub(super) const TWO_BUCKETS: [(i64, i64, i64); 7] = [
    (1, 0, 10),
    (1, 1, 20),
    (1, 2, 30),
    (2, 0, 15),
    (2, 1, 25),
    (2, 2, 35),
    (3, 0, 100),
];

/// Two sealed buckets A = [1,1], B = [2,2] with three one-index segments
/// each, plus (3,0) in the mutable bucket.
fn two_buckets(f: &Fixture) -> BucketDelayedDeliveryTracker {
    let t = f.tracker(cfg()).unwrap();
    for (l, e, ts) in TWO_BUCKETS {
        assert!(t.add_message(l, e, ts).unwrap());
    }
    assert_eq!(t.buckets().len(), 2);
    t.verify_invariants().unwrap();
    t
}

#[test]
fn add_get_and_expired_readd_untracks() {
    let f = Fixture::new();
    let t = f.tracker(cfg()).unwrap();
    assert!(t.add_message(1, 1, 50).unwrap());
    assert!(t.add_message(1, 1, 50).unwrap(), "duplicate returns true");
    assert_eq!(t.number_of_delayed_messages(), 1);
    // Expired re-add: returns false AND untracks.
    f.clock.set(60);
    assert!(!t.add_message(1, 1, 50).unwrap());
    assert_eq!(t.number_of_delayed_messages(), 0);
    assert!(!t.contains_message(1, 1));
    // The stale queue entry is skipped: no second delivery.
    assert!(t.get_scheduled_messages(10).unwrap().is_empty());
    assert!(!t.add_message(1, 2, -5).unwrap());
    t.verify_invariants().unwrap();
}

#[test]
fn bad_positions_are_typed_errors() {
    let f = Fixture::new();
    let t = f.tracker(cfg()).unwrap();
    assert_eq!(
        t.add_message(1, i64::from(u32::MAX) + 1, 100),
        Err(DelayedError::EntryIdOutOfRange {
            ledger_id: 1,
            entry_id: i64::from(u32::MAX) + 1
        })
    );
    assert!(matches!(
        t.add_message(1, -1, 100),
        Err(DelayedError::EntryIdOutOfRange { .. })
    ));
    assert!(matches!(
        t.add_message(-3, 1, 100),
        Err(DelayedError::InvalidLedgerId { .. })
    ));
    assert_eq!(t.number_of_delayed_messages(), 0);
    assert!(t.add_message(1, i64::from(u32::MAX), 100).unwrap());
    let bad = BucketTrackerConfig {
        max_indexes_per_bucket_snapshot_segment: 0,
        ..cfg()
    };
    assert!(matches!(
        f.tracker(bad),
        Err(DelayedError::InvalidConfig(_))
    ));
}

#[test]
fn seal_load_segments_and_retire_bucket() {
    let f = Fixture::new();
    let t = two_buckets(&f);
    assert_eq!(f.mem.snapshot_ids().len(), 2);
    assert_eq!(t.next_delivery_time(), Some(10));
    assert!(!t.has_message_available());
    f.clock.set(40);
    assert!(t.has_message_available());
    let got = drain(&t);
    assert_eq!(
        got,
        vec![p(1, 0), p(1, 1), p(1, 2), p(2, 0), p(2, 1), p(2, 2)]
    );
    assert_eq!(t.number_of_delayed_messages(), 1);
    assert!(t.buckets().is_empty(), "exhausted buckets are retired");
    assert!(
        f.mem.snapshot_ids().is_empty(),
        "and their snapshots deleted"
    );
    t.verify_invariants().unwrap();
}

#[test]
fn merge_keeps_only_undispatched_and_adds_no_second_live_copy() {
    let f = Fixture::new();
    let t = two_buckets(&f);
    f.clock.set(12);
    assert_eq!(t.get_scheduled_messages(10).unwrap(), vec![p(1, 0)]);
    assert!(t.trim_and_merge().unwrap());
    let buckets = t.buckets();
    assert_eq!(buckets.len(), 1);
    let (ctx, id, cur, last) = buckets[0];
    assert_eq!((ctx.start_ledger_id, ctx.end_ledger_id, cur), (1, 2, 1));
    // Only undispatched indexes were persisted: 5 of 6.
    assert_eq!(last, 5);
    let segs = f.mem.get_segments(id, 1, last).unwrap();
    let persisted: Vec<(u64, u64)> = segs
        .iter()
        .flat_map(|s| s.indexes.iter().map(|d| (d.ledger_id, d.entry_id)))
        .collect();
    assert!(!persisted.contains(&(1, 0)));
    assert_eq!(persisted.len(), 5);
    assert_eq!(
        f.mem.snapshot_ids(),
        vec![id],
        "sources replaced atomically"
    );
    // (2,0)@15 and (1,1)@20 were live; their entries are replaced by the
    // merged segment 1 = (2,0): one live entry, none twice.
    assert_eq!(t.shared_queue_len(), 1);
    f.clock.set(40);
    let got = drain(&t);
    assert_eq!(got, vec![p(1, 1), p(1, 2), p(2, 0), p(2, 1), p(2, 2)]);
    assert_eq!(t.number_of_delayed_messages(), 1);
    t.verify_invariants().unwrap();
}

#[test]
fn merge_reads_segment_one_so_restart_loses_nothing() {
    // Bug (1): reading from current+1 loses the loaded segment after restart.
    let f = Fixture::new();
    let t = two_buckets(&f);
    assert!(t.trim_and_merge().unwrap());
    drop(t);
    let t = f.tracker(cfg()).unwrap();
    assert_eq!(t.number_of_delayed_messages(), 6);
    f.clock.set(40);
    assert_eq!(drain(&t).len(), 6);
    assert_eq!(t.number_of_delayed_messages(), 0);
}

#[test]
fn recovery_restores_into_runtime_index_and_skips_expired() {
    let f = Fixture::new();
    let t = two_buckets(&f);
    f.clock.set(12);
    assert_eq!(t.get_scheduled_messages(10).unwrap(), vec![p(1, 0)]);
    drop(t);
    let t = f.tracker(cfg()).unwrap();
    // Bucket A restarts at segment 2 ((1,0)'s segment has max 10 <= 12).
    assert_eq!(t.number_of_delayed_messages(), 5);
    assert!(!t.contains_message(1, 0));
    assert!(t.contains_message(2, 0));
    // The dispatcher re-reads (3,0) (never persisted) and (2,0) (duplicate).
    assert!(t.add_message(3, 0, 100).unwrap());
    assert!(t.add_message(2, 0, 15).unwrap());
    assert_eq!(t.number_of_delayed_messages(), 6);
    assert_eq!(t.stats().recovered_buckets, 2);
    f.clock.set(200);
    assert_eq!(drain(&t).len(), 6);
    drop(t);
    // Everything expired now: recovery deletes what is left.
    let t = f.tracker(cfg()).unwrap();
    assert_eq!(t.number_of_delayed_messages(), 0);
    assert!(f.mem.snapshot_ids().is_empty());
}

#[test]
fn trim_untracks_per_bit() {
    let f = Fixture::new();
    let t = two_buckets(&f);
    f.clock.set(12);
    t.get_scheduled_messages(10).unwrap(); // (1,0) delivered
    t.update_mark_delete(p(2, 0));
    // Acknowledged positions (ledger 1 and (2,0)) are untracked at once.
    assert_eq!(t.number_of_delayed_messages(), 3);
    t.trim_and_merge().unwrap();
    // Bucket A ([1,1]) trimmed; its bits are untracked per bit, and only
    // still-tracked bits would count, so nothing is subtracted twice.
    assert_eq!(t.number_of_delayed_messages(), 3);
    assert_eq!(t.buckets().len(), 1);
    assert_eq!(t.stats().trimmed_buckets, 1);
    t.verify_invariants().unwrap();
}

#[test]
fn orphaned_entries_below_mark_delete_are_dropped() {
    let f = Fixture::new();
    let t = two_buckets(&f);
    t.update_mark_delete(p(2, 0));
    f.clock.set(40);
    let got = drain(&t);
    assert_eq!(got, vec![p(2, 1), p(2, 2)]);
    assert_eq!(t.number_of_delayed_messages(), 1);
}

#[test]
fn seal_create_failure_keeps_messages_deliverable() {
    let f = Fixture::new();
    let t = f.tracker(cfg()).unwrap();
    f.faulty.arm(FaultPlan {
        create: 100,
        ..FaultPlan::default()
    });
    for (l, e, ts) in [(1, 0, 10), (1, 1, 20), (2, 0, 15)] {
        t.add_message(l, e, ts).unwrap();
    }
    assert!(t.buckets().is_empty());
    assert_eq!(t.stats().seal_failures, 1);
    f.faulty.arm(FaultPlan::default());
    f.clock.set(30);
    assert_eq!(drain(&t), vec![p(1, 0), p(1, 1), p(2, 0)]);
    assert_eq!(t.number_of_delayed_messages(), 0);
}

#[test]
fn load_and_merge_and_delete_failures_leave_state_consistent() {
    let f = Fixture::new();
    let t = two_buckets(&f);
    // Merge fails on read: sources unchanged.
    f.faulty.arm(FaultPlan {
        read: 1,
        ..FaultPlan::default()
    });
    assert!(!t.trim_and_merge().unwrap());
    assert_eq!(t.buckets().len(), 2);
    assert_eq!(t.stats().merge_failures, 1);
    // Merge fails on create: sources unchanged.
    f.faulty.arm(FaultPlan {
        create: 100,
        ..FaultPlan::default()
    });
    assert!(!t.trim_and_merge().unwrap());
    assert_eq!(t.buckets().len(), 2);
    // Segment loads fail: the head is kept, nothing is lost.
    f.faulty.arm(FaultPlan {
        read: 100,
        delete: 100,
        ..FaultPlan::default()
    });
    f.clock.set(40);
    let first = t.get_scheduled_messages(100).unwrap();
    assert!(first.len() < 6);
    f.faulty.arm(FaultPlan {
        delete: 100,
        ..FaultPlan::default()
    });
    let mut all = first;
    all.extend(drain(&t));
    all.sort();
    assert_eq!(
        all,
        vec![p(1, 0), p(1, 1), p(1, 2), p(2, 0), p(2, 1), p(2, 2)]
    );
    assert_eq!(t.number_of_delayed_messages(), 1);
    assert!(t.stats().snapshot_delete_failures >= 1);
    t.verify_invariants().unwrap();
    drop(t);
    // Undeleted exhausted snapshots are fully expired at recovery: deleted.
    f.faulty.arm(FaultPlan::default());
    let t = f.tracker(cfg()).unwrap();
    assert_eq!(t.number_of_delayed_messages(), 0);
    assert!(f.mem.snapshot_ids().is_empty());
}

#[test]
fn corrupt_snapshots_are_typed_errors_and_policy_decides() {
    for case in 0..4 {
        let f = Fixture::new();
        let t = two_buckets(&f);
        drop(t);
        let id = f.mem.snapshot_ids()[0];
        match case {
            0 => assert!(f.mem.set_raw_entry(id, 0, Some(vec![0xff, 0xff, 0xff]))),
            1 => {
                // Valid protobuf whose bitmap bytes are garbage.
                let mut meta = f.mem.get_metadata(id).unwrap();
                for v in meta.metadata_list[0].delayed_index_bit_map.values_mut() {
                    *v = vec![1, 2, 3, 4, 5];
                }
                use prost::Message;
                assert!(f.mem.set_raw_entry(id, 0, Some(meta.encode_to_vec())));
            }
            2 => assert!(f.mem.set_raw_entry(id, 3, None)), // segment count mismatch
            _ => assert!(f.mem.set_raw_entry(id, 1, Some(vec![0x0a, 0x05, 0x08]))),
        }
        let err = f.tracker(cfg()).unwrap_err();
        assert!(
            matches!(err, DelayedError::CorruptSnapshot { snapshot_id, .. } if snapshot_id == id),
            "case {case}: {err}"
        );
        assert_eq!(
            f.mem.snapshot_ids().len(),
            2,
            "Fail policy leaves storage untouched"
        );
        let skip = BucketTrackerConfig {
            recovery_policy: RecoveryPolicy::SkipCorrupt,
            ..cfg()
        };
        let t = f.tracker(skip).unwrap();
        assert_eq!(
            t.number_of_delayed_messages(),
            3,
            "case {case}: other bucket intact, no double count"
        );
        assert_eq!(f.mem.snapshot_ids().len(), 1);
        let stats = t.stats();
        assert_eq!(
            (stats.recovered_buckets, stats.skipped_buckets),
            (1, 1),
            "case {case}: the corrupt bucket is counted as skipped"
        );
    }
}

#[test]
fn missing_snapshot_and_enclosed_ranges_are_cleaned_at_recovery() {
    let f = Fixture::new();
    let t = two_buckets(&f);
    drop(t);
    let ids = f.mem.snapshot_ids();
    assert!(f.mem.drop_snapshot_data(ids[0]));
    // A stale enclosed key (merge source left behind) and a foreign key.
    f.mem.set_property(&bucket_key(2, 2), ids[1]);
    f.mem.set_property("unrelated", 5);
    let t = f.tracker(cfg()).unwrap();
    assert_eq!(t.number_of_delayed_messages(), 3);
    let keys: Vec<String> = f
        .mem
        .bucket_keys()
        .unwrap()
        .into_iter()
        .map(|k| k.0)
        .collect();
    assert_eq!(keys, vec![bucket_key(2, 2)]);
    let stats = t.stats();
    assert_eq!(
        (stats.recovered_buckets, stats.skipped_buckets),
        (1, 1),
        "the dangling key is counted as a skipped bucket"
    );
}

/// A segment that can never be read falls back to its bucket's metadata;
/// when the metadata is missing, or its bitmaps cannot be decoded, the
/// load fails, the delivery stops at the boundary, and each attempt counts
/// as one failed segment load.
#[test]
fn unreadable_segment_without_usable_metadata_counts_each_failed_load() {
    for case in ["metadata missing", "metadata bitmaps corrupt"] {
        let f = Fixture::new();
        let t = two_buckets(&f);
        let id = f.mem.snapshot_ids()[1];
        if case == "metadata missing" {
            assert!(f.mem.drop_snapshot_data(id));
        } else {
            assert!(f.mem.set_raw_entry(id, 2, Some(vec![0xff, 0xff, 0xff])));
            let mut meta = f.mem.get_metadata(id).unwrap();
            for m in &mut meta.metadata_list {
                for v in m.delayed_index_bit_map.values_mut() {
                    *v = vec![1, 2, 3, 4, 5];
                }
            }
            use prost::Message;
            assert!(f.mem.set_raw_entry(id, 0, Some(meta.encode_to_vec())));
        }
        f.clock.set(100);
        for attempt in 1..=2 {
            t.get_scheduled_messages(100).unwrap();
            assert_eq!(
                t.stats().segment_load_failures,
                attempt,
                "{case}: attempt {attempt}"
            );
        }
    }
}

#[test]
fn clear_and_close() {
    let f = Fixture::new();
    let t = two_buckets(&f);
    f.faulty.arm(FaultPlan {
        delete: 100,
        ..FaultPlan::default()
    });
    assert!(t.clear().is_err());
    assert_eq!(
        t.number_of_delayed_messages(),
        7,
        "failed clear keeps state"
    );
    f.faulty.arm(FaultPlan::default());
    t.clear().unwrap();
    assert_eq!(t.number_of_delayed_messages(), 0);
    assert!(f.mem.snapshot_ids().is_empty());
    t.add_message(9, 0, 100).unwrap();
    t.close();
    assert_eq!(t.add_message(9, 1, 100), Err(DelayedError::Closed));
    assert_eq!(t.get_scheduled_messages(1), Err(DelayedError::Closed));
    assert_eq!(t.number_of_delayed_messages(), 0);
}

/// `CounterEqualsCardinality` after a clear that fails on a later bucket's
/// snapshot: the first bucket, partly delivered, is removed and only its
/// still-tracked bits leave the counter; the second bucket and the mutable
/// one stay tracked.
#[test]
fn failed_clear_after_a_partly_delivered_bucket_keeps_counter_equal_to_cardinality() {
    let f = Fixture::new();
    let t = two_buckets(&f);
    f.clock.set(10);
    assert_eq!(t.get_scheduled_messages(1).unwrap(), vec![p(1, 0)]);
    assert_eq!(t.number_of_delayed_messages(), 6);
    let second = t.buckets()[1].1;
    f.faulty.fail_deletes_of(Some(second));
    assert!(matches!(t.clear(), Err(DelayedError::Storage { .. })));
    t.verify_invariants().unwrap();
    assert_eq!(
        t.number_of_delayed_messages(),
        4,
        "(1,1), (1,2) left with the first bucket; (2,*) and (3,0) stay"
    );
    assert_eq!(t.buckets().len(), 1);
    assert!(!t.contains_message(1, 1));
    assert!(t.contains_message(2, 0));
    f.faulty.fail_deletes_of(None);
    t.clear().unwrap();
    t.verify_invariants().unwrap();
    assert_eq!(t.number_of_delayed_messages(), 0);
    assert!(f.mem.snapshot_ids().is_empty());
}

/// `FaultyStorage::fail_deletes_of` fails every delete of the snapshot it
/// names, whichever id that is (each of the sealed buckets' snapshots in
/// turn, the first one included), and `None` lifts it.
#[test]
fn fail_deletes_of_fails_exactly_the_named_snapshot_until_lifted() {
    let ids: Vec<i64> = {
        let f = Fixture::new();
        let t = two_buckets(&f);
        t.buckets().iter().map(|b| b.1).collect()
    };
    assert_eq!(ids.len(), 2);
    for failing in ids {
        let f = Fixture::new();
        let t = two_buckets(&f);
        f.faulty.fail_deletes_of(Some(failing));
        assert!(
            matches!(t.clear(), Err(DelayedError::Storage { .. })),
            "deleting snapshot {failing} must fail"
        );
        assert!(f.mem.snapshot_ids().contains(&failing), "{failing} is kept");
        f.faulty.fail_deletes_of(None);
        t.clear().unwrap();
        assert!(f.mem.snapshot_ids().is_empty());
    }
}

#[test]
fn merge_triggered_by_max_num_buckets_and_timer_rule() {
    let f = Fixture::new();
    let t = f
        .tracker(BucketTrackerConfig {
            max_num_buckets: 2,
            ..cfg()
        })
        .unwrap();
    for l in 1..=4 {
        for e in 0..3 {
            t.add_message(l, e, 10 * (e + 1) + l).unwrap();
        }
    }
    assert!(t.stats().merges >= 1);
    assert!(t.buckets().len() <= 2);
    assert_eq!(t.number_of_delayed_messages(), 12);
    assert_eq!(t.next_timer_delay_ms(), Some(11));
    f.clock.set(100);
    assert_eq!(drain(&t).len(), 12);
    assert_eq!(t.next_timer_delay_ms(), None);
    t.verify_invariants().unwrap();
}

#[test]
fn redb_storage_roundtrip_is_atomic_with_cursor_property() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::ledger::RedbStore::open(dir.path().join("db.redb")).unwrap();
    let storage = Arc::new(RedbSnapshotStorage::new(store.clone(), "ml", "sub").unwrap());
    let clock = Arc::new(VirtualClock::new(0));
    let t = BucketDelayedDeliveryTracker::new(cfg(), storage.clone(), clock.clone()).unwrap();
    for (l, e, ts) in [
        (1, 0, 10),
        (1, 1, 20),
        (1, 2, 30),
        (2, 0, 15),
        (2, 1, 25),
        (2, 2, 35),
        (3, 0, 100),
    ] {
        t.add_message(l, e, ts).unwrap();
    }
    assert!(t.trim_and_merge().unwrap());
    let props = store.cursor_properties("ml", "sub").unwrap();
    assert_eq!(
        props.keys().cloned().collect::<Vec<_>>(),
        vec![bucket_key(1, 2)]
    );
    let id = props[&bucket_key(1, 2)];
    assert_eq!(storage.length(id).unwrap(), 6);
    assert!(matches!(
        storage.get_segments(id, 1, 7),
        Err(DelayedError::CorruptSnapshot { .. })
    ));
    assert!(matches!(
        storage.get_metadata(999),
        Err(DelayedError::SnapshotNotFound { .. })
    ));
    drop(t);
    drop(storage);
    drop(store);
    let store = crate::ledger::RedbStore::open(dir.path().join("db.redb")).unwrap();
    let storage = Arc::new(RedbSnapshotStorage::new(store, "ml", "sub").unwrap());
    let t = BucketDelayedDeliveryTracker::new(cfg(), storage, clock.clone()).unwrap();
    assert_eq!(t.number_of_delayed_messages(), 6);
    clock.set(50);
    assert_eq!(drain(&t).len(), 6);
}

#[test]
fn merge_persists_gap_positions_so_the_merged_range_is_complete() {
    let f = Fixture::new();
    let t = f.tracker(cfg()).unwrap();
    t.add_message(1, 0, 10).unwrap();
    t.add_message(1, 1, 20).unwrap();
    t.add_message(2, 0, 15).unwrap(); // seals [1,1]
    t.add_message(2, 1, 25).unwrap();
    f.faulty.arm(FaultPlan {
        create: 4,
        ..FaultPlan::default()
    });
    t.add_message(3, 0, 17).unwrap(); // seal of [2,2] fails: kept in the queue
    assert_eq!(t.stats().seal_failures, 1);
    t.add_message(3, 1, 27).unwrap();
    t.add_message(4, 0, 100).unwrap(); // seals [3,3]
    assert_eq!(t.buckets().len(), 2);
    assert!(t.trim_and_merge().unwrap());
    assert_eq!(
        t.buckets()[0].0,
        BucketContext {
            start_ledger_id: 1,
            end_ledger_id: 3
        }
    );
    t.verify_invariants().unwrap();
    drop(t);
    let t = f.tracker(cfg()).unwrap();
    assert_eq!(
        t.number_of_delayed_messages(),
        6,
        "ledger 2 is in the merged snapshot"
    );
    f.clock.set(50);
    assert_eq!(drain(&t).len(), 6);
}

#[test]
fn unreadable_segment_at_runtime_falls_back_to_its_metadata_bitmaps() {
    let f = Fixture::new();
    let t = two_buckets(&f);
    let (_, id_a, _, _) = t.buckets()[0];
    assert!(f.mem.set_raw_entry(id_a, 2, Some(vec![0xff, 0xff])));
    // Segment 2 of A ((1,1)@20) cannot be decoded: its positions come from
    // the metadata bitmap at the segment's max timestamp (20), not earlier.
    f.clock.set(19);
    let early = drain(&t);
    assert!(!early.contains(&p(1, 1)));
    f.clock.set(40);
    let mut all = early;
    all.extend(drain(&t));
    all.sort();
    assert_eq!(
        all,
        vec![p(1, 0), p(1, 1), p(1, 2), p(2, 0), p(2, 1), p(2, 2)]
    );
    assert_eq!(t.number_of_delayed_messages(), 1);
    t.verify_invariants().unwrap();
}

/// A cursor reset clears the
/// tracker and the dispatcher re-adds messages below the old mark-delete;
/// they must be delivered, and the count must equal what is delivered.
#[test]
fn clear_forgets_the_mark_delete_so_re_added_messages_are_delivered() {
    let f = Fixture::new();
    let t = f.tracker(cfg()).unwrap();
    t.update_mark_delete(p(5, 0));
    t.clear().unwrap();
    assert_eq!(t.add_message(3, 1, 100), Ok(true));
    assert_eq!(t.number_of_delayed_messages(), 1);
    f.clock.set(200);
    assert!(t.has_message_available());
    assert_eq!(t.get_scheduled_messages(100).unwrap(), vec![p(3, 1)]);
    assert_eq!(t.number_of_delayed_messages(), 0);
    // After the reset the cursor's (new) mark-delete is given again and is
    // accepted even though it is below the one before the clear.
    t.update_mark_delete(p(3, 1));
    assert_eq!(t.add_message(3, 2, 300), Ok(true));
    assert_eq!(t.add_message(4, 0, 300), Ok(true));
    f.clock.set(400);
    assert_eq!(drain(&t), vec![p(3, 2), p(4, 0)]);
    assert_eq!(t.number_of_delayed_messages(), 0);
    t.verify_invariants().unwrap();
}

/// A seek back without a clear goes through `reset_mark_delete`; the
/// messages re-read between the new and the old mark-delete (also inside
/// sealed buckets whose indexes were untracked by the old mark-delete) are
/// delivered exactly once and the count matches.
#[test]
fn reset_mark_delete_backward_keeps_re_added_messages_deliverable() {
    let f = Fixture::new();
    let t = two_buckets(&f);
    t.update_mark_delete(p(2, 1));
    assert_eq!(t.number_of_delayed_messages(), 2, "(2,2) and (3,0) left");
    // A late forward-only update below the recorded one is ignored.
    t.update_mark_delete(p(1, 0));
    assert!(!t.contains_message(1, 1));
    t.reset_mark_delete(p(1, 0));
    assert_eq!(t.number_of_delayed_messages(), 2);
    for (l, e, ts) in [(1, 1, 20), (1, 2, 30), (2, 0, 15), (2, 1, 25)] {
        assert_eq!(t.add_message(l, e, ts), Ok(true), "re-add {l}:{e}");
    }
    assert_eq!(t.number_of_delayed_messages(), 6);
    f.clock.set(200);
    assert_eq!(
        drain(&t),
        vec![p(1, 1), p(1, 2), p(2, 0), p(2, 1), p(2, 2), p(3, 0)]
    );
    assert_eq!(t.number_of_delayed_messages(), 0);
    t.verify_invariants().unwrap();
    // Moving forward again through reset_mark_delete untracks as usual.
    assert_eq!(t.add_message(4, 0, 300), Ok(true));
    t.reset_mark_delete(p(4, 0));
    assert_eq!(t.number_of_delayed_messages(), 0);
}

/// A position at or below the mark-delete (already
/// acknowledged) is not tracked: `add_message` returns `false` (not delayed;
/// the dispatcher's deletion check drops it), it is never counted and never
/// scheduled, whether it lies in the mark-delete's ledger or below it.
#[test]
fn add_at_or_below_mark_delete_is_not_tracked() {
    let f = Fixture::new();
    let t = f.tracker(cfg()).unwrap();
    t.update_mark_delete(p(2, 10));
    for (l, e) in [(2, 5), (2, 10), (1, 5), (0, 0)] {
        assert_eq!(t.add_message(l, e, 2000), Ok(false), "{l}:{e}");
        assert!(!t.contains_message(l, e));
    }
    assert_eq!(t.number_of_delayed_messages(), 0);
    assert!(!t.has_message_available());
    assert_eq!(t.add_message(2, 11, 2000), Ok(true));
    assert_eq!(t.number_of_delayed_messages(), 1);
    f.clock.set(3000);
    assert_eq!(drain(&t), vec![p(2, 11)]);
    assert_eq!(t.number_of_delayed_messages(), 0);
    t.verify_invariants().unwrap();
}

/// The empty range is `(−1, −1)`: it holds no real ledger.
#[test]
fn bucket_context_empty_is_minus_one_minus_one() {
    assert_eq!(
        BucketContext::EMPTY,
        BucketContext {
            start_ledger_id: -1,
            end_ledger_id: -1
        }
    );
    assert!(!BucketContext::EMPTY.contains(0));
    assert_eq!(MutableBucket::new().context(), BucketContext::EMPTY);
}

/// The mutable bucket: adds extend its range and fill its heap; a range
/// reset keeps the heap; the heap's reserved bytes cover its indexes.
#[test]
fn mutable_bucket_range_heap_and_reserved_bytes() {
    let mut b = MutableBucket::new();
    assert!(b.is_empty());
    assert_eq!(b.heap_capacity_bytes(), 0);
    for (i, l) in [3, 3, 5].into_iter().enumerate() {
        b.add(snapshot::IndexEntry {
            timestamp: 10 + i as u64,
            ledger_id: l,
            entry_id: i as u32,
        });
    }
    assert!(!b.is_empty());
    assert_eq!(b.len(), 3);
    assert_eq!(
        b.context(),
        BucketContext {
            start_ledger_id: 3,
            end_ledger_id: 5
        }
    );
    let per_index = std::mem::size_of::<snapshot::IndexEntry>();
    assert!(
        b.heap_capacity_bytes() >= 3 * per_index,
        "{}",
        b.heap_capacity_bytes()
    );
    assert_eq!(b.heap_capacity_bytes() % per_index, 0);
    b.reset_range();
    assert_eq!(b.context(), BucketContext::EMPTY);
    assert_eq!(b.len(), 3, "the heap is kept");
    assert_eq!(b.peek().map(|i| i.timestamp), Some(10));
}

/// The system clock reads wall time in ms since the Unix epoch; a virtual
/// clock's advance returns the new time.
#[test]
fn clocks_read_wall_and_virtual_time() {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let read = SystemClock.now_ms();
    assert!(read.abs_diff(wall) < 60_000, "{read} vs {wall}");
    let v = VirtualClock::new(10);
    assert_eq!(v.advance(5), 15);
    assert_eq!(v.now_ms(), 15);
}

/// `max_indexes_per_bucket_snapshot_segment` is -1 (no limit) or positive:
/// 0 and anything below -1 are refused.
#[test]
fn max_indexes_per_segment_is_minus_one_or_positive() {
    let with = |k: i64| {
        BucketTrackerConfig {
            max_indexes_per_bucket_snapshot_segment: k,
            ..cfg()
        }
        .validate()
    };
    assert!(with(-1).is_ok());
    assert!(with(1).is_ok());
    for bad in [0, -2, i64::MIN] {
        assert!(
            matches!(with(bad), Err(DelayedError::InvalidConfig(_))),
            "{bad}"
        );
    }
}

/// A tracker invariant violation names the spec invariant it breaks, where
/// the spec has one.
#[test]
fn invariant_violations_name_their_spec_invariant() {
    let counter = InvariantViolation::CounterNotCardinality {
        counter: 2,
        cardinality: 1,
    };
    assert_eq!(counter.spec_invariant(), Some("CounterEqualsCardinality"));
    let copy = InvariantViolation::SecondLiveCopy {
        ledger_id: 1,
        entry_id: 0,
        entries: 2,
    };
    assert_eq!(copy.spec_invariant(), Some("NoSecondLiveCopy"));
    let boundary = InvariantViolation::Boundary {
        ledger_id: 1,
        entry_id: 0,
        reason: "not registered",
    };
    assert_eq!(boundary.spec_invariant(), None);
}

/// The memory storage's test hooks: a raw entry inside the snapshot is
/// replaced, one past its end is appended, `None` cuts the snapshot there;
/// a raw property appears among the bucket keys.
#[test]
fn memory_storage_test_hooks_replace_append_truncate_and_set_properties() {
    let s = MemorySnapshotStorage::new();
    let md = SnapshotMetadata::default();
    let seg = SnapshotSegment::default();
    let id = s
        .create(&md, &[seg.clone(), seg], &bucket_key(1, 2), &[])
        .unwrap();
    assert_eq!(s.length(id), Ok(2));
    assert!(s.set_raw_entry(id, 0, Some(vec![0xff])));
    assert!(
        matches!(
            s.get_metadata(id),
            Err(DelayedError::CorruptSnapshot { .. })
        ),
        "entry 0 replaced by garbage"
    );
    assert_eq!(s.length(id), Ok(2), "replaced, not appended");
    assert!(
        s.set_raw_entry(id, 3, Some(vec![])),
        "entry 3 is one past the end"
    );
    assert_eq!(s.length(id), Ok(3), "appended");
    assert!(s.set_raw_entry(id, 1, None));
    assert_eq!(s.length(id), Ok(0), "cut after entry 0");
    assert!(!s.set_raw_entry(id + 1, 0, None), "no such snapshot");
    s.set_property(&bucket_key(5, 6), 77);
    assert!(s.bucket_keys().unwrap().contains(&(bucket_key(5, 6), 77)));
}

/// The memory storage's byte count covers each snapshot's entries (their
/// bytes plus a per-entry overhead) and each cursor property; deleting
/// everything brings it back to 0.
#[test]
fn memory_storage_counts_entry_and_property_bytes() {
    let s = MemorySnapshotStorage::new();
    assert_eq!(s.stored_bytes(), 0);
    let key = bucket_key(1, 2);
    let id = s
        .create(
            &SnapshotMetadata::default(),
            &[SnapshotSegment::default()],
            &key,
            &[],
        )
        .unwrap();
    assert!(s.set_raw_entry(id, 0, Some(vec![0; 100])));
    assert!(s.set_raw_entry(id, 1, Some(vec![0; 50])));
    let floor = 2 * 24 + 150 + key.len() + 64;
    let got = s.stored_bytes();
    assert!(
        (floor..floor + 16 * 24).contains(&got),
        "{got} bytes, expected {floor} plus the entry list's spare capacity"
    );
    s.delete(id, &key).unwrap();
    assert_eq!(s.stored_bytes(), 0);
}

/// A sealed bucket reports the first timestamp of its next unloaded segment
/// (`u64::MAX` once all are loaded) and its frozen bitmap's bytes.
#[test]
fn immutable_bucket_next_segment_time_and_frozen_bytes() {
    let frozen: roaring::RoaringBitmap = [1u32, 2, 3].into_iter().collect();
    let mut b = ImmutableBucket {
        ctx: BucketContext {
            start_ledger_id: 1,
            end_ledger_id: 1,
        },
        snapshot_id: 1,
        current_segment_entry_id: 1,
        last_segment_entry_id: 3,
        number_bucket_delayed_messages: 3,
        first_schedule_timestamps: vec![10, 20, 30],
        frozen_bitmap: [(1, frozen.clone())].into_iter().collect(),
        merging: false,
        boundary: None,
    };
    assert_eq!(b.next_unloaded_timestamp(), 20, "segment 2 is next");
    b.current_segment_entry_id = 3;
    assert_eq!(b.next_unloaded_timestamp(), u64::MAX);
    assert_eq!(b.frozen_bitmap_bytes(), frozen.serialized_size());
}

/// A snapshot that replaces another removes the replaced one's cursor
/// property only while it still names the replaced snapshot.
#[test]
fn memory_storage_replacing_removes_only_the_replaced_property() {
    let s = MemorySnapshotStorage::new();
    let md = SnapshotMetadata::default();
    let segs = [SnapshotSegment::default()];
    let a = s.create(&md, &segs, &bucket_key(1, 1), &[]).unwrap();
    let b = s.create(&md, &segs, &bucket_key(2, 2), &[]).unwrap();
    // a new snapshot under (2,2)'s key; then one replacing the old (2,2)
    let b2 = s.create(&md, &segs, &bucket_key(2, 2), &[]).unwrap();
    let replaced = [(a, bucket_key(1, 1)), (b, bucket_key(2, 2))];
    let c = s.create(&md, &segs, &bucket_key(1, 2), &replaced).unwrap();
    let keys = s.bucket_keys().unwrap();
    assert!(
        !keys.iter().any(|(k, _)| *k == bucket_key(1, 1)),
        "{keys:?}"
    );
    assert!(
        keys.contains(&(bucket_key(2, 2), b2)),
        "still names b2: {keys:?}"
    );
    assert!(keys.contains(&(bucket_key(1, 2), c)));
    assert_eq!(s.snapshot_ids(), vec![b2, c]);
}

/// A store opened read-only lists every stored snapshot's raw entries
/// (metadata first, then each segment), in key order.
#[test]
fn read_only_entries_list_every_snapshot_entry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let id = {
        let store = crate::ledger::RedbStore::open(&path).unwrap();
        let storage = RedbSnapshotStorage::new(store, "ml", "sub").unwrap();
        let seg = SnapshotSegment::default();
        storage
            .create(
                &SnapshotMetadata::default(),
                &[seg.clone(), seg],
                &bucket_key(1, 2),
                &[],
            )
            .unwrap()
    };
    let (_, db) = crate::ledger::RedbStore::read_only_contents(&path, &|_| true).unwrap();
    let entries = RedbSnapshotStorage::read_only_entries(&db).unwrap();
    assert_eq!(entries.keys().copied().collect::<Vec<_>>(), vec![id]);
    assert_eq!(
        entries[&id].iter().map(|(e, _)| *e).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
}

/// `config()` is the configuration the tracker was built with (the
/// dispatcher reads `tick_time_ms` and the strictness from it).
#[test]
fn the_tracker_reports_the_configuration_it_was_built_with() {
    let f = Fixture::new();
    let t = f.tracker(cfg()).unwrap();
    assert_eq!(t.config(), &cfg());
}

/// The redb snapshot storage: ids are positive and never reused, a segment
/// range must be `1 ≤ first ≤ last`, and delete removes the snapshot with
/// its cursor property.
#[test]
fn redb_storage_ids_segment_ranges_and_delete() {
    use crate::delayed::snapshot::{SnapshotMetadata, SnapshotSegment};
    let dir = tempfile::tempdir().unwrap();
    let store = crate::ledger::RedbStore::open(dir.path().join("db.redb")).unwrap();
    let storage = RedbSnapshotStorage::new(store.clone(), "ml", "sub").unwrap();
    let meta = SnapshotMetadata {
        metadata_list: vec![Default::default(); 2],
    };
    let segs = vec![SnapshotSegment::default(); 2];
    let a = storage
        .create(&meta, &segs, &bucket_key(1, 1), &[])
        .unwrap();
    let b = storage
        .create(&meta, &segs, &bucket_key(2, 2), &[])
        .unwrap();
    assert!(a > 0 && b > a, "ids {a}, {b}");
    assert_eq!(storage.get_segments(a, 1, 2).unwrap().len(), 2);
    for (first, last) in [(0, 1), (2, 1)] {
        assert!(
            matches!(
                storage.get_segments(a, first, last),
                Err(DelayedError::CorruptSnapshot { .. })
            ),
            "{first}..={last}"
        );
    }
    storage.delete(a, &bucket_key(1, 1)).unwrap();
    assert!(matches!(
        storage.get_segments(a, 1, 2),
        Err(DelayedError::SnapshotNotFound { .. })
    ));
    let props = store.cursor_properties("ml", "sub").unwrap();
    assert_eq!(
        props.keys().cloned().collect::<Vec<_>>(),
        vec![bucket_key(2, 2)]
    );
    assert_eq!(storage.length(b).unwrap(), 2);
}

/// The mutable bucket is sealed once it holds exactly
/// `min_index_count_per_bucket` indexes and a message of a later ledger
/// arrives (Pulsar seals at `size >= minIndexCountPerBucket`).
#[test]
fn mutable_bucket_seals_at_exactly_the_minimum_index_count() {
    let f = Fixture::new();
    let t = f.tracker(cfg()).unwrap();
    assert!(t.add_message(1, 0, 10).unwrap());
    assert!(t.add_message(2, 0, 20).unwrap());
    assert!(
        t.buckets().is_empty(),
        "one index is below the minimum of 2"
    );
    assert!(t.add_message(2, 1, 30).unwrap());
    assert!(t.add_message(3, 0, 40).unwrap());
    let ranges: Vec<(i64, i64)> = t
        .buckets()
        .iter()
        .map(|b| (b.0.start_ledger_id, b.0.end_ledger_id))
        .collect();
    assert_eq!(ranges, vec![(1, 2)], "three indexes sealed into [1,2]");
    assert!(t.add_message(3, 1, 50).unwrap());
    assert!(t.add_message(4, 0, 60).unwrap());
    assert_eq!(t.buckets().len(), 2, "two indexes of ledger 3 sealed");
    assert_eq!(t.buckets()[1].0.key(), bucket_key(3, 3));
    assert_eq!(t.stats().seals, 2);
    t.verify_invariants().unwrap();
}

/// With `max_num_buckets = 2`, reaching two buckets merges nothing; only a
/// seal that makes a third one trims and merges.
#[test]
fn buckets_merge_only_beyond_max_num_buckets() {
    let f = Fixture::new();
    let t = f
        .tracker(BucketTrackerConfig {
            max_num_buckets: 2,
            ..cfg()
        })
        .unwrap();
    for l in 1..=3 {
        for e in 0..3 {
            t.add_message(l, e, 10 * (e + 1) + l).unwrap();
        }
    }
    assert_eq!(t.buckets().len(), 2, "[1,1] and [2,2] sealed");
    assert_eq!(t.stats().merges, 0, "two buckets are within the limit");
    t.add_message(4, 0, 100).unwrap();
    assert_eq!(t.stats().seals, 3);
    assert_eq!(t.stats().merges, 1, "the third bucket triggers a merge");
    assert_eq!(t.buckets().len(), 1, "the three adjacent buckets merged");
    t.verify_invariants().unwrap();
}

/// A mutable bucket emptied by delivery keeps its range; a later ledger
/// above a recovered bucket must not stretch that range over the bucket.
/// Otherwise the small-heap fallback (which hands the heap to the shared
/// queue, never persisted) takes the later messages, and they are missing
/// from the buckets and from a restart.
#[test]
fn emptied_mutable_bucket_does_not_span_a_recovered_bucket() {
    let f = Fixture::new();
    let t = f.tracker(cfg()).unwrap();
    for (l, e, ts) in [(3, 0, 100), (3, 1, 110), (9, 0, 500)] {
        assert!(t.add_message(l, e, ts).unwrap());
    }
    assert_eq!(t.buckets().len(), 1);
    drop(t);
    // Restart: bucket [3,3] is recovered; the dispatcher re-reads ledger 1.
    let t = f.tracker(cfg()).unwrap();
    assert_eq!(t.number_of_delayed_messages(), 2);
    assert!(t.add_message(1, 0, 20).unwrap());
    f.clock.set(20);
    assert_eq!(t.get_scheduled_messages(10).unwrap(), vec![p(1, 0)]);
    // The mutable bucket is empty, its range [1,1]. One message of ledger 4
    // (below the minimum of 2), then ledger 5, then ledger 6 seals.
    for (l, e, ts) in [(4, 0, 200), (5, 0, 300), (5, 1, 310), (6, 0, 400)] {
        assert!(t.add_message(l, e, ts).unwrap());
    }
    let ranges: Vec<(i64, i64)> = t
        .buckets()
        .iter()
        .map(|b| (b.0.start_ledger_id, b.0.end_ledger_id))
        .collect();
    assert_eq!(ranges, vec![(3, 3), (4, 5)]);
    t.verify_invariants().unwrap();
    drop(t);
    // Every sealed, undelivered message is recovered.
    let t = f.tracker(cfg()).unwrap();
    assert_eq!(t.number_of_delayed_messages(), 5);
    for (l, e) in [(3, 0), (3, 1), (4, 0), (5, 0), (5, 1)] {
        assert!(t.contains_message(l, e), "{l}:{e} recovered");
    }
    t.verify_invariants().unwrap();
    f.clock.set(1_000);
    assert_eq!(drain(&t), vec![p(3, 0), p(3, 1), p(4, 0), p(5, 0), p(5, 1)]);
}

/// A message of an immutable bucket's range goes to the shared queue and
/// leaves the (emptied) mutable range alone: a later message of a ledger
/// below the mutable range's end still goes to the shared queue (Pulsar
/// `addMessage`: `ledgerId < mutable end` or an existing bucket), not into
/// the mutable bucket.
#[test]
fn message_of_a_bucket_range_leaves_the_mutable_range_alone() {
    let f = Fixture::new();
    let t = f.tracker(cfg()).unwrap();
    for (l, e, ts) in [(3, 0, 100), (3, 1, 110), (9, 0, 500)] {
        assert!(t.add_message(l, e, ts).unwrap());
    }
    drop(t);
    let t = f.tracker(cfg()).unwrap();
    // Mutable range [1,2], emptied by delivery.
    assert!(t.add_message(1, 0, 20).unwrap());
    assert!(t.add_message(2, 0, 20).unwrap());
    f.clock.set(20);
    assert_eq!(
        t.get_scheduled_messages(10).unwrap(),
        vec![p(1, 0), p(2, 0)]
    );
    let queued = t.shared_queue_len();
    // A new message in bucket [3,3]'s range: shared queue.
    assert!(t.add_message(3, 7, 200).unwrap());
    assert_eq!(t.shared_queue_len(), queued + 1);
    // Ledger 1 is below the mutable range's end (2): shared queue too.
    assert!(t.add_message(1, 5, 200).unwrap());
    assert!(t.add_message(1, 6, 200).unwrap());
    assert_eq!(t.shared_queue_len(), queued + 3);
    assert!(t.add_message(2, 1, 200).unwrap());
    assert_eq!(
        t.shared_queue_len(),
        queued + 3,
        "ledger 2 = the range's end"
    );
    assert_eq!(t.buckets().len(), 1);
    t.verify_invariants().unwrap();
    f.clock.set(1_000);
    assert_eq!(
        drain(&t),
        vec![p(1, 5), p(1, 6), p(2, 1), p(3, 0), p(3, 1), p(3, 7)]
    );
}

/// `max_num_buckets <= 0` disables the trim and merge after a seal: the
/// buckets pile up (an embedder calls `trim_and_merge` itself).
#[test]
fn no_merge_after_seal_when_max_num_buckets_is_zero_or_negative() {
    for max_num_buckets in [0, -1] {
        let f = Fixture::new();
        let t = f
            .tracker(BucketTrackerConfig {
                max_num_buckets,
                ..cfg()
            })
            .unwrap();
        for l in 1..=4 {
            for e in 0..3 {
                t.add_message(l, e, 10 * (e + 1) + l).unwrap();
            }
        }
        assert_eq!(t.stats().seals, 3);
        assert_eq!(t.stats().merges, 0, "max_num_buckets {max_num_buckets}");
        assert_eq!(t.buckets().len(), 3);
        t.verify_invariants().unwrap();
    }
}
