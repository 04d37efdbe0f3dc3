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

use pulsar_core::deletion::CursorDeletionState;
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

impl Broker {
    /// The handle's view of the subscription: its cursor (persisted state)
    /// and live deletion state.
    fn subscription(&self) -> CursorSubscription {
        CursorSubscription::new(Arc::clone(&self.sub_cursor), Arc::clone(&self.deletion))
    }

    /// Persists the subscription's mark-delete and individually deleted
    /// ranges (Pulsar's cursor persist).
    fn persist_subscription(&self) {
        self.sub_cursor
            .mark_delete_with_ranges(
                self.deletion.mark_delete_position(),
                self.deletion.individually_deleted_ranges(),
            )
            .unwrap();
    }
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
        Arc::new(b.subscription()),
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

/// The commits the replay recovered that the subscription's persisted
/// state lacks, applied to the subscription as the embedder does. Returns
/// them.
fn apply_recovered_commits(h: &PendingAckHandle, b: &Broker) -> Vec<CommittedAck> {
    let acks = h.committed_acks();
    let view = b.subscription();
    for a in &acks {
        view.apply(a, b.topic.as_ref()).unwrap();
    }
    acks
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
    let ack_entry;
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
        ack_entry = append(
            &h,
            PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(entry19)]),
        )
        .unwrap()
        .position;
        append(&h, PendingAckRecord::commit(t, AckType::Individual)).unwrap();
        assert!(
            b.pa_cursor.mark_delete_position() < ack_entry,
            "the log keeps the commit until the subscription persists it"
        );
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
    let recovered = apply_recovered_commits(&h, &b);
    assert!(
        b.deletion.is_message_deleted(entry19),
        "a committed transactional ack of {entry19} was lost in the crash: the replay did not re-apply it (pending-ack log mark-delete {}, subscription mark-delete {})",
        b.pa_cursor.mark_delete_position(),
        b.sub_cursor.mark_delete_position(),
    );
    assert_eq!(recovered, vec![CommittedAck::Entry(entry19)]);
    // Not persisted yet: the log still holds the commit.
    h.subscription_persisted();
    assert!(b.pa_cursor.mark_delete_position() < ack_entry);
    // Persisted: the log may forget it, and the next replay has nothing to
    // re-apply.
    b.persist_subscription();
    h.subscription_persisted();
    assert!(b.pa_cursor.mark_delete_position() >= ack_entry);
    assert!(h.committed_acks().is_empty());
    h.close();
    pool.shutdown();
    drop((h, b));
    let store: Arc<dyn LedgerStore> = Arc::new(RedbStore::open(&path).unwrap());
    let b = open_broker(store);
    assert!(b.deletion.is_message_deleted(entry19));
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
    let h = start_handle(&b, &pool);
    assert!(apply_recovered_commits(&h, &b).is_empty());
}

/// A cumulative commit survives the same crash: the mark-delete it moves is
/// re-applied by the replay.
#[test]
fn a_committed_cumulative_ack_survives_a_crash_before_the_subscription_is_persisted() {
    let _w = watchdog::arm("cumulative commit across a crash", Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let upto;
    {
        let store: Arc<dyn LedgerStore> = Arc::new(RedbStore::open(&path).unwrap());
        let b = open_broker(store);
        let mut ps = Vec::new();
        for i in 0..10 {
            ps.push(b.topic.append(format!("m{i}").as_bytes()).unwrap());
        }
        upto = ps[6];
        let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
        let h = start_handle(&b, &pool);
        let t = TxnId::new(7, 3);
        append(&h, PendingAckRecord::cumulative_ack(t, upto)).unwrap();
        append(&h, PendingAckRecord::commit(t, AckType::Cumulative)).unwrap();
        b.deletion.mark_delete(upto, b.topic.as_ref()).unwrap();
        h.close();
        pool.shutdown();
    }
    let store: Arc<dyn LedgerStore> = Arc::new(RedbStore::open(&path).unwrap());
    let b = open_broker(store);
    assert!(b.deletion.mark_delete_position() < upto);
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap();
    let h = start_handle(&b, &pool);
    assert_eq!(
        apply_recovered_commits(&h, &b),
        vec![CommittedAck::MarkDelete(upto)]
    );
    assert_eq!(b.deletion.mark_delete_position(), upto);
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
