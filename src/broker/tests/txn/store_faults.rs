//! The core under a storage layer's failures, as the store reports them
//! (typed errors, never a panic): a failed read of a subscription's entries
//! waits for the read backoff (Pulsar's dispatcher `readEntriesFailed`), and
//! a pending-ack log that cannot be replayed keeps its subscription from
//! dispatching and its transactional acks refused (`ServiceNotReady`) until
//! a retried replay completes (Pulsar's `PendingAckHandleImpl`).

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::ledger::{ReadFaultStore, StoreError};

/// A core on `dir`'s store whose reads of `target` fail while the returned
/// flag is set.
fn core_with_outage(dir: &tempfile::TempDir, target: &'static str) -> (Broker, Arc<AtomicBool>) {
    let store = open_store(dir);
    let down = Arc::new(AtomicBool::new(false));
    // Entry reads of the managed ledgers whose name contains `target` fail
    // as storage-unavailable while `down` is set.
    let flag = Arc::clone(&down);
    let ledgers = Arc::new(ReadFaultStore::new(store.clone(), move |name: &str| {
        (name.contains(target) && flag.load(Ordering::SeqCst))
            .then(|| StoreError::Unavailable("bookies down".into()))
    }));
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

/// A due delayed entry of a subscription whose reads wait for the read
/// backoff does not make the core's timer ask for a time already past (a
/// driver that fired it once waits for input, so every later deadline would
/// be hidden): the timer asks for the backoff's retry, and the read at the
/// retry delivers both the immediate entry and the due delayed one.
#[test]
fn a_due_delayed_entry_held_by_the_read_backoff_asks_the_timer_for_the_retry() {
    let dir = tempfile::tempdir().unwrap();
    let (mut b, down) = core_with_outage(&dir, "public/default/t");
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    assert!(flow(&mut b, 1, 7, 10).is_empty());
    let due_at = T0 + 1_000;
    let delayed = send(&mut b, 1, 1, 0, &entry(None, None, Some(due_at as i64)));
    assert_eq!(
        b.poll_timeout(),
        Some(due_at),
        "the delayed entry is tracked"
    );
    down.store(true, Ordering::SeqCst);
    let immediate = send(&mut b, 1, 1, 1, &entry(None, None, None));
    let retry = T0 + read_backoff::READ_FAILURE_BACKOFF_INITIAL_MS;
    assert_eq!(delivered(&timeout(&mut b, due_at), 7), vec![]);
    assert_eq!(
        b.poll_timeout(),
        Some(retry),
        "the due entry waits for the read retry, which the timer asks for"
    );
    down.store(false, Ordering::SeqCst);
    let mut got = delivered(&timeout(&mut b, retry), 7);
    got.sort();
    assert_eq!(got, vec![delayed, immediate]);
    assert_eq!(b.poll_timeout(), None, "nothing left to wait for");
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
