//! Transaction buffer snapshots through the core: written to the
//! namespace's `__transaction_buffer_snapshot` topic at Pulsar's triggers,
//! used by recovery, and never trusted when they do not decode.

use super::*;
use crate::broker::txn::snapshot::{
    snapshot_entry, SnapshotConfig, TransactionBufferSnapshot, SNAPSHOT_TOPIC,
};
use crate::broker::txn::TxnBuffer;

const SNAP_TOPIC: &str = "persistent://public/default/__transaction_buffer_snapshot";

fn topic_buffer(b: &Broker) -> TxnBuffer {
    b.topics()[TOPIC].buffer.lock().clone()
}

/// The buffer a read of the whole topic gives (the reference).
fn full_replay(b: &Broker) -> TxnBuffer {
    TxnBuffer::recover(&b.topics()[TOPIC].ml).unwrap()
}

#[test]
fn the_first_transactional_entry_of_a_topic_takes_its_first_snapshot() {
    let Flow { _dir, mut b, input } = flow_setup();
    assert_eq!(b.txn_buffer_snapshot(TOPIC).unwrap(), None);
    assert!(
        !b.topics().contains_key(SNAP_TOPIC),
        "a namespace without transactions gets no snapshot topic"
    );
    let t = new_txn(&mut b, 1, 60_000);
    add_partition(&mut b, 1, t);
    let m = receipt_pos(&txn_send(&mut b, 1, 1, 1, t));
    let s = b
        .txn_buffer_snapshot(TOPIC)
        .unwrap()
        .expect("first snapshot");
    assert_eq!(s.topic_name.as_deref(), Some(TOPIC));
    assert_eq!(s.max_read_position(), input, "taken before the entry {m}");
    assert_eq!(s.aborts, Some(vec![]));
    assert!(SNAP_TOPIC.ends_with(SNAPSHOT_TOPIC));
    assert!(b.topics().contains_key(SNAP_TOPIC));
    assert!(
        b.topics()[SNAP_TOPIC].buffer.lock().ongoing().is_empty(),
        "a snapshot topic has no transaction buffer"
    );
}

/// `transactionBufferSnapshotMaxTransactionCount`: the ending transaction
/// that reaches the count takes a snapshot; its aborted set and max read
/// position are the buffer's.
#[test]
fn every_n_ended_transactions_take_a_snapshot() {
    let Flow { _dir, mut b, .. } = flow_setup();
    b.set_txn_snapshot_config(SnapshotConfig {
        max_transaction_count: 2,
        min_time_ms: 1_000_000,
    });
    let mut last = None;
    for (i, commit) in [false, true, false, true].into_iter().enumerate() {
        let t = new_txn(&mut b, 1, 60_000);
        add_partition(&mut b, 1, t);
        txn_send(&mut b, 1, 1, 1 + i as u64, t);
        assert_eq!(end_txn(&mut b, 1, t, commit).error, None);
        let s = b.txn_buffer_snapshot(TOPIC).unwrap().unwrap();
        if i % 2 == 1 {
            let lac = b.topics()[TOPIC].ml.last_confirmed_entry();
            assert_eq!(s, topic_buffer(&b).snapshot(TOPIC, lac), "after {}", i + 1);
            assert_eq!(s.aborts.as_ref().unwrap().len(), i / 2 + 1);
        } else if let Some(prev) = &last {
            assert_eq!(&s, prev, "no snapshot after {} ended", i + 1);
        }
        last = Some(s);
    }
}

/// `transactionBufferSnapshotMinTimeInMillis`: a topic whose max read
/// position moved (here by plain messages) takes a snapshot when the
/// interval passes, through `poll_timeout` / `handle_timeout`.
#[test]
fn the_interval_takes_a_snapshot_when_the_max_read_position_moved() {
    let Flow { _dir, mut b, .. } = flow_setup();
    let t = new_txn(&mut b, 1, 60_000);
    add_partition(&mut b, 1, t);
    txn_send(&mut b, 1, 1, 1, t);
    assert_eq!(end_txn(&mut b, 1, t, true).error, None);
    let before = b.txn_buffer_snapshot(TOPIC).unwrap().unwrap();
    let p = send(&mut b, 1, 1, 2, &entry(None, None, None));
    assert_eq!(b.poll_timeout(), Some(T0 + 5_000));
    b.handle_timeout(T0 + 4_999);
    assert_eq!(b.txn_buffer_snapshot(TOPIC).unwrap().unwrap(), before);
    b.handle_timeout(T0 + 5_000);
    let after = b.txn_buffer_snapshot(TOPIC).unwrap().unwrap();
    assert_eq!(after.max_read_position(), p);
    assert_eq!(b.poll_timeout(), None, "nothing moved since");
}

/// A crash with transactions open, committed and aborted: the restarted
/// node recovers the buffer from the snapshot and the topic's tail, equal
/// to a read of the whole topic; the open transaction still commits.
#[test]
fn recovery_from_the_snapshot_equals_a_full_read_across_a_crash() {
    let Flow { _dir, mut b, input } = flow_setup();
    b.set_txn_snapshot_config(SnapshotConfig {
        max_transaction_count: 1,
        min_time_ms: 1_000_000,
    });
    let aborted = new_txn(&mut b, 1, 60_000);
    add_partition(&mut b, 1, aborted);
    let a = receipt_pos(&txn_send(&mut b, 1, 1, 1, aborted));
    let open = new_txn(&mut b, 1, 60_000);
    add_partition(&mut b, 1, open);
    let o = receipt_pos(&txn_send(&mut b, 1, 1, 2, open));
    assert_eq!(end_txn(&mut b, 1, aborted, false).error, None);
    let s = b.txn_buffer_snapshot(TOPIC).unwrap().unwrap();
    assert_eq!(s.max_read_position(), o.previous_in_ledger());
    send(&mut b, 1, 1, 3, &entry(None, None, None));
    drop(b);
    let mut b = core(&_dir);
    connect(&mut b, 2);
    subscribe(&mut b, 2, 8, "obs", sub_type::SHARED, "o");
    assert_eq!(topic_buffer(&b), full_replay(&b));
    assert!(topic_buffer(&b).is_aborted(aborted));
    assert_eq!(
        delivered(&flow(&mut b, 2, 8, 10), 8),
        vec![input],
        "neither {a} (aborted) nor {o} (open) nor what follows it"
    );
    let out = end_txn_out(&mut b, 2, open, true);
    assert_eq!(txn_response(&out).error, None);
    assert_eq!(delivered(&out, 8).first(), Some(&o));
}

/// A snapshot that does not decode is not used: the topic is read from
/// its first entry and opens with the right buffer (no panic, no loss).
#[test]
fn a_corrupt_snapshot_falls_back_to_a_full_read() {
    let Flow { _dir, mut b, input } = flow_setup();
    let aborted = new_txn(&mut b, 1, 60_000);
    add_partition(&mut b, 1, aborted);
    txn_send(&mut b, 1, 1, 1, aborted);
    assert_eq!(end_txn(&mut b, 1, aborted, false).error, None);
    let reference = topic_buffer(&b);
    drop(b);
    // The latest snapshot message of the topic: good framing, bad Avro.
    let store = RedbStore::open(_dir.path().join("store.redb")).unwrap();
    let sml =
        ManagedLedger::open(SNAP_TOPIC, LedgerConfig::default(), Arc::new(store.clone())).unwrap();
    let good = snapshot_entry(
        TOPIC,
        &TransactionBufferSnapshot {
            topic_name: Some(TOPIC.into()),
            max_read_position_ledger_id: 1,
            max_read_position_entry_id: 0,
            aborts: None,
        },
        9,
        9,
    );
    let mut bad = good.clone();
    let n = bad.len();
    bad.truncate(n - 3);
    // Re-frame with a valid checksum so only the Avro payload is bad.
    let body = bad[6..].to_vec();
    bad[2..6].copy_from_slice(&crc32c(&body).to_be_bytes());
    sml.append(&bad).unwrap();
    drop(sml);
    drop(store);
    let mut b = core(&_dir);
    connect(&mut b, 2);
    assert_eq!(b.txn_buffer_snapshot(TOPIC).unwrap(), None, "not used");
    subscribe(&mut b, 2, 8, "obs", sub_type::SHARED, "o");
    assert_eq!(topic_buffer(&b), reference);
    assert_eq!(delivered(&flow(&mut b, 2, 8, 10), 8), vec![input]);
}

/// Consumed-ledger trimming of `__transaction_buffer_snapshot` keeps the
/// ledger holding each topic's latest snapshot, the one its transaction
/// buffer recovers from (Pulsar compacts that system topic to the latest
/// message per key, it never deletes it), and still deletes the ledgers
/// holding only superseded snapshots. No subscription holds the system
/// topic, and after a restart its deduplication cursor has replayed (and
/// snapshotted before trimming) every entry, so only the snapshot index
/// holds it. The topic's buffer then recovers from that snapshot, after the
/// trim and across a second restart: its aborted transaction stays aborted
/// and its committed message is delivered.
#[test]
fn trimming_the_snapshot_topic_keeps_each_topics_latest_snapshot() {
    const OTHER: &str = "persistent://public/default/u";
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        let mut c = BrokerConfig::new("pulsar://node:6650");
        c.ledger.max_entries_per_ledger = 2;
        c.retention_check_interval_ms = 1_000;
        c
    };
    let mut b = Broker::new(open_store(&dir), config(), T0);
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    let tc = tc_connect(&mut b, 1)[0]
        .1
        .tc_client_connect_response
        .clone();
    assert_eq!(tc.unwrap().error, None);
    // The observer holds every entry of the topic itself.
    subscribe(&mut b, 1, 8, "obs", sub_type::SHARED, "o");
    let input = send(&mut b, 1, 1, 0, &entry(None, None, None));
    b.set_txn_snapshot_config(SnapshotConfig {
        max_transaction_count: 1,
        min_time_ms: 1_000_000,
    });
    // The topic's snapshots: its first one, after the abort, after the
    // commit (the latest).
    let aborted = new_txn(&mut b, 1, 60_000);
    add_partition(&mut b, 1, aborted);
    let a = receipt_pos(&txn_send(&mut b, 1, 1, 1, aborted));
    assert_eq!(end_txn(&mut b, 1, aborted, false).error, None);
    let committed = new_txn(&mut b, 1, 60_000);
    add_partition(&mut b, 1, committed);
    let c = receipt_pos(&txn_send(&mut b, 1, 1, 2, committed));
    assert_eq!(end_txn(&mut b, 1, committed, true).error, None);
    let latest = b.txn_buffer_snapshot(TOPIC).unwrap().expect("latest");
    assert_eq!(latest.aborts.as_ref().map(Vec::len), Some(1));
    // Another topic's snapshots fill the ledgers after it.
    b.topic(OTHER).unwrap();
    for _ in 0..4 {
        b.take_txn_buffer_snapshot(OTHER).unwrap();
    }
    drop(b);
    let snap_ledgers = |b: &Broker| -> Vec<i64> {
        let ml = &b.topics()[SNAP_TOPIC].ml;
        ml.ledgers().into_iter().map(|(id, _)| id).collect()
    };
    // Restarted: the snapshot topic is open (its index read), the topic
    // is not yet.
    let mut b = Broker::new(open_store(&dir), config(), T0);
    connect(&mut b, 2);
    assert_eq!(b.txn_buffer_snapshot(TOPIC).unwrap(), Some(latest.clone()));
    assert!(!b.topics().contains_key(TOPIC));
    let before = snap_ledgers(&b);
    let at = b.txn.snapshot_index[SNAP_TOPIC][TOPIC];
    assert!(
        before.first().is_some_and(|l| *l < at.ledger_id),
        "a ledger of superseded snapshots precedes the latest one {at}: {before:?}"
    );
    assert!(
        before.last().is_some_and(|l| *l > at.ledger_id + 1),
        "closed ledgers of another topic's snapshots follow {at}: {before:?}"
    );
    b.trim_ledgers(T0 + 1_000);
    let after = snap_ledgers(&b);
    assert_eq!(
        after.first(),
        Some(&at.ledger_id),
        "only the ledgers before the latest snapshot {at} are deleted: {before:?} -> {after:?}"
    );
    assert_eq!(b.txn_buffer_snapshot(TOPIC).unwrap(), Some(latest.clone()));
    let check = |b: &mut Broker, conn: u64| {
        subscribe(b, conn, 8, "obs", sub_type::SHARED, "o");
        assert!(topic_buffer(b).is_aborted(aborted));
        assert!(topic_buffer(b).ongoing().is_empty());
        assert_eq!(topic_buffer(b), full_replay(b));
        assert_eq!(
            delivered(&flow(b, conn, 8, 10), 8),
            vec![input, c],
            "the committed message, not the aborted {a}"
        );
    };
    // The topic opens after the trim: its buffer recovers from the kept
    // snapshot.
    check(&mut b, 2);
    drop(b);
    let mut b = Broker::new(open_store(&dir), config(), T0);
    connect(&mut b, 3);
    assert_eq!(b.txn_buffer_snapshot(TOPIC).unwrap(), Some(latest));
    check(&mut b, 3);
}
