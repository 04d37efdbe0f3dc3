//! Group commit of acks: the acks of one turn share one store commit, and
//! no ack receipt is queued before the commit of the ack it confirms.

use super::*;
use crate::ledger::SyncMode;
use crate::sim::crash_storage::{CrashKind, CrashPoint, CrashStorage};

fn ack_cmd(cid: u64, p: Position, request_id: u64) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::ACK,
        ack: Some(CommandAck {
            consumer_id: cid,
            ack_type: 0,
            message_id: vec![mid(p, vec![])],
            validation_error: None,
            txnid_least_bits: None,
            txnid_most_bits: None,
            request_id: Some(request_id),
        }),
        ..Default::default()
    }
}

/// A core on the simulator's crash storage with `n` entries delivered to
/// consumer 7 of Shared subscription `s`.
fn delivered(storage: &CrashStorage, n: u64) -> (Broker, Vec<Position>) {
    let store = RedbStore::open_on_backend(storage.backend(), SyncMode::Immediate, 1 << 20)
        .expect("open the store");
    let mut b = Broker::new(store, BrokerConfig::new("pulsar://node:6650"), T0);
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    let ps: Vec<Position> = (0..n)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    let _ = flow(&mut b, 1, 7, 100);
    (b, ps)
}

/// The ACK_RESPONSEs in `out`: (request id, error).
fn ack_responses(out: &[(u64, BrokerCommand, usize)]) -> Vec<(u64, Option<i32>)> {
    out.iter()
        .filter_map(|(_, f, _)| f.ack_response.as_ref())
        .map(|r| (r.request_id.unwrap_or(0), r.error))
        .collect()
}

#[test]
fn the_acks_of_one_turn_share_one_commit_and_their_receipts_follow_it() {
    let storage = CrashStorage::new();
    let (mut b, ps) = delivered(&storage, 5);
    let before = storage.durable_writes_since_open();
    for (i, p) in ps.iter().enumerate() {
        b.handle_frame(1, &enc(&ack_cmd(7, *p, 900 + i as u64)), &[], T0)
            .unwrap();
    }
    // Nothing durable yet, so no receipt may be queued.
    assert_eq!(storage.durable_writes_since_open(), before);
    let queued = b
        .out
        .queue
        .iter()
        .filter_map(|o| match o {
            Output::Frame { frame, .. } => frame.decode_command().ok(),
            _ => None,
        })
        .filter(|f| f.ack_response.is_some())
        .count();
    assert_eq!(queued, 0, "an ack receipt queued before its commit");
    b.flush();
    assert_eq!(
        storage.durable_writes_since_open(),
        before + 1,
        "five acks of one turn, one commit"
    );
    let out = frames(&mut b);
    assert_eq!(
        ack_responses(&out),
        (900..905).map(|r| (r, None)).collect::<Vec<_>>()
    );
    assert_eq!(sub(&b, "s").mark_delete(), ps[4]);
}

#[test]
fn a_failed_group_commit_sends_no_receipt_and_the_acks_are_redelivered() {
    let storage = CrashStorage::new();
    let (mut b, ps) = delivered(&storage, 3);
    // The next durable write (the turn's group commit) fails before its
    // sync: nothing of it is durable.
    storage.arm(CrashPoint {
        k: storage.durable_writes_since_open() + 1,
        kind: CrashKind::BeforeSync,
    });
    for (i, p) in ps.iter().enumerate() {
        b.handle_frame(1, &enc(&ack_cmd(7, *p, 900 + i as u64)), &[], T0)
            .unwrap();
    }
    let out = frames(&mut b);
    assert!(storage.is_dead(), "the group commit reached the store");
    let receipts = ack_responses(&out);
    assert_eq!(receipts.len(), 3, "{receipts:?}");
    assert!(
        receipts
            .iter()
            .all(|(_, e)| *e == Some(server_error::UNKNOWN_ERROR)),
        "a receipt went out for an ack that is not durable: {receipts:?}"
    );
    // The restarted broker redelivers them: the client saw no receipt.
    drop(b);
    storage.recover();
    let store = RedbStore::open_on_backend(storage.backend(), SyncMode::Immediate, 1 << 20)
        .expect("reopen the store");
    let mut b = Broker::new(store, BrokerConfig::new("pulsar://node:6650"), T0);
    connect(&mut b, 2);
    subscribe(&mut b, 2, 7, "s", sub_type::SHARED, "c");
    let out = flow(&mut b, 2, 7, 100);
    let redelivered: Vec<Position> = out
        .iter()
        .filter_map(|(_, f, _)| f.message.as_ref())
        .map(|m| Position::new(m.message_id.ledger_id as i64, m.message_id.entry_id as i64))
        .collect();
    assert_eq!(redelivered, ps);
}
