//! The four replay/handle paths of seed 001's promise ("a failed attempt
//! releases its replay thread; an incomplete replay is never reported
//! complete"), end to end on the redb store where storage matters:
//!
//! 1. a lost read callback ended by `close()`: the executor is free at once,
//!    the late callback is ignored safely;
//! 2. a reused cursor whose read position moved past the mark-delete: every
//!    attempt starts at the first entry after the mark-delete, and Ready
//!    means every record up to the attempt's log end was applied;
//! 3. a closed cursor: the retry reopens it through the managed ledger, or
//!    waiters fail with a clear error after a bounded number of attempts;
//! 4. batch-index acks: per-index conflicts, commit/abort of one txn's
//!    indexes only.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use pulsar_core::ledger::{LedgerConfig, LedgerStore, ManagedCursor, ManagedLedger, MemoryStore};
use pulsar_core::pending_ack::*;
use pulsar_core::Position;

const CURSOR: &str = "__pending_ack_state";

fn manual() -> (Arc<ReplayExecutorPool>, Arc<VirtualTimer>) {
    (
        ReplayExecutorPool::new(1, ExecutorMode::Manual).unwrap(),
        Arc::new(VirtualTimer::new()),
    )
}

fn ledger(store: Arc<dyn LedgerStore>, name: &str) -> Arc<ManagedLedger> {
    ManagedLedger::open(name, LedgerConfig::default(), store).unwrap()
}

fn new_handle(
    name: &str,
    cursor: &Arc<ManagedCursor>,
    pool: &ReplayExecutorPool,
    timer: &Arc<VirtualTimer>,
    dispatcher: Arc<dyn ReadDispatcher>,
    cfg: HandleConfig,
) -> PendingAckHandle {
    PendingAckHandle::new(
        name,
        Arc::clone(cursor),
        pool,
        dispatcher,
        Arc::clone(timer) as Arc<dyn Timer>,
        cfg,
    )
    .unwrap()
}

/// Runs the executor and the virtual timer until `h` is Ready or Error, at
/// most `max_fires` timer tasks; returns whether it settled.
fn drive(
    pool: &ReplayExecutorPool,
    timer: &VirtualTimer,
    h: &PendingAckHandle,
    max_fires: usize,
) -> bool {
    for _ in 0..=max_fires {
        pool.run_pending();
        if matches!(h.state(), HandleState::Ready | HandleState::Error) {
            return true;
        }
        if !timer.fire_next() {
            return false;
        }
    }
    false
}

/// Appends through the handle and returns the callback's result.
fn append(h: &PendingAckHandle, r: PendingAckRecord) -> Result<AppendAck, PendingAckError> {
    let out = Arc::new(Mutex::new(None));
    let o = Arc::clone(&out);
    h.append(
        r,
        Box::new(move |res| {
            *o.lock().unwrap() = Some(res);
        }),
    );
    let res = out.lock().unwrap().take();
    res.expect("append callback ran (batching off: synchronous)")
}

fn batch(p: Position, size: i32, idx: &[u32]) -> AckedPosition {
    AckedPosition::batch_indexes(p, size, idx).unwrap()
}

fn ready_handle_on_empty_log(name: &str) -> (PendingAckHandle, Arc<ManagedCursor>) {
    let (pool, timer) = manual();
    let ml = ledger(Arc::new(MemoryStore::new()), name);
    let cursor = Arc::new(ml.open_cursor(CURSOR).unwrap());
    let h = new_handle(
        name,
        &cursor,
        &pool,
        &timer,
        Arc::new(InlineReads),
        HandleConfig::default(),
    );
    h.init();
    assert!(drive(&pool, &timer, &h, 0));
    assert_eq!(h.state(), HandleState::Ready);
    (h, cursor)
}

// ------------------------------------------------------ path 4: batch-index acks

#[test]
fn disjoint_batch_indexes_of_one_entry_by_two_txns_are_both_pending() {
    let (h, cursor) = ready_handle_on_empty_log("batch-disjoint");
    let e = Position::new(9, 1);
    let (t1, t2, t3, t4) = (
        TxnId::new(0, 1),
        TxnId::new(0, 2),
        TxnId::new(0, 3),
        TxnId::new(0, 4),
    );
    append(
        &h,
        PendingAckRecord::individual_ack(t1, vec![batch(e, 4, &[0, 1])]),
    )
    .unwrap();
    append(
        &h,
        PendingAckRecord::individual_ack(t2, vec![batch(e, 4, &[2])]),
    )
    .unwrap();
    let s = h.summary();
    assert_eq!(s.batch_indexes[&t1][&e], BTreeSet::from([0, 1]));
    assert_eq!(s.batch_indexes[&t2][&e], BTreeSet::from([2]));

    // Index 1 is pending in t1: a typed per-index conflict, nothing written.
    let lce = cursor.ledger().last_confirmed_entry();
    assert_eq!(
        append(
            &h,
            PendingAckRecord::individual_ack(t3, vec![batch(e, 4, &[1, 3])])
        ),
        Err(PendingAckError::AckConflict {
            txn_id: t3,
            position: e,
            batch_index: Some(1),
            holder: Some(t1),
        })
    );
    // A whole-entry ack of a position with pending indexes conflicts too.
    assert!(matches!(
        append(&h, PendingAckRecord::individual_ack(t3, vec![AckedPosition::whole(e)])),
        Err(PendingAckError::AckConflict { batch_index: Some(0), holder: Some(h1), .. }) if h1 == t1
    ));
    assert_eq!(
        cursor.ledger().last_confirmed_entry(),
        lce,
        "a refused ack is not logged"
    );

    // Commit t1: only t1's indexes become deleted; t2's stay pending.
    append(&h, PendingAckRecord::commit(t1, AckType::Individual)).unwrap();
    let s = h.summary();
    assert_eq!(s.deleted_batch_indexes[&e], BTreeSet::from([0, 1]));
    assert!(!s.batch_indexes.contains_key(&t1));
    assert_eq!(s.batch_indexes[&t2][&e], BTreeSet::from([2]));

    // After the commit, another free index is accepted; a committed one is
    // "already acknowledged".
    append(
        &h,
        PendingAckRecord::individual_ack(t4, vec![batch(e, 4, &[3])]),
    )
    .unwrap();
    assert_eq!(
        append(
            &h,
            PendingAckRecord::individual_ack(t3, vec![batch(e, 4, &[0])])
        ),
        Err(PendingAckError::AckConflict {
            txn_id: t3,
            position: e,
            batch_index: Some(0),
            holder: None,
        })
    );

    // Abort t2 frees index 2 only; t3 takes it; committing t3 and t4 deletes
    // the whole entry.
    append(&h, PendingAckRecord::abort(t2, AckType::Individual)).unwrap();
    assert_eq!(h.summary().batch_indexes[&t4][&e], BTreeSet::from([3]));
    append(
        &h,
        PendingAckRecord::individual_ack(t3, vec![batch(e, 4, &[2])]),
    )
    .unwrap();
    append(&h, PendingAckRecord::commit(t3, AckType::Individual)).unwrap();
    append(&h, PendingAckRecord::commit(t4, AckType::Individual)).unwrap();
    let s = h.summary();
    assert!(s.deleted.contains(&e));
    assert!(s.deleted_batch_indexes.is_empty());
    assert!(s.batch_indexes.is_empty());
}

#[test]
fn replay_of_batch_index_acks_rebuilds_the_same_state() {
    let (h, cursor) = ready_handle_on_empty_log("batch-replay");
    let e = Position::new(9, 1);
    let f = Position::new(9, 2);
    let (t1, t2) = (TxnId::new(0, 1), TxnId::new(0, 2));
    append(
        &h,
        PendingAckRecord::individual_ack(t1, vec![batch(e, 3, &[0])]),
    )
    .unwrap();
    append(
        &h,
        PendingAckRecord::individual_ack(t2, vec![batch(e, 3, &[1]), AckedPosition::whole(f)]),
    )
    .unwrap();
    append(&h, PendingAckRecord::commit(t1, AckType::Individual)).unwrap();
    let live = h.summary();

    let (pool, timer) = manual();
    let replayer = new_handle(
        "batch-replay-2",
        &cursor,
        &pool,
        &timer,
        Arc::new(InlineReads),
        HandleConfig::default(),
    );
    replayer.init();
    assert!(drive(&pool, &timer, &replayer, 0));
    assert_eq!(replayer.state(), HandleState::Ready);
    // The pending part is rebuilt from the log; the committed effects live
    // on the subscription (the log entries of t1 were trimmed once resolved).
    let replayed = replayer.summary();
    assert_eq!(replayed.individual, live.individual);
    assert_eq!(replayed.batch_indexes, live.batch_indexes);
    assert_eq!(live.batch_indexes[&t2][&e], BTreeSet::from([1]));
    assert_eq!(
        live.deleted_batch_indexes,
        BTreeMap::from([(e, BTreeSet::from([0]))])
    );
    // t1's index 0 is not pending after replay, so t2 cannot have it and a
    // new txn's ack of index 2 is accepted.
    assert_eq!(
        append(
            &replayer,
            PendingAckRecord::individual_ack(TxnId::new(0, 3), vec![batch(e, 3, &[2])])
        )
        .map(|_| ()),
        Ok(())
    );
}
