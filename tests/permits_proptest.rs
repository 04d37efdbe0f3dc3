//! proptest model tests for `pulsar_core::permits` against simple reference
//! models (a `BTreeSet` of deliverable batch indexes, a naive bit loop):
//!
//! - the resolution ladder (early and full forms) over random B in 1..512,
//!   random `ack_set` words and random explicit values;
//! - the command budget: claimed + drained = P, both directly and through
//!   `ClientConsumer::handle_message` with random compacted-out messages,
//!   acknowledged duplicates and mid-batch truncation;
//! - the `ack_set` helpers;
//! - encode/decode round-trip of every wire type, and no panic on any
//!   truncated prefix;
//! - broker accounting (Flow / send / ack over two consumers, with duplicate
//!   positions within one send and across sends) against per-consumer
//!   `BTreeMap<Position, P>` pending acks and balances.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::collections::BTreeSet;

use proptest::prelude::*;
use prost::Message;
use pulsar_core::permits::client::{
    encode_entry_payload, resolve_early, resolve_full, ClientConnection, ClientConsumer,
    CommandBudget, CommandOutcomeKind, PermitProtocolError, PermitSource,
};
use pulsar_core::proto::metadata::{self, MessageMetadata, SingleMessageMetadata};
use pulsar_core::proto::wire::{self, CommandFlow, CommandMessage, MessageIdData};
use std::sync::Arc;

/// Reference: deliverable indexes below B, bit by bit.
fn reference_deliverable(ack_set: &[i64], b: u32) -> BTreeSet<u32> {
    (0..b)
        .filter(|i| {
            if ack_set.is_empty() {
                return true;
            }
            let w = (*i / 64) as usize;
            w < ack_set.len() && (ack_set[w] as u64) & (1u64 << (i % 64)) != 0
        })
        .collect()
}

fn reference_all_bits(ack_set: &[i64]) -> u64 {
    let mut n = 0;
    for w in ack_set {
        for bit in 0..64 {
            if (*w as u64 >> bit) & 1 == 1 {
                n += 1;
            }
        }
    }
    n
}

/// ack_set words: empty, sparse or dense, up to 9 words (past B = 511).
fn ack_set_strategy() -> impl Strategy<Value = Vec<i64>> {
    prop_oneof![
        Just(Vec::new()),
        prop::collection::vec(any::<i64>(), 1..9),
        prop::collection::vec(prop_oneof![Just(0i64), Just(-1i64), any::<i64>()], 1..9),
    ]
}

fn explicit_strategy() -> impl Strategy<Value = Option<u32>> {
    prop_oneof![
        Just(None),
        Just(Some(0)),
        Just(Some(u32::MAX)),
        (1u32..600).prop_map(Some),
        any::<u32>().prop_map(Some),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn ladder_matches_reference(b in 1u32..512, ack_set in ack_set_strategy(),
                                explicit in explicit_strategy(), use_expected in any::<bool>()) {
        let deliverable = reference_deliverable(&ack_set, b);
        let expected = deliverable.len() as u32;
        // half the time send the right explicit value
        let explicit = if use_expected && explicit.is_some() && expected > 0 { Some(expected) } else { explicit };
        let cmd = CommandMessage { ack_set: ack_set.clone(), message_permits: explicit, ..Default::default() };
        let valid = |p: u32| p >= 1 && p <= i32::MAX as u32;

        // early form
        let early = resolve_early(&cmd);
        match explicit {
            Some(p) if !valid(p) => prop_assert_eq!(early, Err(PermitProtocolError::InvalidExplicit(p))),
            Some(p) => prop_assert_eq!(early.unwrap().permits, p),
            None => {
                let all = reference_all_bits(&ack_set);
                let r = early.unwrap();
                if all > 0 {
                    prop_assert_eq!((r.permits, r.source), (all as u32, PermitSource::AckSet));
                } else {
                    prop_assert_eq!((r.permits, r.source), (1, PermitSource::Legacy));
                }
            }
        }

        // full form
        let full = resolve_full(&cmd, b);
        match explicit {
            Some(p) if !valid(p) => prop_assert_eq!(full, Err(PermitProtocolError::InvalidExplicit(p))),
            Some(p) if expected > 0 && p == expected => {
                let r = full.unwrap();
                prop_assert_eq!((r.permits, r.source), (p, PermitSource::Explicit));
            }
            Some(p) => prop_assert_eq!(full, Err(PermitProtocolError::Inconsistent {
                explicit: p, batch_size: b, expected: (expected > 0).then_some(expected) })),
            None => {
                let r = full.unwrap();
                if ack_set.is_empty() {
                    prop_assert_eq!((r.permits, r.source), (b, PermitSource::BatchMetadata));
                } else if expected > 0 {
                    prop_assert_eq!((r.permits, r.source), (expected, PermitSource::AckSet));
                } else {
                    prop_assert_eq!((r.permits, r.source), (1, PermitSource::Legacy));
                }
            }
        }
    }

    #[test]
    fn ack_set_helpers_match_reference(b in 1u32..512, ack_set in ack_set_strategy(),
                                       idx in prop::collection::btree_set(0u32..600, 0..40)) {
        let deliverable = reference_deliverable(&ack_set, b);
        prop_assert_eq!(wire::deliverable_indexes(&ack_set, b).collect::<BTreeSet<_>>(), deliverable.clone());
        if !ack_set.is_empty() {
            prop_assert_eq!(wire::popcount_below(&ack_set, b) as usize, deliverable.len());
        }
        prop_assert_eq!(wire::popcount_all(&ack_set), reference_all_bits(&ack_set));
        let built = wire::ack_set_from_indexes(idx.iter().copied());
        let below: BTreeSet<u32> = idx.iter().copied().filter(|i| *i < b).collect();
        if !idx.is_empty() {
            prop_assert_eq!(reference_deliverable(&built, b), below);
        }
    }

    /// Budget alone: random fates per deliverable index.
    #[test]
    fn budget_claimed_plus_drained_is_p(b in 1u32..512, ack_set in ack_set_strategy(),
                                        fates in prop::collection::vec(0u8..4, 512)) {
        let deliverable = reference_deliverable(&ack_set, b);
        prop_assume!(!deliverable.is_empty());
        let p = deliverable.len() as u32;
        let mut budget = CommandBudget::new(p);
        let mut handed_off = 0;
        for (n, _i) in deliverable.iter().enumerate() {
            match fates[n] {
                0 | 1 => { budget.claim().unwrap(); handed_off += 1; } // delivered
                2 => {}                                                // skipped
                _ => { budget.claim().unwrap(); budget.restore().unwrap(); break; } // failed hand-off
            }
        }
        prop_assert_eq!(budget.claimed(), handed_off);
        let claimed = budget.claimed();
        let drained = budget.drain();
        prop_assert_eq!(claimed + drained, p);
    }

    /// The real native-message path: delivered + returned = P, and the
    /// delivered set is exactly the reference's.
    #[test]
    fn handle_message_settles_exactly_p(b in 1u32..200, ack_set in ack_set_strategy(),
                                        compacted in prop::collection::btree_set(0u32..200, 0..20),
                                        acked in prop::collection::btree_set(0u32..200, 0..10),
                                        truncate_at in prop::option::of(0u32..200)) {
        let deliverable = reference_deliverable(&ack_set, b);
        prop_assume!(!deliverable.is_empty());
        let p = deliverable.len() as u32;
        let md = MessageMetadata { producer_name: "p".into(), num_messages_in_batch: Some(b as i32), ..Default::default() };
        let msgs: Vec<_> = (0..b).map(|i| (SingleMessageMetadata {
            payload_size: if Some(i) == truncate_at { 10_000 } else { 1 },
            compacted_out: compacted.contains(&i).then_some(true),
            ..Default::default()
        }, vec![i as u8])).collect();
        let payload = encode_entry_payload(&md, &msgs);
        let conn = Arc::new(ClientConnection::new(1));
        let mut c = ClientConsumer::subscribe(Arc::clone(&conn), 1, 1_000_000).unwrap();
        let inc = c.state().incarnation();
        c.subscribe_succeeded(inc).unwrap();
        for i in &acked {
            c.acknowledge(&MessageIdData { ledger_id: 1, entry_id: 2, batch_index: Some(*i as i32), ..Default::default() });
        }
        let cmd = CommandMessage {
            consumer_id: 1,
            message_id: MessageIdData { ledger_id: 1, entry_id: 2, ..Default::default() },
            ack_set: ack_set.clone(),
            message_permits: Some(p),
            ..Default::default()
        };
        let out = c.handle_message(&cmd, &payload).unwrap();
        let reference: Vec<u32> = deliverable.iter().copied()
            .take_while(|i| truncate_at.is_none_or(|t| *i < t))
            .filter(|i| !compacted.contains(i) && !acked.contains(i))
            .collect();
        prop_assert_eq!(out.permits, p);
        prop_assert_eq!(out.delivered + out.returned, p);
        prop_assert_eq!(out.delivered as usize, reference.len());
        // the oversized message fails its own hand-off if it is handed off,
        // otherwise the next header read fails (unless it was the last)
        let failed = truncate_at.is_some_and(|t| {
            t < b && (t + 1 < b || (deliverable.contains(&t) && !compacted.contains(&t) && !acked.contains(&t)))
        });
        let is_delivered_kind = matches!(out.kind, CommandOutcomeKind::Delivered { failed_mid_batch, .. } if failed_mid_batch == failed);
        prop_assert!(is_delivered_kind, "{:?}", out.kind);
        let got: Vec<u32> = std::iter::from_fn(|| c.receive()).map(|m| {
            let i = m.message_id.batch_index() as u32;
            m.release_permit().unwrap();
            i
        }).collect();
        prop_assert_eq!(got, reference);
        // everything came back to the incarnation, exactly once
        prop_assert_eq!(c.state().accumulated(), u64::from(p));
    }

    #[test]
    fn message_id_round_trip(ledger_id in any::<u64>(), entry_id in any::<u64>(),
                             partition in prop::option::of(any::<i32>()), batch_index in prop::option::of(any::<i32>()),
                             ack_set in prop::collection::vec(any::<i64>(), 0..5),
                             batch_size in prop::option::of(any::<i32>()), chunk in any::<bool>()) {
        let first = MessageIdData { ledger_id: entry_id, entry_id: ledger_id, ..Default::default() };
        let id = MessageIdData { ledger_id, entry_id, partition, batch_index, ack_set, batch_size,
                                 first_chunk_message_id: chunk.then(|| Box::new(first)) };
        let bytes = id.encode_to_vec();
        prop_assert_eq!(wire::decode_message_id(&bytes).unwrap(), id);
        for cut in 0..bytes.len() { let _ = wire::decode_message_id(&bytes[..cut]); }
    }

    #[test]
    fn command_message_round_trip(consumer_id in any::<u64>(), ledger_id in any::<u64>(), entry_id in any::<u64>(),
                                  redelivery_count in prop::option::of(any::<u32>()),
                                  ack_set in prop::collection::vec(any::<i64>(), 0..5),
                                  consumer_epoch in prop::option::of(any::<u64>()),
                                  message_permits in prop::option::of(any::<u32>())) {
        let cmd = CommandMessage {
            consumer_id,
            message_id: MessageIdData { ledger_id, entry_id, ..Default::default() },
            redelivery_count, ack_set, consumer_epoch, message_permits,
        };
        let bytes = cmd.encode_to_vec();
        prop_assert_eq!(wire::decode_command_message(&bytes).unwrap(), cmd);
        for cut in 0..bytes.len() { let _ = wire::decode_command_message(&bytes[..cut]); }
    }

    #[test]
    fn flow_and_metadata_round_trip(consumer_id in any::<u64>(), permits in any::<u32>(),
                                    producer_name in ".{0,12}", sequence_id in any::<u64>(), publish_time in any::<u64>(),
                                    num in prop::option::of(any::<i32>()),
                                    key in prop::option::of(".{0,8}"), payload_size in any::<i32>(),
                                    compacted_out in prop::option::of(any::<bool>())) {
        let flow = CommandFlow { consumer_id, message_permits: permits };
        prop_assert_eq!(wire::decode_command_flow(&flow.encode_to_vec()).unwrap(), flow);
        let md = MessageMetadata { producer_name, sequence_id, publish_time, num_messages_in_batch: num , ..Default::default() };
        let bytes = md.encode_to_vec();
        prop_assert_eq!(metadata::decode_message_metadata(&bytes).unwrap(), md);
        for cut in 0..bytes.len() { let _ = metadata::decode_message_metadata(&bytes[..cut]); }
        let smm = SingleMessageMetadata { partition_key: key, payload_size, compacted_out };
        let bytes = smm.encode_to_vec();
        prop_assert_eq!(metadata::decode_single_message_metadata(&bytes).unwrap(), smm);
        for cut in 0..bytes.len() { let _ = metadata::decode_single_message_metadata(&bytes[..cut]); }
    }

    /// Arbitrary bytes never panic any decoder or the message path.
    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64), p in 1u32..20) {
        let _ = wire::decode_command_message(&bytes);
        let _ = metadata::decode_message_metadata(&bytes);
        let conn = Arc::new(ClientConnection::new(1));
        let mut c = ClientConsumer::subscribe(Arc::clone(&conn), 1, 1000).unwrap();
        let inc = c.state().incarnation();
        c.subscribe_succeeded(inc).unwrap();
        let cmd = CommandMessage { consumer_id: 1, message_permits: Some(p), ..Default::default() };
        let out = c.handle_message(&cmd, &bytes).unwrap();
        // garbage is corruption (P returned) or an inconsistency (closed, 0)
        match out.kind {
            CommandOutcomeKind::ProtocolError(_) => prop_assert!(out.returned == 0 && conn.is_closed()),
            _ => prop_assert_eq!(out.delivered + out.returned, p),
        }
    }
}

/// One step of the broker-side model test.
#[derive(Debug, Clone)]
enum BrokerOp {
    /// Flow of `permits` to consumer `c`.
    Flow { c: u64, permits: u32 },
    /// One send to consumer `c` of entries `(entry_id, B, ack word)` drawn
    /// from a few positions, so duplicates within the call and positions
    /// still pending from an earlier call are common; entry ids divisible by
    /// 5 are rejected by admission.
    Send {
        c: u64,
        entries: Vec<(i64, u32, Option<i64>)>,
    },
    /// Acknowledge `entry_id` for consumer `c`.
    Ack { c: u64, entry_id: i64 },
}

fn broker_op() -> impl Strategy<Value = BrokerOp> {
    let entry = (0i64..8, 0u32..6, prop::option::of(0i64..64));
    prop_oneof![
        1 => (0u64..2, 1u32..20).prop_map(|(c, permits)| BrokerOp::Flow { c, permits }),
        3 => (0u64..2, prop::collection::vec(entry, 0..6))
            .prop_map(|(c, entries)| BrokerOp::Send { c, entries }),
        2 => (0u64..2, 0i64..8).prop_map(|(c, entry_id)| BrokerOp::Ack { c, entry_id }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Broker accounting (one pending P per position, unacked == Σ P)
    /// against a reference model: per consumer a
    /// `BTreeMap<Position, P>` of pending acks, a permit balance and the
    /// replay set. A position is sent at most once while pending (also when
    /// it appears twice in one call); unacked == Σ pending P; consumer and
    /// dispatcher debits equal Σ P of the commands; an ack settles exactly
    /// the P that was sent.
    #[test]
    fn broker_accounting_matches_reference(ops in prop::collection::vec(broker_op(), 1..60)) {
        use std::collections::BTreeMap;
        use pulsar_core::permits::broker::{BrokerEntry, ConsumerKey, NotSentReason, SharedDispatcher};
        use pulsar_core::Position;
        let key = |c: u64| ConsumerKey { connection_id: 1, consumer_id: c };
        let mut d = SharedDispatcher::new();
        let mut pending: [BTreeMap<Position, u32>; 2] = [BTreeMap::new(), BTreeMap::new()];
        let mut balance = [0i64; 2];
        let mut replay = BTreeSet::new();
        for c in 0..2 {
            d.add_consumer(key(c), 0).unwrap();
        }
        for op in ops {
            match op {
                BrokerOp::Flow { c, permits } => {
                    d.consumer_flow(key(c), permits).unwrap();
                    balance[c as usize] += i64::from(permits);
                }
                BrokerOp::Send { c, entries } => {
                    let entries: Vec<BrokerEntry> = entries
                        .into_iter()
                        .map(|(e, b, w)| BrokerEntry {
                            position: Position::new(1, e),
                            batch_size: b,
                            ack_set: w.map(|w| vec![w]).unwrap_or_default(),
                        })
                        .collect();
                    // Reference: the P each entry should be sent with.
                    let mut expected = Vec::new();
                    let mut expected_not_sent = Vec::new();
                    let pend = &mut pending[c as usize];
                    for e in &entries {
                        let p = reference_deliverable(&e.ack_set, e.batch_size).len() as u32;
                        let reason = if p == 0 {
                            NotSentReason::NoDeliverableIndex
                        } else if pend.contains_key(&e.position) {
                            NotSentReason::AlreadyPending
                        } else if e.position.entry_id % 5 == 0 {
                            NotSentReason::RejectedByAdmission
                        } else {
                            expected.push((e.position, p));
                            pend.extend([(e.position, p)]);
                            continue;
                        };
                        if reason != NotSentReason::AlreadyPending {
                            replay.insert(e.position);
                        }
                        expected_not_sent.push((e.position, reason));
                    }
                    let mut admission = |_k: ConsumerKey, e: &BrokerEntry| e.position.entry_id % 5 != 0;
                    let dispatch = d.send_to_consumer(key(c), entries, &mut admission).unwrap();
                    let sent: Vec<(Position, u32)> = dispatch
                        .commands
                        .iter()
                        .map(|m| (
                            Position::new(m.message_id.ledger_id as i64, m.message_id.entry_id as i64),
                            m.message_permits.unwrap(),
                        ))
                        .collect();
                    prop_assert_eq!(&sent, &expected);
                    prop_assert_eq!(&dispatch.not_sent, &expected_not_sent);
                    let total: u32 = expected.iter().map(|(_, p)| p).sum();
                    prop_assert_eq!(dispatch.result.total_permits(), total);
                    balance[c as usize] -= i64::from(total);
                }
                BrokerOp::Ack { c, entry_id } => {
                    let pos = Position::new(1, entry_id);
                    let got = d.acknowledge(key(c), pos).ok();
                    prop_assert_eq!(got, pending[c as usize].remove(&pos));
                }
            }
            for c in 0..2u64 {
                let con = d.consumer(key(c)).unwrap();
                let sum: i64 = pending[c as usize].values().map(|p| i64::from(*p)).sum();
                prop_assert_eq!(con.unacked_messages(), sum);
                prop_assert_eq!(con.pending_acks(), &pending[c as usize]);
                prop_assert_eq!(con.available_permits(), balance[c as usize]);
            }
            prop_assert_eq!(d.total_available_permits(), balance[0] + balance[1]);
            prop_assert_eq!(d.sum_consumer_permits(), d.total_available_permits());
        }
        prop_assert_eq!(d.take_replay(), replay.into_iter().collect::<Vec<_>>());
    }
}
