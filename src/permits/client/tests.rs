//! Unit tests of the client side: the ladder, the budget, Flow
//! revalidation per incarnation, and exact settlement per command.

use super::*;
use crate::proto::frame::encode_entry_payload;
use crate::proto::metadata::{MessageMetadata, SingleMessageMetadata};
use crate::proto::wire::{self, CommandMessage, MessageIdData, WireError, MAX_PERMITS};
use crate::sync::Arc;
use prost::Message;

fn cmd(permits: Option<u32>, ack_set: Vec<i64>) -> CommandMessage {
    CommandMessage {
        consumer_id: 1,
        message_id: MessageIdData {
            ledger_id: 3,
            entry_id: 4,
            ..Default::default()
        },
        ack_set,
        message_permits: permits,
        consumer_epoch: Some(0),
        ..Default::default()
    }
}

fn batch(b: usize, compacted: &[usize]) -> Vec<u8> {
    let md = MessageMetadata {
        producer_name: "p".into(),
        num_messages_in_batch: Some(b as i32),
        ..Default::default()
    };
    let msgs: Vec<_> = (0..b)
        .map(|i| {
            (
                SingleMessageMetadata {
                    payload_size: 2,
                    compacted_out: compacted.contains(&i).then_some(true),
                    ..Default::default()
                },
                vec![i as u8, 0xAB],
            )
        })
        .collect();
    encode_entry_payload(&md, &msgs)
}

/// rq = 100 (threshold 50): returns stay in the accumulator, so tests can
/// read exactly what a command returned.
fn consumer() -> (Arc<ClientConnection>, ClientConsumer) {
    let conn = Arc::new(ClientConnection::new(1));
    let mut c = ClientConsumer::subscribe(Arc::clone(&conn), 1, 100).unwrap();
    let inc = c.state().incarnation();
    assert_eq!(c.subscribe_succeeded(inc).unwrap(), 100);
    let frames = conn.take_outbox();
    assert_eq!(frames.len(), 2, "Subscribe then Flow(rq)");
    (conn, c)
}

fn flows(frames: &[ClientFrame]) -> Vec<(Incarnation, u32)> {
    frames
        .iter()
        .filter_map(|f| match f {
            ClientFrame::Flow {
                incarnation,
                command,
            } => Some((*incarnation, command.message_permits)),
            _ => None,
        })
        .collect()
}

#[test]
fn ladder_early_and_full() {
    let explicit = cmd(Some(3), vec![0b111]);
    assert_eq!(resolve_early(&explicit).unwrap().permits, 3);
    assert_eq!(
        resolve_full(&explicit, 10).unwrap().source,
        PermitSource::Explicit
    );
    // early counts all words; full only bits below B
    let legacy_ack = cmd(None, vec![0b111 | (1 << 40)]);
    assert_eq!(resolve_early(&legacy_ack).unwrap().permits, 4);
    assert_eq!(
        resolve_full(&legacy_ack, 10).unwrap(),
        ResolvedPermits {
            permits: 3,
            source: PermitSource::AckSet
        }
    );
    let legacy = cmd(None, vec![]);
    assert_eq!(resolve_early(&legacy).unwrap().source, PermitSource::Legacy);
    assert_eq!(
        resolve_full(&legacy, 10).unwrap(),
        ResolvedPermits {
            permits: 10,
            source: PermitSource::BatchMetadata
        }
    );
    // old broker, ambiguous: keeps the legacy 1, never an error
    assert_eq!(
        resolve_full(&cmd(None, vec![0b10]), 1).unwrap(),
        ResolvedPermits {
            permits: 1,
            source: PermitSource::Legacy
        }
    );
}

#[test]
fn ladder_rejects_invalid_and_inconsistent_explicit() {
    assert_eq!(
        resolve_early(&cmd(Some(0), vec![])),
        Err(PermitProtocolError::InvalidExplicit(0))
    );
    assert_eq!(
        resolve_early(&cmd(Some(u32::MAX), vec![])),
        Err(PermitProtocolError::InvalidExplicit(u32::MAX))
    );
    assert_eq!(
        resolve_full(&cmd(Some(2), vec![0b111]), 10),
        Err(PermitProtocolError::Inconsistent {
            explicit: 2,
            batch_size: 10,
            expected: Some(3)
        })
    );
    assert_eq!(
        resolve_full(&cmd(Some(1), vec![]), 10),
        Err(PermitProtocolError::Inconsistent {
            explicit: 1,
            batch_size: 10,
            expected: Some(10)
        })
    );
    assert_eq!(
        resolve_full(&cmd(Some(1), vec![0]), 4),
        Err(PermitProtocolError::Inconsistent {
            explicit: 1,
            batch_size: 4,
            expected: None
        })
    );
}

/// An ack recorded before a reconnect may have been lost with the old
/// connection: the redelivery to the new incarnation must reach the
/// application (found by the simulator: a restart dropped in-flight acks
/// and the redelivered batch was skipped forever, so it was never acked).
#[test]
fn redelivery_after_resubscribe_is_not_skipped_as_duplicate() {
    let (_conn, mut c) = consumer();
    let out = c
        .handle_message(&cmd(Some(2), vec![]), &batch(2, &[]))
        .unwrap();
    assert_eq!(out.delivered, 2);
    while let Some(m) = c.receive() {
        c.acknowledge(&m.message_id);
    }
    // Same incarnation: a redelivery is a duplicate, its P comes back.
    let dup = c
        .handle_message(&cmd(Some(2), vec![]), &batch(2, &[]))
        .unwrap();
    assert_eq!((dup.delivered, dup.returned), (0, 2));
    // New connection, new incarnation: delivered again.
    let conn2 = Arc::new(ClientConnection::new(2));
    let r = c.resubscribe(Arc::clone(&conn2)).unwrap();
    c.subscribe_succeeded(r.incarnation).unwrap();
    let again = c
        .handle_message(&cmd(Some(2), vec![]), &batch(2, &[]))
        .unwrap();
    assert_eq!(again.delivered, 2, "{again:?}");
}

#[test]
fn explicit_zero_closes_connection_with_zero_credit() {
    let (conn, mut c) = consumer();
    let out = c
        .handle_message(&cmd(Some(0), vec![]), &batch(1, &[]))
        .unwrap();
    assert_eq!(out.returned, 0);
    assert_eq!(out.delivered, 0);
    assert_eq!(
        out.kind,
        CommandOutcomeKind::ProtocolError(PermitProtocolError::InvalidExplicit(0))
    );
    assert!(conn.is_closed());
    assert!(c.state().is_closed());
    assert_eq!(c.state().accumulated(), 0);
    assert!(flows(&conn.take_outbox()).is_empty());
    // later commands on the dead incarnation settle nothing
    let later = c
        .handle_message(&cmd(Some(1), vec![]), &batch(1, &[]))
        .unwrap();
    assert_eq!(later.kind, CommandOutcomeKind::StaleIncarnation);
}

#[test]
fn inconsistent_explicit_closes_connection_with_zero_credit() {
    let (conn, mut c) = consumer();
    let out = c
        .handle_message(&cmd(Some(2), vec![0b111]), &batch(10, &[]))
        .unwrap();
    assert!(matches!(
        out.kind,
        CommandOutcomeKind::ProtocolError(PermitProtocolError::Inconsistent { .. })
    ));
    assert_eq!((out.delivered, out.returned), (0, 0));
    assert_eq!(c.queued(), 0);
    assert!(matches!(
        conn.close_reason(),
        Some(CloseReason::Protocol(
            PermitProtocolError::Inconsistent { .. }
        ))
    ));
}

#[test]
fn checksum_failure_on_p10_batch_returns_exactly_10() {
    let (conn, mut c) = consumer();
    let mut payload = batch(10, &[]);
    let last = payload.len() - 1;
    payload[last] ^= 0xFF;
    let out = c.handle_message(&cmd(Some(10), vec![]), &payload).unwrap();
    assert_eq!(
        out.kind,
        CommandOutcomeKind::Corrupted(ValidationError::ChecksumMismatch)
    );
    assert_eq!((out.permits, out.delivered, out.returned), (10, 0, 10));
    assert_eq!(c.state().accumulated(), 10);
    assert!(!conn.is_closed());
    assert!(conn.take_outbox().iter().any(|f| matches!(
        f,
        ClientFrame::AckValidationError {
            validation_error: ValidationError::ChecksumMismatch,
            ..
        }
    )));
}

#[test]
fn partial_batch_with_compacted_out_and_duplicate_returns_exactly_p() {
    let (_conn, mut c) = consumer();
    // B = 8, indexes 0,2,3,5,7 deliverable (P = 5); 3 compacted out, 5 acked
    let ack = wire::ack_set_from_indexes([0, 2, 3, 5, 7]);
    c.acknowledge(&MessageIdData {
        ledger_id: 3,
        entry_id: 4,
        batch_index: Some(5),
        ..Default::default()
    });
    let out = c
        .handle_message(&cmd(Some(5), ack), &batch(8, &[3]))
        .unwrap();
    assert_eq!(
        out.kind,
        CommandOutcomeKind::Delivered {
            skipped: 2,
            failed_mid_batch: false
        }
    );
    assert_eq!((out.delivered, out.returned), (3, 2));
    let ids: Vec<i32> = std::iter::from_fn(|| c.receive())
        .map(|m| {
            let i = m.message_id.batch_index();
            assert_eq!(
                m.release_permit().unwrap(),
                ReturnOutcome::Accepted { flow_requested: 0 }
            );
            i
        })
        .collect();
    assert_eq!(ids, vec![0, 2, 7]);
    assert_eq!(c.state().accumulated(), 5);
}

#[test]
fn mid_batch_failure_and_failed_handoff_return_the_rest() {
    let (_conn, mut c) = consumer();
    // message 2's payload_size runs past the end: claim, restore, stop
    let md = MessageMetadata {
        producer_name: "p".into(),
        num_messages_in_batch: Some(4),
        ..Default::default()
    };
    let mut msgs: Vec<_> = (0..3)
        .map(|i| {
            (
                SingleMessageMetadata {
                    payload_size: 1,
                    ..Default::default()
                },
                vec![i],
            )
        })
        .collect();
    msgs[2].0.payload_size = 50;
    let payload = encode_entry_payload(&md, &msgs);
    let out = c.handle_message(&cmd(Some(4), vec![]), &payload).unwrap();
    assert_eq!(
        out.kind,
        CommandOutcomeKind::Delivered {
            skipped: 0,
            failed_mid_batch: true
        }
    );
    assert_eq!((out.delivered, out.returned), (2, 2));
    // payload cut inside message 1's header: only message 0 delivered
    let full = batch(4, &[]);
    let mut cut = full[6..30].to_vec();
    let crc = crc32c(&cut);
    cut.splice(0..0, crc.to_be_bytes());
    cut.splice(0..0, crate::proto::frame::MAGIC_CRC32C.to_be_bytes());
    let out = c.handle_message(&cmd(Some(4), vec![]), &cut).unwrap();
    assert_eq!(out.delivered + out.returned, 4);
    assert!(matches!(
        out.kind,
        CommandOutcomeKind::Delivered {
            failed_mid_batch: true,
            ..
        }
    ));
}

#[test]
fn stale_epoch_returns_p_and_cleared_messages_return_once() {
    let (_conn, mut c) = consumer();
    let out = c
        .handle_message(&cmd(Some(3), vec![]), &batch(3, &[]))
        .unwrap();
    assert_eq!((out.delivered, out.returned), (3, 0));
    c.redeliver_unacknowledged();
    // the 3 queued messages were cleared and returned 1 each
    assert_eq!(c.state().accumulated(), 3);
    let stale = c
        .handle_message(&cmd(Some(3), vec![]), &batch(3, &[]))
        .unwrap();
    assert_eq!(stale.kind, CommandOutcomeKind::StaleEpoch);
    assert_eq!(stale.returned, 3);
    assert_eq!(c.state().accumulated(), 6);
}

#[test]
fn metadata_corruption_and_old_broker_paths() {
    let (conn, mut c) = consumer();
    // invalid B without explicit: corruption, early P (1) returned
    let md = MessageMetadata {
        producer_name: "p".into(),
        num_messages_in_batch: Some(0),
        ..Default::default()
    };
    let payload = encode_entry_payload(&md, &[]);
    let out = c.handle_message(&cmd(None, vec![]), &payload).unwrap();
    assert_eq!(
        out.kind,
        CommandOutcomeKind::Corrupted(ValidationError::BatchDeSerializeError)
    );
    assert_eq!(out.returned, 1);
    // invalid B with explicit: protocol error
    let out = c.handle_message(&cmd(Some(1), vec![]), &payload).unwrap();
    assert!(matches!(out.kind, CommandOutcomeKind::ProtocolError(_)));
    assert!(conn.is_closed());
    // truncated / empty payload: checksum failure, never a panic
    let (_conn, mut c) = consumer();
    for p in [&[][..], &[1, 2][..], &[0, 0, 0, 0][..]] {
        let out = c.handle_message(&cmd(Some(2), vec![]), p).unwrap();
        assert_eq!(out.returned, 2);
    }
}

#[test]
fn flow_drains_at_half_queue_and_is_revalidated_on_same_connection_recreate() {
    let conn = Arc::new(ClientConnection::new(7));
    let mut c = ClientConsumer::subscribe(Arc::clone(&conn), 1, 4).unwrap();
    let first = c.state().incarnation();
    c.subscribe_succeeded(first).unwrap();
    let old = Arc::clone(c.state());
    assert_eq!(
        old.return_permits(1),
        Ok(ReturnOutcome::Accepted { flow_requested: 0 })
    );
    assert_eq!(
        old.return_permits(1),
        Ok(ReturnOutcome::Accepted { flow_requested: 2 })
    );
    // recreate on the SAME connection before the connection task runs
    let r = c.resubscribe(Arc::clone(&conn)).unwrap();
    let second = c.state().incarnation();
    assert_eq!((r.previous, r.incarnation, r.cleared), (first, second, 0));
    assert_ne!(first, second);
    // a command the broker sent to `first` before it saw the new
    // Subscribe arrives before Success: discarded, no credit
    let early = c
        .handle_message(&cmd(Some(1), vec![]), &batch(1, &[]))
        .unwrap();
    assert_eq!(early.kind, CommandOutcomeKind::StaleIncarnation);
    assert_eq!(
        c.subscribe_succeeded(first),
        Err(ClientPermitError::NotCurrent(first))
    );
    assert_eq!(c.subscribe_succeeded(second).unwrap(), 4);
    assert_eq!(old.return_permits(5), Ok(ReturnOutcome::Stale));
    let report = conn.flush_flows();
    assert_eq!(report.written, vec![]);
    assert_eq!(report.dropped, vec![(first, 2)]);
    let frames = conn.take_outbox();
    assert_eq!(
        flows(&frames),
        vec![(first, 4), (second, 4)],
        "initial grants only; the old incarnation's queued Flow was dropped"
    );
    assert!(
        matches!(frames[2], ClientFrame::CloseConsumer { incarnation, .. } if incarnation == first)
    );
    assert!(
        matches!(frames[3], ClientFrame::Subscribe { incarnation, .. } if incarnation == second)
    );
    c.state().return_permits(2).unwrap();
    assert_eq!(conn.flush_flows().written, vec![(second, 2)]);
    // reconnect to a different connection: full queue granted there
    let conn2 = Arc::new(ClientConnection::new(8));
    let r = c.resubscribe(Arc::clone(&conn2)).unwrap();
    assert_eq!(r.incarnation.connection_id, 8);
    assert_eq!(c.subscribe_succeeded(r.incarnation).unwrap(), 4);
    let old_frames = conn.take_outbox();
    assert_eq!(flows(&old_frames), vec![(second, 2)]);
    assert!(
        matches!(old_frames.last(), Some(ClientFrame::CloseConsumer { incarnation, .. }) if *incarnation == second)
    );
    assert_eq!(flows(&conn2.take_outbox()), vec![(r.incarnation, 4)]);
}

/// The receiver queue is granted once per incarnation: Subscribe succeeds
/// once, so the
/// receiver queue is granted once; a second call is a typed error that
/// writes nothing and changes nothing.
#[test]
fn subscribe_succeeded_twice_grants_once() {
    let conn = Arc::new(ClientConnection::new(1));
    let st = conn.subscribe(7, 100).unwrap();
    assert_eq!(conn.subscribe_succeeded(&st), Ok(100));
    st.return_permits(3).unwrap();
    assert_eq!(
        conn.subscribe_succeeded(&st),
        Err(ClientPermitError::AlreadySubscribed(st.incarnation()))
    );
    assert_eq!(st.accumulated(), 3, "the accumulator is left alone");
    let frames = conn.take_outbox();
    assert_eq!(flows(&frames), vec![(st.incarnation(), 100)]);
    // Through the consumer too.
    let mut c = ClientConsumer::subscribe(Arc::clone(&conn), 8, 10).unwrap();
    let inc = c.state().incarnation();
    assert_eq!(c.subscribe_succeeded(inc), Ok(10));
    assert_eq!(
        c.subscribe_succeeded(inc),
        Err(ClientPermitError::AlreadySubscribed(inc))
    );
    assert_eq!(flows(&conn.take_outbox()), vec![(inc, 10)]);
    // A new incarnation is granted again.
    let r = c.resubscribe(Arc::clone(&conn)).unwrap();
    assert_eq!(c.subscribe_succeeded(r.incarnation), Ok(10));
}

#[test]
fn accumulator_overflow_closes_the_connection() {
    let conn = Arc::new(ClientConnection::new(1));
    let state = conn.subscribe(1, 0).unwrap();
    // flow disabled: returns accumulate
    state.return_permits(MAX_PERMITS).unwrap();
    assert_eq!(
        state.return_permits(1),
        Err(PermitProtocolError::AccumulatorOverflow {
            current: u64::from(MAX_PERMITS),
            added: 1
        })
    );
    assert!(state.is_closed());
    assert!(conn.is_closed());
    assert_eq!(state.return_permits(1), Ok(ReturnOutcome::Stale));
    assert_eq!(
        conn.subscribe(2, 10).unwrap_err(),
        ClientPermitError::ConnectionClosed(1)
    );
}

#[test]
fn budget_claim_restore_drain() {
    let mut b = CommandBudget::new(2);
    assert_eq!(b.restore(), Err(BudgetError::NothingClaimed { permits: 2 }));
    b.claim().unwrap();
    b.claim().unwrap();
    assert_eq!(b.claim(), Err(BudgetError::Exhausted { permits: 2 }));
    b.restore().unwrap();
    assert_eq!(b.claimed(), 1);
    assert_eq!(b.drain(), 1);
}

#[test]
fn truncated_command_frame_closes_with_zero_credit() {
    let (conn, mut c) = consumer();
    let bytes = cmd(Some(3), vec![]).encode_to_vec();
    let ok = c.handle_command_bytes(&bytes, &batch(3, &[])).unwrap();
    assert_eq!((ok.delivered, ok.returned), (3, 0));
    // cut inside the last field (message_permits' value): a decode error
    // (a cut on a field boundary is a valid shorter message; the frame's
    // length prefix, not protobuf, detects that)
    let out = c
        .handle_command_bytes(&bytes[..bytes.len() - 1], &batch(3, &[]))
        .unwrap();
    assert!(matches!(
        out.kind,
        CommandOutcomeKind::ProtocolError(PermitProtocolError::Malformed(
            WireError::Decode { .. } | WireError::Presence(_)
        ))
    ));
    assert_eq!(out.returned, 0);
    assert!(conn.is_closed());
    // the 3 delivered messages now belong to a closed incarnation
    while let Some(m) = c.receive() {
        assert_eq!(m.release_permit(), Ok(ReturnOutcome::Stale));
    }
    assert_eq!(c.state().accumulated(), 0);
}

#[test]
fn wrong_consumer_is_rejected_without_settling() {
    let (_conn, mut c) = consumer();
    let mut m = cmd(Some(1), vec![]);
    m.consumer_id = 9;
    assert_eq!(
        c.handle_message(&m, &batch(1, &[])),
        Err(ClientPermitError::WrongConsumer {
            expected: 1,
            got: 9
        })
    );
    assert_eq!(c.state().accumulated(), 0);
}

/// The receiver queue holds what was handed off and not yet received; each
/// received message's permit token names the incarnation it was delivered
/// to, also after the consumer moved to a new one.
#[test]
fn queued_messages_and_their_tokens_incarnation() {
    let (_conn, mut c) = consumer();
    let first = c.state().incarnation();
    assert_eq!(c.queued(), 0);
    let out = c
        .handle_message(&cmd(Some(3), vec![]), &batch(3, &[]))
        .unwrap();
    assert_eq!(out.delivered, 3);
    assert_eq!(c.queued(), 3);
    let m = c.receive().unwrap();
    assert_eq!(c.queued(), 2);
    assert_eq!(m.token.incarnation(), Some(first));
    let conn2 = Arc::new(ClientConnection::new(2));
    let r = c.resubscribe(Arc::clone(&conn2)).unwrap();
    assert_eq!(r.cleared, 2);
    assert_eq!(c.queued(), 0);
    assert_ne!(r.incarnation, first);
    assert_eq!(
        m.token.incarnation(),
        Some(first),
        "the token still names the incarnation that delivered it"
    );
}

/// A consumer whose incarnation is already closed does not close its id on
/// the old connection when it moves: that id may belong to another
/// incarnation by then, which must stay open.
#[test]
fn resubscribing_after_a_close_leaves_the_ids_new_owner_open() {
    let (conn, mut c) = consumer();
    conn.close_consumer(1).unwrap();
    assert!(c.state().is_closed());
    let other = ClientConsumer::subscribe(Arc::clone(&conn), 1, 100).unwrap();
    let conn2 = Arc::new(ClientConnection::new(2));
    c.resubscribe(Arc::clone(&conn2)).unwrap();
    assert!(
        !other.state().is_closed(),
        "id 1 on the first connection is not c's any more"
    );
    assert!(Arc::ptr_eq(&conn.current(1).unwrap(), other.state()));
}

/// Each message handed to the application carries its own id: for a batch,
/// its batch index and the batch size, without the command's `ack_set`;
/// for a non-batched message no batch fields. A non-batched message already
/// acknowledged in this incarnation is skipped when it comes again, and its
/// permit goes back.
#[test]
fn received_message_ids_and_a_redelivered_acknowledged_single_message() {
    let (_conn, mut c) = consumer();
    // indexes 0 and 2 of 3 still to deliver (the command's message id
    // carrying the same ack_set)
    let mut partial = cmd(Some(2), vec![0b101]);
    partial.message_id.ack_set = vec![0b101];
    let out = c.handle_message(&partial, &batch(3, &[])).unwrap();
    assert_eq!(out.delivered, 2);
    let ids: Vec<MessageIdData> = std::iter::from_fn(|| c.receive())
        .map(|m| m.message_id)
        .collect();
    for (id, index) in ids.iter().zip([0, 2]) {
        assert_eq!((id.ledger_id, id.entry_id), (3, 4));
        assert_eq!(id.batch_index, Some(index));
        assert_eq!(id.batch_size, Some(3));
        assert!(id.ack_set.is_empty(), "{id:?}");
    }
    let single = encode_entry_payload(
        &MessageMetadata {
            producer_name: "p".into(),
            ..Default::default()
        },
        &[(SingleMessageMetadata::default(), b"one".to_vec())],
    );
    let mut one = cmd(Some(1), vec![]);
    one.message_id.entry_id = 5;
    assert_eq!(c.handle_message(&one, &single).unwrap().delivered, 1);
    let m = c.receive().unwrap();
    assert_eq!(
        (m.message_id.batch_index, m.message_id.batch_size),
        (None, None)
    );
    assert_eq!(m.payload, b"one");
    c.acknowledge(&m.message_id);
    let again = c.handle_message(&one, &single).unwrap();
    assert_eq!((again.delivered, again.returned), (0, 1), "{again:?}");
}
