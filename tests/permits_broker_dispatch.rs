//! PIP-491 broker side (Pulsar's Shared dispatcher and `Consumer`): a
//! closed connection removes exactly its consumers, their balances leave
//! the dispatcher total and their pending acks go to replay; each command
//! carries the consumer's epoch, and an `ack_set` with every index below B
//! still deliverable is sent as a full batch (no `ack_set`).
//!
//! Plain std test: compiled out in loom/shuttle builds.
#![cfg(not(any(loom, feature = "shuttle")))]

use pulsar_core::permits::broker::{
    AdmitAll, BrokerEntry, BrokerPermitError, ConsumerKey, Dispatch, NotSentReason,
    SendMessagesResult, SharedDispatcher,
};
use pulsar_core::Position;

fn key(connection_id: u64, consumer_id: u64) -> ConsumerKey {
    ConsumerKey {
        connection_id,
        consumer_id,
    }
}

fn entry(e: i64, batch_size: u32, ack_set: Vec<i64>) -> BrokerEntry {
    BrokerEntry {
        position: Position::new(4, e),
        batch_size,
        ack_set,
    }
}

#[test]
fn a_closed_connection_removes_exactly_its_consumers_and_replays_their_pending_acks() {
    let mut d = SharedDispatcher::new();
    let (a, b, other) = (key(1, 1), key(1, 2), key(2, 1));
    for k in [a, b, other] {
        d.add_consumer(k, 3).unwrap();
        d.consumer_flow(k, 10).unwrap();
    }
    assert_eq!(
        d.add_consumer(a, 0),
        Err(BrokerPermitError::DuplicateConsumer(a))
    );
    assert_eq!(d.total_available_permits(), 30);
    let sent = d
        .send_to_consumer(a, vec![entry(0, 4, vec![])], &mut AdmitAll)
        .unwrap();
    assert_eq!(sent.consumer, a);
    assert_eq!(sent.commands[0].consumer_epoch, Some(3));
    d.send_to_consumer(b, vec![entry(1, 1, vec![])], &mut AdmitAll)
        .unwrap();
    d.send_to_consumer(other, vec![entry(2, 2, vec![])], &mut AdmitAll)
        .unwrap();
    assert_eq!(d.total_available_permits(), 30 - 4 - 1 - 2);

    let mut removed = d.remove_connection(1);
    removed.sort_by_key(|r| r.key);
    assert_eq!(removed.len(), 2);
    assert_eq!((removed[0].key, removed[0].permits), (a, 6));
    assert_eq!(removed[0].replayed, vec![Position::new(4, 0)]);
    assert_eq!((removed[1].key, removed[1].permits), (b, 9));
    assert_eq!(removed[1].replayed, vec![Position::new(4, 1)]);
    let left: Vec<ConsumerKey> = d.consumers().map(|c| c.key()).collect();
    assert_eq!(left, vec![other]);
    assert_eq!(d.total_available_permits(), 8);
    assert_eq!(d.sum_consumer_permits(), 8);
    assert_eq!(
        d.take_replay(),
        vec![Position::new(4, 0), Position::new(4, 1)]
    );
    assert!(d.remove_connection(1).is_empty(), "nothing left on it");
}

#[test]
fn a_batch_with_every_index_deliverable_is_sent_whole() {
    let mut d = SharedDispatcher::new();
    let k = key(1, 1);
    d.add_consumer(k, 0).unwrap();
    d.consumer_flow(k, 100).unwrap();
    let dispatch = d
        .send_to_consumer(
            k,
            vec![
                entry(0, 3, vec![0b111]),       // all of B = 3: full
                entry(1, 3, vec![0b1111_0111]), // bits above B ignored: full
                entry(2, 3, vec![0b101]),       // partial: P = 2
            ],
            &mut AdmitAll,
        )
        .unwrap();
    let shape: Vec<(Vec<i64>, Option<u32>)> = dispatch
        .commands
        .iter()
        .map(|c| (c.ack_set.clone(), c.message_permits))
        .collect();
    assert_eq!(
        shape,
        vec![(vec![], Some(3)), (vec![], Some(3)), (vec![0b101], Some(2))]
    );
    assert_eq!(dispatch.commands[2].message_id.entry_id, 2);
    assert_eq!(dispatch.commands[2].message_id.ledger_id, 4);
    let r = &dispatch.result;
    assert_eq!((r.len(), r.is_empty(), r.sent_entries()), (3, false, 3));
    assert_eq!(r.total_permits(), 8);
    assert!(SendMessagesResult::new(0).is_empty());
    assert_eq!(d.consumer(k).unwrap().unacked_messages(), 8);
    assert_eq!(d.consumer(k).unwrap().available_permits(), 92);
}

/// Ledger id 0 and entry id 0 are positions like any other (BookKeeper
/// ledger ids start at 0): such an entry is sent. Only a negative ledger or
/// entry id, which `MessageIdData` cannot carry, is refused.
#[test]
fn ids_zero_are_sent_and_negative_ids_are_refused() {
    let mut d = SharedDispatcher::new();
    let k = key(1, 1);
    d.add_consumer(k, 0).unwrap();
    d.consumer_flow(k, 10).unwrap();
    let at = |l, e| BrokerEntry {
        position: Position::new(l, e),
        batch_size: 1,
        ack_set: vec![],
    };
    let dispatch = d
        .send_to_consumer(k, vec![at(0, 0), at(-1, 0), at(0, -1)], &mut AdmitAll)
        .unwrap();
    assert_eq!(dispatch.commands.len(), 1);
    assert_eq!(dispatch.commands[0].message_id.ledger_id, 0);
    assert_eq!(dispatch.commands[0].message_id.entry_id, 0);
    assert_eq!(
        dispatch.not_sent,
        vec![
            (Position::new(-1, 0), NotSentReason::InvalidPosition),
            (Position::new(0, -1), NotSentReason::InvalidPosition),
        ]
    );
    assert_eq!(d.total_available_permits(), 9);
}

/// Every dispatch that sends gets its own write id: a failed write removes
/// the consumer it went to and no other, and the other write still reports.
#[test]
fn each_dispatch_has_its_own_write_id() {
    let (mut d, (a, da), (b, db)) = two_consumers_one_dispatch_each();
    let (wa, wb) = (da.write_id.unwrap(), db.write_id.unwrap());
    assert_ne!(wa, wb);
    let removed = d
        .on_write_complete(wb, Err("connection reset".into()))
        .unwrap()
        .unwrap();
    assert_eq!(removed.key, b);
    assert_eq!(removed.replayed, vec![Position::new(4, 1)]);
    assert!(d.consumer(a).is_some(), "a's write did not fail");
    assert_eq!(d.on_write_complete(wa, Ok(())), Ok(None));
}

/// Removing a consumer forgets its own outstanding writes only: the other
/// consumer's write still reports, and its failure removes that consumer.
#[test]
fn removing_a_consumer_keeps_the_other_consumers_writes() {
    let (mut d, (a, da), (b, db)) = two_consumers_one_dispatch_each();
    d.remove_consumer(a).unwrap();
    let wa = da.write_id.unwrap();
    assert_eq!(
        d.on_write_complete(wa, Ok(())),
        Err(BrokerPermitError::UnknownWrite(wa))
    );
    let removed = d
        .on_write_complete(db.write_id.unwrap(), Err("connection reset".into()))
        .unwrap()
        .unwrap();
    assert_eq!(removed.key, b);
    assert_eq!(d.consumers().count(), 0);
}

/// Consumers 1:1 and 1:2 with 10 permits each, one entry dispatched to
/// each (entries 4:0 and 4:1).
fn two_consumers_one_dispatch_each() -> (
    SharedDispatcher,
    (ConsumerKey, Dispatch),
    (ConsumerKey, Dispatch),
) {
    let mut d = SharedDispatcher::new();
    let (a, b) = (key(1, 1), key(1, 2));
    for k in [a, b] {
        d.add_consumer(k, 0).unwrap();
        d.consumer_flow(k, 10).unwrap();
    }
    let send = |d: &mut SharedDispatcher, k, e| {
        d.send_to_consumer(k, vec![entry(e, 1, vec![])], &mut AdmitAll)
            .unwrap()
    };
    let da = send(&mut d, a, 0);
    let db = send(&mut d, b, 1);
    (d, (a, da), (b, db))
}
