//! Admin clear-backlog (`clear_backlog.rs`, Pulsar's
//! `PersistentSubscription.clearBacklog`) and the consumer-set rewind of a
//! Shared subscription (`consumer_set.rs`, Pulsar's
//! `PersistentDispatcherMultipleConsumers.addConsumer` on an empty
//! consumer list), through the core's inputs.

use super::*;
use crate::delayed::{BucketSnapshotStorage, FaultyStorage};

fn positions(out: &[(u64, BrokerCommand, usize)]) -> Vec<Position> {
    out.iter()
        .filter_map(|(_, f, _)| f.message.as_ref())
        .map(|m| Position::new(m.message_id.ledger_id as i64, m.message_id.entry_id as i64))
        .collect()
}

/// Every unacknowledged entry and every delayed message is skipped, the
/// mark-delete is the last entry (durable: a restart delivers nothing of
/// it), and what is published afterwards is delivered.
#[test]
fn clear_backlog_skips_unacknowledged_and_delayed_entries_durably() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = core(&dir);
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    let plain: Vec<Position> = (0..3)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    let later = T0 as i64 + 3_600_000;
    for i in 3..5 {
        send(&mut b, 1, 1, i, &entry(None, None, Some(later)));
    }
    assert_eq!(positions(&flow(&mut b, 1, 7, 100)), plain);
    assert_eq!(sub(&b, "s").tracker().number_of_delayed_messages(), 2);
    let done = b.clear_backlog("t", "s", T0).unwrap();
    assert!(done.delayed_cleared);
    assert_eq!(
        done.mark_delete,
        b.topics()[TOPIC].ml.last_confirmed_entry()
    );
    assert_eq!(sub(&b, "s").mark_delete(), done.mark_delete);
    assert_eq!(sub(&b, "s").tracker().number_of_delayed_messages(), 0);
    assert_eq!(sub(&b, "s").replay_len(), 0);
    assert!(frames(&mut b).is_empty());
    // The delayed messages never come, not even at their time.
    b.handle_timeout(later as u64 + 1);
    assert!(positions(&frames(&mut b)).is_empty());
    let next = send(&mut b, 1, 1, 5, &entry(None, None, None));
    // The send dispatched it at once (permits left).
    drop(b);
    // After a restart nothing below the cleared mark-delete comes back.
    let mut b = core(&dir);
    connect(&mut b, 2);
    subscribe(&mut b, 2, 8, "s", sub_type::SHARED, "c");
    assert_eq!(positions(&flow(&mut b, 2, 8, 100)), vec![next]);
    assert!(b.clear_backlog("t", "nope", T0).is_err());
    assert!(b.clear_backlog("non-persistent://a/b/c", "s", T0).is_err());
}

/// A clear whose snapshot delete fails keeps buckets, but the cleared
/// backlog's mark-delete untracks every message they hold: the tracker
/// counts none and delivers none.
#[test]
fn a_clear_whose_snapshot_delete_fails_still_untracks_everything() {
    let dir = tempfile::tempdir().unwrap();
    let faulty: Arc<
        std::sync::Mutex<Vec<Arc<FaultyStorage<crate::delayed::RedbSnapshotStorage>>>>,
    > = Arc::default();
    let mut config = BrokerConfig::new("pulsar://node:6650");
    config.ledger.max_entries_per_ledger = 2;
    config.delayed.min_index_count_per_bucket = 2;
    let keep = Arc::clone(&faulty);
    config.snapshot_storage = Some(SnapshotStorageHook::new(move |_, _, redb| {
        let f = Arc::new(FaultyStorage::new(redb));
        keep.lock().unwrap().push(Arc::clone(&f));
        f as Arc<dyn BucketSnapshotStorage>
    }));
    let mut b = Broker::new(open_store(&dir), config, T0);
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    assert!(positions(&flow(&mut b, 1, 7, 100)).is_empty());
    let later = T0 as i64 + 3_600_000;
    for i in 0..9 {
        send(&mut b, 1, 1, i, &entry(None, None, Some(later + i as i64)));
    }
    assert!(
        !sub(&b, "s").tracker().buckets().is_empty(),
        "sealed buckets to clear"
    );
    let f = Arc::clone(&faulty.lock().unwrap()[0]);
    f.arm(crate::delayed::FaultPlan {
        create: 0,
        read: 0,
        delete: 1_000,
    });
    let done = b.clear_backlog("t", "s", T0).unwrap();
    assert!(!done.delayed_cleared);
    let t = sub(&b, "s").tracker();
    assert_eq!(t.number_of_delayed_messages(), 0);
    t.verify_invariants().unwrap();
    b.handle_timeout(later as u64 + 100);
    assert!(positions(&frames(&mut b)).is_empty());
}

/// The first consumer of a Shared subscription after every consumer left
/// rewinds the cursor to the mark-delete: the unacknowledged entries come
/// again in position order, each once, the acknowledged one never.
#[test]
fn the_first_consumer_after_all_left_reads_the_unacknowledged_again_once() {
    let (_d, mut b) = with_producer();
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    let ps: Vec<Position> = (0..4)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    assert_eq!(positions(&flow(&mut b, 1, 7, 100)), ps);
    ack(&mut b, 1, 7, false, vec![mid(ps[1], vec![])], None);
    frames(&mut b);
    let rewinds = sub(&b, "s").counters.consumer_set_rewinds;
    connect(&mut b, 2);
    b.handle_close(1, T0);
    frames(&mut b);
    subscribe(&mut b, 2, 8, "s", sub_type::SHARED, "c2");
    assert_eq!(sub(&b, "s").counters.consumer_set_rewinds, rewinds + 1);
    assert_eq!(
        positions(&flow(&mut b, 2, 8, 100)),
        vec![ps[0], ps[2], ps[3]]
    );
    // A second consumer joining a live consumer set rewinds nothing.
    subscribe(&mut b, 2, 9, "s", sub_type::SHARED, "c3");
    assert_eq!(sub(&b, "s").counters.consumer_set_rewinds, rewinds + 1);
    assert!(positions(&flow(&mut b, 2, 9, 100)).is_empty());
}

/// A delayed message that fell due while the subscription had no
/// consumer is handed out by the tracker and met again by the rewound
/// cursor's read (an expired re-add): it is delivered exactly once.
#[test]
fn a_due_delayed_message_met_by_the_rewound_read_goes_out_once() {
    let (_d, mut b) = with_producer();
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    let at = T0 as i64 + 60_000;
    let p = send(&mut b, 1, 1, 0, &entry(None, None, Some(at)));
    assert!(positions(&flow(&mut b, 1, 7, 100)).is_empty());
    assert_eq!(sub(&b, "s").tracker().number_of_delayed_messages(), 1);
    b.handle_close(1, T0);
    frames(&mut b);
    // Its time comes with no consumer attached.
    let now = at as u64 + 1_000;
    b.handle_timeout(now);
    connect(&mut b, 2);
    let c = subscribe_cmd(8, "s", sub_type::SHARED, "c2", 0);
    b.handle_frame(2, &enc(&c), &[], now).unwrap();
    frames(&mut b);
    let f = BrokerCommand {
        r#type: ty::FLOW,
        flow: Some(CommandFlow {
            consumer_id: 8,
            message_permits: 100,
        }),
        ..Default::default()
    };
    b.handle_frame(2, &enc(&f), &[], now).unwrap();
    assert_eq!(positions(&frames(&mut b)), vec![p]);
    assert_eq!(sub(&b, "s").tracker().number_of_delayed_messages(), 0);
    b.handle_timeout(now + 10_000);
    assert!(positions(&frames(&mut b)).is_empty());
}
