//! PIP-491 broker side (Pulsar's Shared dispatcher and `Consumer`): a
//! closed connection removes exactly its consumers, their balances leave
//! the dispatcher total and their pending acks go to replay; each command
//! carries the consumer's epoch, and an `ack_set` with every index below B
//! still deliverable is sent as a full batch (no `ack_set`).
//!
//! Plain std test: compiled out in loom/shuttle builds.
#![cfg(not(any(loom, feature = "shuttle")))]

use pulsar_core::permits::broker::{
    AdmitAll, BrokerEntry, BrokerPermitError, ConsumerKey, SendMessagesResult, SharedDispatcher,
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
