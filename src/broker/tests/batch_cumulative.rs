//! A cumulative ack inside a batch on an Exclusive subscription, across a
//! crash (the core dropped without a close, the store reopened): Pulsar's
//! `Consumer.messageAcked` turns a cumulative id with an `ack_set` into a
//! position with that ack set, `ManagedCursorImpl.asyncMarkDelete` moves
//! mark-delete to L:E-1 and keeps the entry's remaining indexes
//! (batchDeletedIndexes), so they are redelivered after a restart; an id
//! without an `ack_set` is the whole entry L:E, whatever its batch_index.

use super::*;

/// The id magnetar puts in a cumulative ACK of message `index` of an
/// 8-message batch at `p`, with the `ack_set` a batch-index-ack client adds.
fn batch_id(p: Position, index: i32, ack_set: Vec<i64>) -> MessageIdData {
    MessageIdData {
        ledger_id: p.ledger_id as u64,
        entry_id: p.entry_id as u64,
        partition: Some(-1),
        batch_index: Some(index),
        ack_set,
        batch_size: Some(8),
        first_chunk_message_id: None,
    }
}

fn ack_response(cid: u64, request_id: u64) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::ACK_RESPONSE,
        ack_response: Some(command::CommandAckResponse {
            consumer_id: cid,
            txnid_least_bits: None,
            txnid_most_bits: None,
            error: None,
            message: None,
            request_id: Some(request_id),
        }),
        ..Default::default()
    }
}

/// Runs the frames of the interop run up to the kill: an unbatched entry
/// and an 8-message batch dispatched to an Exclusive consumer, then one
/// cumulative ACK of index 4 of the batch carrying `ack_set`; the core is
/// dropped right after the ack response (no close). Returns the positions.
fn ack_inside_a_batch_then_crash(dir: &tempfile::TempDir, ack_set: Vec<i64>) -> [Position; 2] {
    let mut b = core(dir);
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    let p0 = send(&mut b, 1, 1, 0, &entry(None, None, None));
    let p1 = send(&mut b, 1, 1, 1, &batch_entry(8));
    subscribe(&mut b, 1, 3, "ex", sub_type::EXCLUSIVE, "ex-0");
    assert_eq!(flow(&mut b, 1, 3, 1000).len(), 2);
    let out = ack(
        &mut b,
        1,
        3,
        true,
        vec![batch_id(p1, 4, ack_set)],
        Some(126),
    );
    assert_eq!(out, vec![(1, ack_response(3, 126), 0)]);
    [p0, p1]
}

/// What a new Exclusive consumer gets after the restart.
fn after_restart(dir: &tempfile::TempDir) -> (Broker, Vec<BrokerCommand>) {
    let mut b = core(dir);
    connect(&mut b, 1);
    subscribe(&mut b, 1, 3, "ex", sub_type::EXCLUSIVE, "ex-0");
    let out = flow(&mut b, 1, 3, 1000);
    (b, out.into_iter().map(|(_, f, _)| f).collect())
}

#[test]
fn a_cumulative_ack_with_ack_set_keeps_the_batch_rest_across_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    // Indexes 0..=4 acknowledged: bits 5, 6 and 7 remain.
    let remaining = vec![0b1110_0000];
    let [p0, p1] = ack_inside_a_batch_then_crash(&dir, remaining.clone());
    let (b, out) = after_restart(&dir);
    assert_eq!(sub(&b, "ex").mark_delete(), p0, "mark-delete is L:E-1");
    assert_eq!(
        sub(&b, "ex").deletion().batch_ack_set(p1),
        Some(remaining.clone())
    );
    // The entry again, with the ack_set the client filters by: 3 messages.
    assert_eq!(out, vec![message(3, p1, 0, remaining, 3)]);
}

#[test]
fn a_cumulative_ack_without_ack_set_covers_the_whole_entry() {
    // The exact ACK of the interop run (batch_index 4 of 8, no ack_set):
    // Pulsar's broker ignores batch_index without an ack_set, so the
    // entry is acknowledged whole and nothing of it is redelivered.
    let dir = tempfile::tempdir().unwrap();
    let [_, p1] = ack_inside_a_batch_then_crash(&dir, Vec::new());
    let (b, out) = after_restart(&dir);
    assert_eq!(sub(&b, "ex").mark_delete(), p1);
    assert_eq!(out, vec![]);
}
