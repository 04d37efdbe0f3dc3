//! Pending-ack replay: write two transactional acks to a pending-ack log,
//! then replay the log into a fresh handle on a manual executor and read the
//! recovered state.
//!
//! Run: `cargo run --example pending_ack`

use std::sync::Arc;

use pulsar_core::ledger::{LedgerConfig, ManagedLedger, MemoryStore};
use pulsar_core::pending_ack::{
    AckedPosition, ExecutorMode, HandleConfig, InlineReads, MemorySubscription, PendingAckHandle,
    PendingAckRecord, ReplayExecutorPool, TxnId, VirtualTimer,
};
use pulsar_core::Position;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(MemoryStore::new());
    let log = ManagedLedger::open(
        "persistent://public/default/t-sub__transaction_pending_ack",
        LedgerConfig::default(),
        store,
    )?;
    let (t1, t2) = (TxnId::new(0, 1), TxnId::new(0, 2));
    log.append(
        &PendingAckRecord::individual_ack(t1, vec![AckedPosition::whole(Position::new(3, 0))])
            .encode(),
    )?;
    log.append(
        &PendingAckRecord::individual_ack(t2, vec![AckedPosition::whole(Position::new(3, 1))])
            .encode(),
    )?;

    let cursor = Arc::new(log.open_cursor("__pending_ack_state")?);
    let pool = ReplayExecutorPool::new(1, ExecutorMode::Manual)?;
    let handle = PendingAckHandle::new(
        "persistent://public/default/t-sub",
        cursor,
        Arc::new(MemorySubscription::default()),
        &pool,
        Arc::new(InlineReads),
        Arc::new(VirtualTimer::new()),
        HandleConfig::default(),
    )?;
    let ready = handle.ready_waiter();
    handle.init();
    pool.run_pending(); // the replay runs on the (manual) executor
    println!("replay result: {:?}", ready.try_result());
    assert_eq!(ready.try_result(), Some(Ok(())));

    let summary = handle.summary();
    println!(
        "recovered individual acks of {} transactions",
        summary.individual.len()
    );
    assert_eq!(summary.individual[&t1].len(), 1);
    assert_eq!(summary.individual[&t2].len(), 1);
    Ok(())
}
