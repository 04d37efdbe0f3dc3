//! Tests of the tracker's self-checks against deliberately broken states:
//! [`verify_invariants`](BucketDelayedDeliveryTracker::verify_invariants)
//! must report each broken invariant as its own [`InvariantViolation`], and
//! [`approx_memory_bytes`](BucketDelayedDeliveryTracker::approx_memory_bytes)
//! must account for every structure it names. The states are built through
//! the public API, then one piece of `Inner` is broken by hand.

use std::cmp::Reverse;
use std::sync::Arc;

use super::*;
use crate::delayed::clock::VirtualClock;
use crate::delayed::config::RecoveryPolicy;
use crate::delayed::error::InvariantViolation;
use crate::delayed::snapshot::bucket_key;
use crate::delayed::storage::MemorySnapshotStorage;

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

fn tracker(config: BucketTrackerConfig) -> BucketDelayedDeliveryTracker {
    BucketDelayedDeliveryTracker::new(
        config,
        Arc::new(MemorySnapshotStorage::new()),
        Arc::new(VirtualClock::new(0)),
    )
    .unwrap()
}

/// Buckets A = [1,1] and B = [2,2] (three one-index segments each, segment
/// 1 loaded: (1,0) and (2,0) in the shared queue, each its bucket's
/// boundary), and (3,0) in the mutable bucket. A sound state.
fn two_buckets() -> BucketDelayedDeliveryTracker {
    let t = tracker(cfg());
    for (l, e, ts) in crate::delayed::tests::TWO_BUCKETS {
        assert!(t.add_message(l, e, ts).unwrap());
    }
    assert_eq!(t.buckets().len(), 2);
    assert_eq!(t.shared_queue_len(), 2);
    t.verify_invariants().unwrap();
    t
}

fn entry(timestamp: u64, ledger_id: i64, entry_id: u32) -> IndexEntry {
    IndexEntry {
        timestamp,
        ledger_id,
        entry_id,
    }
}

/// `CounterEqualsCardinality`: a counter ahead of or behind the runtime
/// index's bitmaps is reported with both numbers.
#[test]
fn verify_reports_counter_not_equal_to_cardinality() {
    for delta in [1, -1] {
        let t = two_buckets();
        t.inner.lock().index.skew_counter_for_test(delta);
        let err = t.verify_invariants().unwrap_err();
        assert_eq!(
            err,
            InvariantViolation::CounterNotCardinality {
                counter: 7u64.wrapping_add_signed(delta),
                cardinality: 7,
            }
        );
        assert_eq!(err.spec_invariant(), Some("CounterEqualsCardinality"));
    }
}

/// `NoSecondLiveCopy`: a tracked position queued twice is reported with
/// its number of queue entries (other live positions in the queue are not
/// counted); a second entry of an untracked (stale) position is allowed, a
/// pop skips it.
#[test]
fn verify_reports_a_second_live_copy_in_the_shared_queue() {
    let t = two_buckets();
    t.inner.lock().shared_queue.push(Reverse(entry(11, 1, 0)));
    let err = t.verify_invariants().unwrap_err();
    assert_eq!(
        err,
        InvariantViolation::SecondLiveCopy {
            ledger_id: 1,
            entry_id: 0,
            entries: 2,
        }
    );
    assert_eq!(err.spec_invariant(), Some("NoSecondLiveCopy"));

    // A third entry of the same position: counted.
    t.inner.lock().shared_queue.push(Reverse(entry(12, 1, 0)));
    assert!(matches!(
        t.verify_invariants(),
        Err(InvariantViolation::SecondLiveCopy { entries: 3, .. })
    ));

    // Stale duplicates of an untracked position are harmless.
    let t = two_buckets();
    {
        let mut inner = t.inner.lock();
        inner.shared_queue.push(Reverse(entry(50, 7, 7)));
        inner.shared_queue.push(Reverse(entry(51, 7, 7)));
    }
    t.verify_invariants().unwrap();
}

/// After a backward mark-delete reset a re-added position may sit next to
/// its own stale entry, so the second-copy check is off until the next
/// clear.
#[test]
fn verify_skips_the_second_copy_check_after_a_backward_reset() {
    let t = two_buckets();
    t.update_mark_delete(Position::new(0, 5));
    t.reset_mark_delete(Position::new(0, 1));
    t.inner.lock().shared_queue.push(Reverse(entry(11, 1, 0)));
    t.verify_invariants().unwrap();
    t.clear().unwrap();
    assert!(t.add_message(5, 0, 100).unwrap());
    assert!(t.add_message(6, 0, 100).unwrap());
    t.inner.lock().shared_queue.push(Reverse(entry(100, 6, 0)));
    t.inner.lock().shared_queue.push(Reverse(entry(100, 6, 0)));
    assert!(matches!(
        t.verify_invariants(),
        Err(InvariantViolation::SecondLiveCopy {
            ledger_id: 6,
            entry_id: 0,
            ..
        })
    ));
}

/// Only a reset that moves the mark-delete backward turns the second-copy
/// check off: a reset to the same position, or forward, keeps reporting a
/// tracked position queued twice.
#[test]
fn verify_keeps_the_second_copy_check_after_a_reset_that_does_not_move_back() {
    for reset_to in [Position::new(0, 5), Position::new(0, 9)] {
        let t = two_buckets();
        t.update_mark_delete(Position::new(0, 5));
        t.reset_mark_delete(reset_to);
        t.inner.lock().shared_queue.push(Reverse(entry(11, 1, 0)));
        assert!(
            matches!(
                t.verify_invariants(),
                Err(InvariantViolation::SecondLiveCopy {
                    ledger_id: 1,
                    entry_id: 0,
                    entries: 2,
                })
            ),
            "reset from 0:5 to {reset_to}"
        );
    }
}

/// Immutable buckets are disjoint and filed under their start ledger: a
/// bucket filed under another key (even without overlapping anything) and
/// a bucket whose range reaches into the next one are both reported.
#[test]
fn verify_reports_misfiled_and_overlapping_buckets() {
    let t = two_buckets();
    {
        let mut inner = t.inner.lock();
        let b = inner.immutable.remove(&2).unwrap();
        inner.immutable.insert(5, b);
    }
    let err = t.verify_invariants().unwrap_err();
    assert_eq!(
        err,
        InvariantViolation::BucketOverlap {
            bucket: bucket_key(2, 2),
        }
    );
    assert_eq!(err.spec_invariant(), None);

    let t = two_buckets();
    t.inner
        .lock()
        .immutable
        .get_mut(&1)
        .unwrap()
        .ctx
        .end_ledger_id = 2;
    assert_eq!(
        t.verify_invariants(),
        Err(InvariantViolation::BucketOverlap {
            bucket: bucket_key(2, 2),
        })
    );
}

/// Each bucket's current segment lies in `1..=last`: 0 and `last + 1` are
/// reported, `last` is fine.
#[test]
fn verify_reports_a_segment_cursor_outside_the_bucket() {
    for (current, ok) in [(0, false), (3, true), (4, false)] {
        let t = two_buckets();
        t.inner
            .lock()
            .immutable
            .get_mut(&2)
            .unwrap()
            .current_segment_entry_id = current;
        let got = t.verify_invariants();
        if ok {
            assert_eq!(got, Ok(()), "segment {current} of 3");
        } else {
            let err = got.unwrap_err();
            assert_eq!(
                err,
                InvariantViolation::SegmentCursor {
                    bucket: bucket_key(2, 2),
                    current,
                    last: 3,
                }
            );
            assert_eq!(err.spec_invariant(), None);
        }
    }
}

/// Every bucket's segment boundary is registered to that bucket, and every
/// registered boundary is some bucket's: an unregistered boundary, one
/// registered to the other bucket, and a registration no bucket owns are
/// all reported.
#[test]
fn verify_reports_unregistered_and_foreign_segment_boundaries() {
    let t = two_buckets();
    t.inner.lock().boundaries.remove(&(2, 0));
    let err = t.verify_invariants().unwrap_err();
    assert_eq!(
        err,
        InvariantViolation::Boundary {
            ledger_id: 2,
            entry_id: 0,
            reason: "not registered",
        }
    );
    assert_eq!(err.spec_invariant(), None);

    let t = two_buckets();
    t.inner.lock().boundaries.insert((2, 0), 1);
    assert_eq!(
        t.verify_invariants(),
        Err(InvariantViolation::Boundary {
            ledger_id: 2,
            entry_id: 0,
            reason: "not registered",
        })
    );

    let t = two_buckets();
    t.inner.lock().boundaries.insert((2, 1), 2);
    assert_eq!(
        t.verify_invariants(),
        Err(InvariantViolation::Boundary {
            ledger_id: 2,
            entry_id: 1,
            reason: "registered for no bucket",
        })
    );

    // The bucket's own boundary gone (exhausted), its registration kept.
    let t = two_buckets();
    t.inner.lock().immutable.get_mut(&1).unwrap().boundary = None;
    assert_eq!(
        t.verify_invariants(),
        Err(InvariantViolation::Boundary {
            ledger_id: 1,
            entry_id: 0,
            reason: "registered for no bucket",
        })
    );
}

/// The memory estimate counts every structure it names: at least the
/// shared queue's and the mutable heap's slots (one [`IndexEntry`] each),
/// each indexed ledger's bitmap (serialized size) plus 48 bytes of
/// bookkeeping, each bucket's frozen bitmap plus 128 bytes, and 24 bytes per
/// boundary-map slot; and not far more than that.
#[test]
fn approx_memory_bytes_accounts_for_queue_index_buckets_and_boundaries() {
    // One message per ledger, each ledger sealed into its own bucket when
    // the next one arrives: 64 ledgers indexed, 63 buckets, 63 queue
    // entries and boundaries, one message in the mutable bucket.
    let t = tracker(BucketTrackerConfig {
        min_index_count_per_bucket: 1,
        ..cfg()
    });
    for l in 1..=64 {
        assert!(t.add_message(l, 0, 1_000 + l).unwrap());
    }
    assert_eq!(t.buckets().len(), 63);
    t.verify_invariants().unwrap();
    let slot = std::mem::size_of::<IndexEntry>();
    let parts = {
        let inner = t.inner.lock();
        assert_eq!(inner.shared_queue.len(), 63);
        assert_eq!(inner.mutable.len(), 1);
        assert_eq!(inner.boundaries.len(), 63);
        inner.shared_queue.capacity() * slot
            + inner.mutable.heap_capacity_bytes()
            + inner
                .index
                .iter()
                .map(|(_, b)| b.serialized_size() + 48)
                .sum::<usize>()
            + inner
                .immutable
                .values()
                .map(|b| b.frozen_bitmap_bytes() + 128)
                .sum::<usize>()
            + inner.boundaries.capacity() * 24
    };
    let got = t.approx_memory_bytes();
    assert!(got >= parts, "estimate {got} < its parts {parts}");
    assert!(
        got <= parts * 3 / 2,
        "estimate {got} > 1.5 x its parts {parts}"
    );
    assert!(
        parts >= 63 * (slot + 24) + 64 * 48 + 63 * 128,
        "parts {parts}"
    );
}

/// Buckets [1,1] .. [n,n] (three one-index segments each, segment 1
/// loaded) and (n+1, 0) in the mutable bucket.
fn buckets(n: i64) -> BucketDelayedDeliveryTracker {
    let t = tracker(cfg());
    for l in 1..=n + 1 {
        for e in 0..3u32 {
            assert!(t
                .add_message(l, i64::from(e), 1_000 * l + 10 * i64::from(e))
                .unwrap());
        }
    }
    assert_eq!(t.buckets().len(), n as usize);
    t
}

/// Pulsar's merge selection: the widest window (4, then 3, then 2) of
/// adjacent buckets in which every bucket still has an unloaded segment and
/// none is merging, whose range does not enclose the mutable bucket's.
#[test]
fn merge_selects_the_widest_eligible_window() {
    let pick = |t: &BucketDelayedDeliveryTracker| t.select_merge(&t.inner.lock());
    let t = buckets(4);
    assert_eq!(pick(&t), Some(vec![1, 2, 3, 4]));
    // Bucket 4 has loaded its last segment: no unloaded segment left.
    t.inner
        .lock()
        .immutable
        .get_mut(&4)
        .unwrap()
        .current_segment_entry_id = 3;
    assert_eq!(pick(&t), Some(vec![1, 2, 3]));
    // Bucket 2 is being merged.
    let t = buckets(4);
    t.inner.lock().immutable.get_mut(&2).unwrap().merging = true;
    assert_eq!(pick(&t), Some(vec![3, 4]));
    // A mutable range overlapping bucket 3: no window may enclose it.
    let t = buckets(4);
    {
        let mut g = t.inner.lock();
        g.mutable.clear();
        g.mutable.add(entry(5_000, 3, 7));
    }
    assert_eq!(pick(&t), Some(vec![1, 2]));
    // With an empty mutable range nothing is enclosed.
    t.inner.lock().mutable.clear();
    assert_eq!(pick(&t), Some(vec![1, 2, 3, 4]));
}

/// Among windows of the same width, a later window wins only if its
/// message sum is no larger AND its next segment is strictly earlier.
#[test]
fn merge_prefers_fewer_messages_only_with_an_earlier_next_segment() {
    let pick = |t: &BucketDelayedDeliveryTracker| t.select_merge(&t.inner.lock());
    // Windows [1..4] and [2..5]; bucket 1 holds 10 messages, bucket 5 one.
    let set = |t: &BucketDelayedDeliveryTracker, ts1: u64, ts5: u64| {
        let mut g = t.inner.lock();
        for (l, n, ts) in [(1, 10, ts1), (5, 1, ts5)] {
            let b = g.immutable.get_mut(&l).unwrap();
            b.number_bucket_delayed_messages = n;
            let cur = b.current_segment_entry_id as usize;
            b.first_schedule_timestamps[cur] = ts;
        }
        for l in 2..=4 {
            let b = g.immutable.get_mut(&l).unwrap();
            let cur = b.current_segment_entry_id as usize;
            b.first_schedule_timestamps[cur] = 900;
        }
    };
    let t = buckets(5);
    set(&t, 100, 50);
    assert_eq!(pick(&t), Some(vec![2, 3, 4, 5]), "fewer and earlier");
    set(&t, 100, 200);
    assert_eq!(pick(&t), Some(vec![1, 2, 3, 4]), "fewer but later");
    set(&t, 100, 100);
    assert_eq!(pick(&t), Some(vec![1, 2, 3, 4]), "fewer, same time");
}

/// A merge whose sources hold nothing tracked any more (every message
/// re-added as expired) retires the sources instead of writing an empty
/// snapshot.
#[test]
fn merge_of_buckets_with_nothing_tracked_retires_them() {
    let t = two_buckets();
    for (l, e) in [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)] {
        assert!(!t.add_message(l, e, 0).unwrap());
    }
    assert!(t.trim_and_merge().unwrap());
    assert!(t.buckets().is_empty());
    let stats = t.stats();
    assert_eq!(
        (stats.merges, stats.merge_failures, stats.snapshot_deletes),
        (1, 0, 2)
    );
    t.verify_invariants().unwrap();
}

/// Recovery keeps the enclosing range of nested bucket keys (a merge's
/// output over its leftover sources) and deletes the enclosed ones; a key
/// that only overlaps a kept range is ignored; every kept bucket counts
/// the messages of its remaining segments.
#[test]
fn recovery_deletes_enclosed_keys_and_ignores_overlapping_ones() {
    use crate::delayed::storage::BucketSnapshotStorage;
    let copy_under = |mem: &MemorySnapshotStorage, id: i64, key: String| {
        let meta = mem.get_metadata(id).unwrap();
        let last = meta.metadata_list.len() as u64;
        let segs = mem.get_segments(id, 1, last).unwrap();
        mem.create(&meta, &segs, &key, &[]).unwrap()
    };
    let keys = |mem: &MemorySnapshotStorage| -> Vec<String> {
        mem.bucket_keys()
            .unwrap()
            .into_iter()
            .map(|k| k.0)
            .collect()
    };
    for overlapping in [false, true] {
        let mem = Arc::new(MemorySnapshotStorage::new());
        let clock = Arc::new(VirtualClock::new(0));
        let t = BucketDelayedDeliveryTracker::new(cfg(), mem.clone(), clock.clone()).unwrap();
        for (l, e, ts) in [(1, 0, 10), (1, 1, 20), (2, 0, 15), (2, 1, 25), (3, 0, 100)] {
            assert!(t.add_message(l, e, ts).unwrap());
        }
        drop(t);
        let ids = mem.snapshot_ids();
        let (a, b) = (ids[0], ids[1]);
        // [1,2] holds ledger 1's messages and encloses [1,1] and [2,2].
        copy_under(&mem, a, bucket_key(1, 2));
        if overlapping {
            // [2,3] overlaps the kept [1,2].
            copy_under(&mem, b, bucket_key(2, 3));
        }
        let t = BucketDelayedDeliveryTracker::new(cfg(), mem.clone(), clock).unwrap();
        let stats = t.stats();
        assert_eq!(
            (stats.recovered_buckets, stats.skipped_buckets),
            (1, if overlapping { 3 } else { 2 }),
            "overlapping: {overlapping}"
        );
        let mut left = keys(&mem);
        left.sort();
        let mut want = vec![bucket_key(1, 2)];
        if overlapping {
            want.push(bucket_key(2, 3));
        }
        assert_eq!(
            left, want,
            "enclosed keys deleted, the overlapping one left"
        );
        assert_eq!(
            t.inner.lock().immutable[&1].number_bucket_delayed_messages,
            2
        );
        assert_eq!(t.number_of_delayed_messages(), 2);
        t.verify_invariants().unwrap();
    }
}
