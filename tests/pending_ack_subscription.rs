//! The pending-ack handle and its subscription (Pulsar's
//! `PendingAckHandleImpl` with `MLPendingAckStore`):
//!
//! - a committed transactional ack survives a crash between the commit
//!   becoming durable and the subscription cursor being persisted: the
//!   pending-ack log is trimmed only up to what the subscription holds
//!   durably, and the replay after the restart hands the commit back to be
//!   re-applied to the subscription;
//! - a transactional ack of an entry the subscription already deleted
//!   (below its mark-delete, or individually deleted) is Pulsar's
//!   `TransactionConflictException`, and nothing is written.
//!
//! The crash is real: everything is dropped without persisting the
//! subscription, and the redb store is reopened on the same file.
#![cfg(not(any(loom, feature = "shuttle")))]

#[path = "common/watchdog.rs"]
mod watchdog;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pulsar_core::cursor::CursorDeletionState;
use pulsar_core::ledger::{LedgerConfig, LedgerStore, ManagedCursor, ManagedLedger, RedbStore};
use pulsar_core::pending_ack::*;
use pulsar_core::Position;

const TOPIC: &str = "persistent://public/default/txn-topic";
const SUB: &str = "sub";

/// The broker's pieces for one subscription on `store`: the topic ledger
/// with its subscription cursor and the deletion state recovered from it,
/// the pending-ack log and its cursor.
struct Broker {
    topic: Arc<ManagedLedger>,
    sub_cursor: Arc<ManagedCursor>,
    deletion: Arc<CursorDeletionState>,
    pa_cursor: Arc<ManagedCursor>,
}

fn open_broker(store: Arc<dyn LedgerStore>) -> Broker {
    let topic = ManagedLedger::open(TOPIC, LedgerConfig::default(), Arc::clone(&store)).unwrap();
    let sub_cursor = Arc::new(topic.open_cursor(SUB).unwrap());
    let deletion = Arc::new(
        CursorDeletionState::recover(
            sub_cursor.mark_delete_position(),
            &sub_cursor.individually_deleted_ranges(),
        )
        .unwrap(),
    );
    let pa = ManagedLedger::open(
        format!("{TOPIC}-{SUB}__transaction_pending_ack"),
        LedgerConfig::default(),
        store,
    )
    .unwrap();
    let pa_cursor = Arc::new(pa.open_cursor("__pending_ack_state").unwrap());
    Broker {
        topic,
        sub_cursor,
        deletion,
        pa_cursor,
    }
}

fn start_handle(b: &Broker, pool: &ReplayExecutorPool) -> PendingAckHandle {
    let h = PendingAckHandle::new(
        format!("{TOPIC}-{SUB}"),
        Arc::clone(&b.pa_cursor),
        pool,
        Arc::new(InlineReads),
        Arc::new(VirtualTimer::new()),
        HandleConfig::default(),
    )
    .unwrap();
    h.init();
    pool.run_pending();
    assert_eq!(h.state(), HandleState::Ready);
    h
}

fn append(h: &PendingAckHandle, r: PendingAckRecord) -> Result<AppendAck, PendingAckError> {
    let out = Arc::new(Mutex::new(None));
    let o = Arc::clone(&out);
    h.append(r, Box::new(move |res| *o.lock().unwrap() = Some(res)));
    let res = out.lock().unwrap().take();
    res.expect("appended synchronously (batching off)")
}

/// The commits the replay recovered, as the embedder applies them to the
/// subscription: individually deleted entries and the mark-delete.
fn apply_recovered_commits(h: &PendingAckHandle, b: &Broker) {
    let s = h.summary();
    let deleted: Vec<Position> = s.deleted.iter().copied().collect();
    if !deleted.is_empty() {
        b.deletion.delete(&deleted, b.topic.as_ref()).unwrap();
    }
    if s.mark_delete > b.deletion.mark_delete_position() {
        b.deletion.mark_delete(s.mark_delete, b.topic.as_ref()).unwrap();
    }
}

/// A transaction acks entry 19 of the topic, its commit becomes durable in
/// the pending-ack log and is applied to the subscription in memory; the
/// process dies before the subscription cursor is persisted. After the
/// restart the replay must hand the commit back, so entry 19 is deleted for
/// the subscription and never delivered again.
#[test]
fn a_committed_ack_survives_a_crash_before_the_subscription_is_persisted() {
    let _w = watchdog::arm("committed ack across a crash", Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let entry19;
    {
        let store: Arc<dyn LedgerStore> = Arc::new(RedbStore::open(&path).unwrap());
        let b = open_broker(store);
        let mut last = Position::new(-1, -1);
        for i in 0..25 {
            last = b.topic.append(format!("m{i}").as_bytes()).unwrap();
        }
        entry19 = Position::new(last.ledger_id, 19);
        let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
        let h = start_handle(&b, &pool);
        let t = TxnId::new(7, 1);
        append(
            &h,
            PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(entry19)]),
        )
        .unwrap();
        append(&h, PendingAckRecord::commit(t, AckType::Individual)).unwrap();
        // The embedder applies the commit to the subscription in memory ...
        b.deletion.delete(&[entry19], b.topic.as_ref()).unwrap();
        assert!(b.deletion.is_message_deleted(entry19));
        // ... and the process dies before the subscription is persisted.
        h.close();
        pool.shutdown();
    }
    let store: Arc<dyn LedgerStore> = Arc::new(RedbStore::open(&path).unwrap());
    let b = open_broker(store);
    assert!(
        !b.deletion.is_message_deleted(entry19),
        "the subscription's persisted state never held the commit"
    );
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
    let h = start_handle(&b, &pool);
    apply_recovered_commits(&h, &b);
    assert!(
        b.deletion.is_message_deleted(entry19),
        "a committed transactional ack of {entry19} was lost in the crash: the replay did not re-apply it (pending-ack log mark-delete {}, subscription mark-delete {})",
        b.pa_cursor.mark_delete_position(),
        b.sub_cursor.mark_delete_position(),
    );
}

/// Pulsar checks the subscription cursor before accepting a transactional
/// ack: an entry at or below its mark-delete, or individually deleted, is a
/// `TransactionConflictException`, and nothing is written to the log.
#[test]
fn a_transactional_ack_of_an_entry_the_subscription_deleted_is_a_conflict() {
    let _w = watchdog::arm("conflict with the subscription", Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn LedgerStore> = Arc::new(RedbStore::open(dir.path().join("s.redb")).unwrap());
    let b = open_broker(store);
    let mut ps = Vec::new();
    for i in 0..10 {
        ps.push(b.topic.append(format!("m{i}").as_bytes()).unwrap());
    }
    // Entries 0..=3 below the mark-delete, entry 6 individually deleted.
    b.deletion.mark_delete(ps[3], b.topic.as_ref()).unwrap();
    b.deletion.delete(&[ps[6]], b.topic.as_ref()).unwrap();
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
    let h = start_handle(&b, &pool);
    let log_end = b.pa_cursor.ledger().last_confirmed_entry();
    let t = TxnId::new(7, 2);
    for p in [ps[2], ps[3], ps[6]] {
        let r = append(
            &h,
            PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p)]),
        );
        assert!(
            matches!(
                r,
                Err(PendingAckError::AckConflict { position, holder: None, .. }) if position == p
            ),
            "a transactional ack of {p}, already deleted by the subscription, must be a conflict; got {r:?}"
        );
    }
    let r = append(&h, PendingAckRecord::cumulative_ack(t, ps[3]));
    assert!(
        matches!(r, Err(PendingAckError::AckConflict { holder: None, .. })),
        "a cumulative ack at the subscription's mark-delete must be a conflict; got {r:?}"
    );
    assert_eq!(
        b.pa_cursor.ledger().last_confirmed_entry(),
        log_end,
        "nothing was written to the pending-ack log"
    );
    assert!(h.summary().individual.is_empty());
    // An entry the subscription has not deleted is accepted.
    append(
        &h,
        PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(ps[7])]),
    )
    .unwrap();
}
