//! Transactions through the core: the coordinator's commands, transactional
//! SEND (transaction buffer) and transactional ACK (pending ack).

use super::*;

/// ACK carrying a transaction id (`txnid_least_bits` = 6,
/// `txnid_most_bits` = 7 of `CommandAck`).
fn txn_ack(
    b: &mut Broker,
    conn: u64,
    cid: u64,
    cumulative: bool,
    ids: Vec<MessageIdData>,
    txn: (u64, u64),
    request_id: u64,
) -> Vec<(u64, BrokerCommand, usize)> {
    feed(
        b,
        conn,
        BrokerCommand {
            r#type: ty::ACK,
            ack: Some(CommandAck {
                consumer_id: cid,
                ack_type: i32::from(cumulative),
                message_id: ids,
                validation_error: None,
                txnid_least_bits: Some(txn.1),
                txnid_most_bits: Some(txn.0),
                request_id: Some(request_id),
            }),
            ..Default::default()
        },
    )
}

/// Pulsar applies a transactional ack to the subscription only when its
/// transaction commits (`PendingAckHandleImpl`); before that the entry stays
/// undeleted, and a restart redelivers it.
#[test]
fn a_transactional_ack_is_not_applied_as_a_plain_ack() {
    let (dir, mut b) = with_producer();
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    let p0 = send(&mut b, 1, 1, 0, &entry(None, None, None));
    flow(&mut b, 1, 7, 10);
    txn_ack(&mut b, 1, 7, false, vec![mid(p0, vec![])], (0, 1), 9);
    assert!(
        !sub(&b, "s").deletion().is_message_deleted(p0),
        "a transactional ack of a transaction not committed deleted the entry"
    );
    drop(b);
    let mut b = core(&dir);
    connect(&mut b, 2);
    subscribe(&mut b, 2, 8, "s", sub_type::SHARED, "c");
    let out = flow(&mut b, 2, 8, 10);
    assert_eq!(
        out.iter().filter(|(_, f, _)| f.r#type == ty::MESSAGE).count(),
        1,
        "the entry acknowledged only inside an open transaction is redelivered after a restart: {out:?}"
    );
}

use crate::broker::txn::TxnId;
use crate::proto::txn as tp;

fn tc_connect(b: &mut Broker, conn: u64) -> Vec<(u64, BrokerCommand, usize)> {
    feed(
        b,
        conn,
        BrokerCommand {
            r#type: ty::TC_CLIENT_CONNECT_REQUEST,
            tc_client_connect_request: Some(tp::CommandTcClientConnectRequest {
                request_id: 1,
                tc_id: 0,
            }),
            ..Default::default()
        },
    )
}

fn new_txn(b: &mut Broker, conn: u64, ttl_ms: u64) -> TxnId {
    let out = feed(
        b,
        conn,
        BrokerCommand {
            r#type: ty::NEW_TXN,
            new_txn: Some(tp::CommandNewTxn {
                request_id: 2,
                txn_ttl_millis: Some(ttl_ms),
                tc_id: Some(0),
            }),
            ..Default::default()
        },
    );
    let r = out[0].1.new_txn_response.clone().unwrap();
    assert_eq!(r.error, None, "{r:?}");
    TxnId::new(r.txnid_most_bits.unwrap(), r.txnid_least_bits.unwrap())
}

fn txn_response(out: &[(u64, BrokerCommand, usize)]) -> tp::CommandTxnResponse {
    let f = &out
        .iter()
        .find(|(_, f, _)| {
            matches!(
                f.r#type,
                ty::ADD_PARTITION_TO_TXN_RESPONSE
                    | ty::ADD_SUBSCRIPTION_TO_TXN_RESPONSE
                    | ty::END_TXN_RESPONSE
            )
        })
        .expect("a transaction response")
        .1;
    f.add_partition_to_txn_response
        .clone()
        .or(f.add_subscription_to_txn_response.clone())
        .or(f.end_txn_response.clone())
        .unwrap()
}

fn add_partition(b: &mut Broker, conn: u64, t: TxnId) {
    let out = feed(
        b,
        conn,
        BrokerCommand {
            r#type: ty::ADD_PARTITION_TO_TXN,
            add_partition_to_txn: Some(tp::CommandAddPartitionToTxn {
                request_id: 3,
                txnid_least_bits: Some(t.least_sig_bits),
                txnid_most_bits: Some(t.most_sig_bits),
                partitions: vec![TOPIC.into()],
            }),
            ..Default::default()
        },
    );
    assert_eq!(txn_response(&out).error, None);
}

fn add_subscription(b: &mut Broker, conn: u64, t: TxnId, sub: &str) {
    let out = feed(
        b,
        conn,
        BrokerCommand {
            r#type: ty::ADD_SUBSCRIPTION_TO_TXN,
            add_subscription_to_txn: Some(tp::CommandAddSubscriptionToTxn {
                request_id: 4,
                txnid_least_bits: Some(t.least_sig_bits),
                txnid_most_bits: Some(t.most_sig_bits),
                subscription: vec![tp::TxnSubscription {
                    topic: TOPIC.into(),
                    subscription: sub.into(),
                }],
            }),
            ..Default::default()
        },
    );
    assert_eq!(txn_response(&out).error, None);
}

fn end_txn(b: &mut Broker, conn: u64, t: TxnId, commit: bool) -> tp::CommandTxnResponse {
    txn_response(&end_txn_out(b, conn, t, commit))
}

fn end_txn_out(
    b: &mut Broker,
    conn: u64,
    t: TxnId,
    commit: bool,
) -> Vec<(u64, BrokerCommand, usize)> {
    feed(
        b,
        conn,
        BrokerCommand {
            r#type: ty::END_TXN,
            end_txn: Some(tp::CommandEndTxn {
                request_id: 5,
                txnid_least_bits: Some(t.least_sig_bits),
                txnid_most_bits: Some(t.most_sig_bits),
                txn_action: Some(if commit {
                    tp::txn_action::COMMIT
                } else {
                    tp::txn_action::ABORT
                }),
            }),
            ..Default::default()
        },
    )
}

/// An entry of transaction `t`: its `MessageMetadata` carries the txnid
/// (fields 22, 23) as a Pulsar producer writes it.
fn txn_entry(t: TxnId) -> Vec<u8> {
    let md = crate::proto::metadata::MessageMetadata {
        producer_name: "p".into(),
        sequence_id: 1,
        publish_time: 2,
        txnid_least_bits: Some(t.least_sig_bits),
        txnid_most_bits: Some(t.most_sig_bits),
        ..Default::default()
    };
    crate::proto::frame::encode_entry_payload(
        &md,
        &[(
            crate::proto::metadata::SingleMessageMetadata::default(),
            b"m".to_vec(),
        )],
    )
}

fn txn_send(
    b: &mut Broker,
    conn: u64,
    pid: u64,
    seq: u64,
    t: TxnId,
) -> Vec<(u64, BrokerCommand, usize)> {
    let c = BrokerCommand {
        r#type: ty::SEND,
        send: Some(command::CommandSend {
            producer_id: pid,
            sequence_id: seq,
            txnid_least_bits: Some(t.least_sig_bits),
            txnid_most_bits: Some(t.most_sig_bits),
            ..Default::default()
        }),
        ..Default::default()
    };
    b.handle_frame(conn, &enc(&c), &txn_entry(t), T0).unwrap();
    frames(b)
}

fn receipt_pos(out: &[(u64, BrokerCommand, usize)]) -> Position {
    let r = out
        .iter()
        .find_map(|(_, f, _)| f.send_receipt.clone())
        .unwrap_or_else(|| panic!("a SEND_RECEIPT: {out:?}"));
    let id = r.message_id.unwrap();
    Position::new(id.ledger_id as i64, id.entry_id as i64)
}

fn delivered(out: &[(u64, BrokerCommand, usize)], cid: u64) -> Vec<Position> {
    out.iter()
        .filter_map(|(_, f, _)| f.message.as_ref())
        .filter(|m| m.consumer_id == cid)
        .map(|m| Position::new(m.message_id.ledger_id as i64, m.message_id.entry_id as i64))
        .collect()
}

/// The transaction of a consume-transform-produce step: a transactional ack
/// of an input on `work`, a transactional message; the observer `obs` sees
/// nothing of the transaction (nor anything after it) before the commit.
struct Flow {
    _dir: tempfile::TempDir,
    b: Broker,
    input: Position,
}

fn flow_setup() -> Flow {
    let (dir, mut b) = with_producer();
    assert_eq!(
        tc_connect(&mut b, 1)[0]
            .1
            .tc_client_connect_response
            .clone()
            .unwrap()
            .error,
        None
    );
    subscribe(&mut b, 1, 7, "work", sub_type::SHARED, "w");
    subscribe(&mut b, 1, 8, "obs", sub_type::SHARED, "o");
    let input = send(&mut b, 1, 1, 0, &entry(None, None, None));
    Flow {
        _dir: dir,
        b,
        input,
    }
}

#[test]
fn a_transaction_commits_its_messages_and_acks_atomically() {
    let Flow { _dir, mut b, input } = flow_setup();
    assert_eq!(delivered(&flow(&mut b, 1, 7, 10), 7), vec![input]);
    assert_eq!(delivered(&flow(&mut b, 1, 8, 10), 8), vec![input]);
    ack(&mut b, 1, 8, false, vec![mid(input, vec![])], None);
    let t = new_txn(&mut b, 1, 60_000);
    let tb = (t.most_sig_bits, t.least_sig_bits);
    // An ack inside a transaction the subscription was not added to is refused.
    let out = txn_ack(&mut b, 1, 7, false, vec![mid(input, vec![])], tb, 9);
    assert_eq!(
        out[0].1.ack_response.clone().unwrap().error,
        Some(server_error::NOT_ALLOWED_ERROR)
    );
    add_subscription(&mut b, 1, t, "work");
    let out = txn_ack(&mut b, 1, 7, false, vec![mid(input, vec![])], tb, 9);
    let r = out[0].1.ack_response.clone().unwrap();
    assert_eq!(
        (r.error, r.txnid_least_bits, r.txnid_most_bits),
        (None, Some(t.least_sig_bits), Some(t.most_sig_bits))
    );
    assert!(!sub(&b, "work").deletion().is_message_deleted(input));
    // A second transaction acking the same entry conflicts (Pulsar:
    // TransactionConflict on the ack response).
    let t2 = new_txn(&mut b, 1, 60_000);
    add_subscription(&mut b, 1, t2, "work");
    let out = txn_ack(
        &mut b,
        1,
        7,
        false,
        vec![mid(input, vec![])],
        (t2.most_sig_bits, t2.least_sig_bits),
        10,
    );
    assert_eq!(
        out[0].1.ack_response.clone().unwrap().error,
        Some(server_error::TRANSACTION_CONFLICT)
    );
    // A transactional SEND to a topic not added to the transaction is
    // refused with the code the client fails that message on
    // (publish::final_send_error: ChecksumError for a non-Java client).
    let out = txn_send(&mut b, 1, 1, 1, t);
    assert_eq!(
        out[0].1.send_error.clone().unwrap().error,
        server_error::CHECKSUM_ERROR
    );
    add_partition(&mut b, 1, t);
    let out = txn_send(&mut b, 1, 1, 1, t);
    let m = receipt_pos(&out);
    assert_eq!(
        delivered(&out, 8),
        vec![],
        "an open transaction's message is never dispatched"
    );
    let (plain, out) = send_with(&mut b, 1, 1, 2, &entry(None, None, None));
    assert_eq!(
        delivered(&out, 8),
        vec![],
        "nothing past the max read position"
    );
    // Commit: the message and the plain one after it are delivered, the
    // marker never; the ack is applied.
    let out = end_txn_out(&mut b, 1, t, true);
    assert_eq!(txn_response(&out).error, None);
    assert_eq!(delivered(&out, 8), vec![m, plain]);
    assert!(sub(&b, "work").deletion().is_message_deleted(input));
    assert_eq!(
        end_txn(&mut b, 1, t, true).error,
        Some(server_error::TRANSACTION_NOT_FOUND),
        "an ended transaction is forgotten"
    );
    // The marker entry after `plain` is acknowledged on obs once passed.
    ack(
        &mut b,
        1,
        8,
        false,
        vec![mid(m, vec![]), mid(plain, vec![])],
        None,
    );
    flow(&mut b, 1, 8, 10);
    assert_eq!(
        sub(&b, "obs").mark_delete(),
        b.topics()[TOPIC].ml.last_confirmed_entry()
    );
}

#[test]
fn an_aborted_transaction_is_never_dispatched_and_its_acks_are_redelivered() {
    let Flow { _dir, mut b, input } = flow_setup();
    assert_eq!(delivered(&flow(&mut b, 1, 7, 10), 7), vec![input]);
    assert_eq!(delivered(&flow(&mut b, 1, 8, 10), 8), vec![input]);
    let t = new_txn(&mut b, 1, 60_000);
    add_subscription(&mut b, 1, t, "work");
    add_partition(&mut b, 1, t);
    txn_ack(
        &mut b,
        1,
        7,
        false,
        vec![mid(input, vec![])],
        (t.most_sig_bits, t.least_sig_bits),
        9,
    );
    let m = receipt_pos(&txn_send(&mut b, 1, 1, 1, t));
    let (plain, _) = send_with(&mut b, 1, 1, 2, &entry(None, None, None));
    let out = end_txn_out(&mut b, 1, t, false);
    assert_eq!(txn_response(&out).error, None);
    // obs: only the plain entry; work: the input again (redelivered).
    assert_eq!(delivered(&out, 8), vec![plain]);
    assert_eq!(delivered(&out, 7), vec![plain, input]);
    assert!(!sub(&b, "work").deletion().is_message_deleted(input));
    assert!(
        sub(&b, "obs").deletion().is_message_deleted(m),
        "an aborted entry is acknowledged for every subscription"
    );
}

#[test]
fn an_open_transaction_times_out_and_is_aborted_through_handle_timeout() {
    let Flow {
        _dir,
        mut b,
        input: _,
    } = flow_setup();
    flow(&mut b, 1, 8, 10);
    let t = new_txn(&mut b, 1, 5_000);
    add_partition(&mut b, 1, t);
    txn_send(&mut b, 1, 1, 1, t);
    assert_eq!(b.poll_timeout(), Some(T0 + 5_000));
    b.handle_timeout(T0 + 4_999);
    assert!(b.topics()[TOPIC].buffer.lock().is_ongoing(t));
    b.handle_timeout(T0 + 5_000);
    assert!(b.topics()[TOPIC].buffer.lock().is_aborted(t));
    assert_eq!(
        end_txn(&mut b, 1, t, true).error,
        Some(server_error::TRANSACTION_NOT_FOUND)
    );
}

/// A crash after each durable write of END_TXN (coordinator Committing,
/// marker appended, pending-ack COMMIT + subscription persisted): the
/// restarted node finishes the commit — the message is delivered, the ack
/// is applied, never redelivered.
#[test]
fn a_crash_after_each_durable_write_of_end_txn_is_finished_by_recovery() {
    for crash_after in 1..=3 {
        let Flow { _dir, mut b, input } = flow_setup();
        flow(&mut b, 1, 7, 10);
        let t = new_txn(&mut b, 1, 60_000);
        add_subscription(&mut b, 1, t, "work");
        add_partition(&mut b, 1, t);
        txn_ack(
            &mut b,
            1,
            7,
            false,
            vec![mid(input, vec![])],
            (t.most_sig_bits, t.least_sig_bits),
            9,
        );
        let m = receipt_pos(&txn_send(&mut b, 1, 1, 1, t));
        b.coordinator().unwrap().begin_end(t, true, T0).unwrap();
        if crash_after >= 2 {
            b.end_on_partition(TOPIC, t, true).unwrap();
        }
        if crash_after >= 3 {
            b.end_on_subscription(TOPIC, "work", t, true).unwrap();
        }
        drop(b);
        let mut b = core(&_dir);
        connect(&mut b, 2);
        assert!(
            b.coordinator().unwrap().get(t).is_none(),
            "crash after write {crash_after}: recovery finished the commit"
        );
        subscribe(&mut b, 2, 8, "obs", sub_type::SHARED, "o");
        subscribe(&mut b, 2, 9, "work", sub_type::SHARED, "w");
        let out = flow(&mut b, 2, 8, 10);
        assert_eq!(
            delivered(&out, 8),
            vec![input, m],
            "crash after write {crash_after}"
        );
        let out = flow(&mut b, 2, 9, 10);
        assert_eq!(
            delivered(&out, 9),
            vec![m],
            "crash after write {crash_after}: the committed ack is not redelivered"
        );
    }
}

/// A crash with a transaction open: it stays open (its message held, its
/// ack pending) and commits after the restart.
#[test]
fn an_open_transaction_survives_a_crash_and_commits_after_it() {
    let Flow { _dir, mut b, input } = flow_setup();
    flow(&mut b, 1, 7, 10);
    let t = new_txn(&mut b, 1, 60_000);
    add_subscription(&mut b, 1, t, "work");
    add_partition(&mut b, 1, t);
    txn_ack(
        &mut b,
        1,
        7,
        false,
        vec![mid(input, vec![])],
        (t.most_sig_bits, t.least_sig_bits),
        9,
    );
    let m = receipt_pos(&txn_send(&mut b, 1, 1, 1, t));
    drop(b);
    let mut b = core(&_dir);
    connect(&mut b, 2);
    subscribe(&mut b, 2, 8, "obs", sub_type::SHARED, "o");
    subscribe(&mut b, 2, 9, "work", sub_type::SHARED, "w");
    assert_eq!(
        delivered(&flow(&mut b, 2, 8, 10), 8),
        vec![input],
        "the open transaction's message is held"
    );
    assert_eq!(
        delivered(&flow(&mut b, 2, 9, 10), 9),
        vec![],
        "the input pending in the open transaction is not redelivered"
    );
    let out = end_txn_out(&mut b, 2, t, true);
    assert_eq!(txn_response(&out).error, None);
    assert_eq!(delivered(&out, 8), vec![m]);
    assert_eq!(delivered(&out, 9), vec![m]);
    assert!(sub(&b, "work").deletion().is_message_deleted(input));
}

/// The replay read-failure discipline for the transaction buffer (Pulsar closes the
/// topic; the upstream recovery re-issues a failed read in a loop): a failed recovery does
/// not open the topic, a request before the backoff passes is refused
/// without a read, and the retry after it recovers.
#[test]
fn a_topic_whose_buffer_cannot_recover_is_not_opened_until_its_backoff_passes() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = core(&dir);
    let ml = ManagedLedger::open(
        "persistent://public/default/x",
        LedgerConfig::default(),
        Arc::new(b.store().clone()),
    )
    .unwrap();
    ml.append(&entry(None, None, None)).unwrap();
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r2 = Arc::clone(&reads);
    ml.faults().set_policy(move |_| {
        r2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Some(crate::ledger::ReadFailureKind::StorageUnavailable)
    });
    let name = "persistent://public/default/x";
    let e = b.recover_buffer(name, &ml).unwrap_err();
    assert_eq!(e.server_error(), server_error::SERVICE_NOT_READY);
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Before the backoff: refused with no read.
    assert!(b.recover_buffer(name, &ml).is_err());
    assert_eq!(
        reads.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "no read before the backoff"
    );
    ml.faults().clear();
    b.handle_timeout(T0 + 100);
    assert!(
        b.recover_buffer(name, &ml).is_ok(),
        "the retry after the backoff recovers"
    );
}

/// Cumulative and batch-index transactional acks: pending until the
/// commit, applied by it (mark-delete moved; the acknowledged indexes
/// deleted).
#[test]
fn cumulative_and_batch_index_transactional_acks_apply_at_commit() {
    let (_d, mut b) = with_producer();
    subscribe(&mut b, 1, 7, "work", sub_type::SHARED, "w");
    let p0 = send(&mut b, 1, 1, 0, &entry(None, None, None));
    let p1 = send(&mut b, 1, 1, 1, &entry(None, Some(3), None));
    flow(&mut b, 1, 7, 10);
    let t = new_txn(&mut b, 1, 60_000);
    add_subscription(&mut b, 1, t, "work");
    let tb = (t.most_sig_bits, t.least_sig_bits);
    // Indexes 0 and 2 of the batch at p1 (set bit = still unacknowledged).
    let out = txn_ack(&mut b, 1, 7, false, vec![mid(p1, vec![0b010])], tb, 9);
    assert_eq!(out[0].1.ack_response.clone().unwrap().error, None);
    let out = txn_ack(&mut b, 1, 7, true, vec![mid(p0, vec![])], tb, 10);
    assert_eq!(out[0].1.ack_response.clone().unwrap().error, None);
    assert!(sub(&b, "work").mark_delete() < p0);
    assert_eq!(end_txn(&mut b, 1, t, true).error, None);
    assert_eq!(sub(&b, "work").mark_delete(), p0);
    assert_eq!(
        sub(&b, "work").deletion().batch_ack_set(p1),
        Some(vec![0b010]),
        "index 1 left"
    );
}

mod snapshot;
mod store_faults;
