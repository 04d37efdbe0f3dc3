//! The core under a storage layer's failures, as the store reports them
//! (typed errors, never a panic): a failed read of a subscription's entries
//! waits for the read backoff (Pulsar's dispatcher `readEntriesFailed`), and
//! a pending-ack log that cannot be replayed keeps its subscription from
//! dispatching and its transactional acks refused (`ServiceNotReady`) until
//! a retried replay completes (Pulsar's `PendingAckHandleImpl`).

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::ledger::{AppendSegment, LedgerStore, StoreError, StoredCursor, StoredLedger};

/// A [`LedgerStore`] over a [`RedbStore`] whose entry reads of the managed
/// ledgers whose name contains `target` fail as storage-unavailable while
/// `down` is set.
#[derive(Debug)]
struct Outage {
    inner: RedbStore,
    target: &'static str,
    down: Arc<AtomicBool>,
}

impl LedgerStore for Outage {
    fn load_ledger(&self, name: &str) -> Result<StoredLedger, StoreError> {
        self.inner.load_ledger(name)
    }
    fn create_ledger(&self, name: &str, ledger_id: i64) -> Result<(), StoreError> {
        self.inner.create_ledger(name, ledger_id)
    }
    fn append(&self, name: &str, segments: &[AppendSegment<'_>]) -> Result<(), StoreError> {
        self.inner.append(name, segments)
    }
    fn read(
        &self,
        name: &str,
        ledger_id: i64,
        first: i64,
        last: i64,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        if name.contains(self.target) && self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("bookies down".into()));
        }
        self.inner.read(name, ledger_id, first, last)
    }
    fn mark_ledger_lost(&self, name: &str, ledger_id: i64) -> Result<(), StoreError> {
        self.inner.mark_ledger_lost(name, ledger_id)
    }
    fn delete_ledgers(&self, name: &str, ledger_ids: &[i64]) -> Result<(), StoreError> {
        self.inner.delete_ledgers(name, ledger_ids)
    }
    fn load_cursor(&self, name: &str, cursor: &str) -> Result<Option<StoredCursor>, StoreError> {
        self.inner.load_cursor(name, cursor)
    }
    fn save_mark_delete(
        &self,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        individually_deleted: &[(Position, Position)],
    ) -> Result<(), StoreError> {
        self.inner
            .save_mark_delete(name, cursor, mark_delete, individually_deleted)
    }
    fn set_cursor_property(
        &self,
        name: &str,
        cursor: &str,
        key: &str,
        value: Option<i64>,
    ) -> Result<(), StoreError> {
        self.inner.set_cursor_property(name, cursor, key, value)
    }
    fn list_cursors(&self, name: &str) -> Result<Vec<String>, StoreError> {
        self.inner.list_cursors(name)
    }
    fn save_deletion_state(
        &self,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        chunks: &[Vec<u8>],
        property_updates: &[(&str, Option<i64>)],
    ) -> Result<(), StoreError> {
        self.inner
            .save_deletion_state(name, cursor, mark_delete, chunks, property_updates)
    }
    fn load_deletion_state(
        &self,
        name: &str,
        cursor: &str,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        self.inner.load_deletion_state(name, cursor)
    }
}

/// A core on `dir`'s store whose reads of `target` fail while the returned
/// flag is set.
fn core_with_outage(dir: &tempfile::TempDir, target: &'static str) -> (Broker, Arc<AtomicBool>) {
    let store = open_store(dir);
    let down = Arc::new(AtomicBool::new(false));
    let ledgers = Arc::new(Outage {
        inner: store.clone(),
        target,
        down: Arc::clone(&down),
    });
    let b = Broker::with_ledger_store(store, ledgers, BrokerConfig::new("pulsar://node:6650"), T0);
    (b, down)
}

fn timeout(b: &mut Broker, at: u64) -> Vec<(u64, BrokerCommand, usize)> {
    b.handle_timeout(at);
    frames(b)
}

/// A read that fails as storage-unavailable is not re-issued on every
/// input: the subscription waits for the backoff deadline (15 s), the
/// core's timer asks for it, and the read at the deadline delivers the
/// entry once the storage is back.
#[test]
fn a_failed_read_is_retried_at_the_backoff_deadline_and_delivers_after_the_outage() {
    let dir = tempfile::tempdir().unwrap();
    let (mut b, down) = core_with_outage(&dir, "public/default/t");
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    flow(&mut b, 1, 7, 10);
    down.store(true, Ordering::SeqCst);
    let p0 = send(&mut b, 1, 1, 0, &entry(None, None, None));
    let retry = b.poll_timeout().expect("a read retry deadline");
    assert_eq!(retry, T0 + read_backoff::READ_FAILURE_BACKOFF_INITIAL_MS);
    down.store(false, Ordering::SeqCst);
    // Inputs before the deadline read nothing.
    assert_eq!(delivered(&flow(&mut b, 1, 7, 1), 7), vec![]);
    assert_eq!(delivered(&timeout(&mut b, retry - 1), 7), vec![]);
    assert_eq!(delivered(&timeout(&mut b, retry), 7), vec![p0]);
    assert_eq!(
        b.poll_timeout(),
        None,
        "no retry left after a completed read"
    );
}

/// A pending-ack log whose replay fails is retried with backoff (the
/// handle stays not Ready meanwhile): the subscription dispatches nothing
/// (an entry acknowledged in the open transaction must not go out again),
/// a transactional ack is answered `ServiceNotReady`; once a retried
/// replay completes, the open transaction's ack is known and only the
/// other entry is delivered.
#[test]
fn a_pending_ack_replay_that_fails_holds_dispatch_and_refuses_transactional_acks_until_a_retry_completes(
) {
    let Flow { _dir, mut b, input } = flow_setup();
    flow(&mut b, 1, 7, 10);
    let t = new_txn(&mut b, 1, 600_000);
    add_subscription(&mut b, 1, t, "work");
    let bits = (t.most_sig_bits, t.least_sig_bits);
    let out = txn_ack(&mut b, 1, 7, false, vec![mid(input, vec![])], bits, 9);
    assert_eq!(out[0].1.ack_response.as_ref().unwrap().error, None);
    let other = send(&mut b, 1, 1, 1, &entry(None, None, None));
    drop(b);
    let (mut b, down) = core_with_outage(&_dir, "__transaction_pending_ack");
    down.store(true, Ordering::SeqCst);
    connect(&mut b, 2);
    subscribe(&mut b, 2, 9, "work", sub_type::SHARED, "w");
    assert_eq!(
        delivered(&flow(&mut b, 2, 9, 10), 9),
        vec![],
        "nothing dispatched while the pending-ack log is not replayed"
    );
    let out = txn_ack(&mut b, 2, 9, false, vec![mid(other, vec![])], bits, 10);
    assert_eq!(
        out[0].1.ack_response.as_ref().unwrap().error,
        Some(server_error::SERVICE_NOT_READY),
        "{out:?}"
    );
    down.store(false, Ordering::SeqCst);
    let mut got = Vec::new();
    for _ in 0..20 {
        let Some(at) = b.poll_timeout() else { break };
        got.extend(delivered(&timeout(&mut b, at.max(T0)), 9));
        if !got.is_empty() {
            break;
        }
    }
    assert_eq!(
        got,
        vec![other],
        "the entry pending in the open transaction stays held"
    );
}
