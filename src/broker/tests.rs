//! Sans-io tests of the broker core: commands in, the exact frames out.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use prost::Message;

use super::subscription::{sub_type, Subscription};
use super::*;
use crate::delayed::VirtualClock;
use crate::ledger::{LedgerConfig, ManagedLedger, RedbStore};
use crate::proto::command::{self, server_error, ty, BrokerCommand};
use crate::proto::frame::{crc32c, encode_entry_payload};
use crate::proto::metadata::{MessageMetadata, SingleMessageMetadata};
use crate::proto::wire::{
    CommandAck, CommandFlow, CommandMessage, CommandRedeliverUnacknowledgedMessages,
    CommandSubscribe, MessageIdData,
};
use crate::Position;

const T0: u64 = 1_700_000_000_000;
const TOPIC: &str = "persistent://public/default/t";

fn open_store(dir: &tempfile::TempDir) -> RedbStore {
    RedbStore::open(dir.path().join("store.redb")).unwrap()
}

fn core(dir: &tempfile::TempDir) -> Broker {
    Broker::new(open_store(dir), BrokerConfig::new("pulsar://node:6650"), T0)
}

fn enc(c: &BrokerCommand) -> Vec<u8> {
    c.encode_to_vec()
}

/// Every output queued, as (connection, decoded command, payload length);
/// closes and incarnation records are dropped, and every read the core
/// issues completes at once (as `serve` completes them).
fn frames(b: &mut Broker) -> Vec<(u64, BrokerCommand, usize)> {
    let mut v = Vec::new();
    while let Some(o) = b.poll_output() {
        match o {
            Output::Frame { conn, frame } => {
                v.push((conn, frame.decode_command().unwrap(), frame.payload.len()));
            }
            Output::ReadIssued { read } => {
                b.complete_read(read, T0);
            }
            _ => {}
        }
    }
    v
}

fn feed(b: &mut Broker, conn: u64, c: BrokerCommand) -> Vec<(u64, BrokerCommand, usize)> {
    b.handle_frame(conn, &enc(&c), &[], T0).unwrap();
    frames(b)
}

fn connect(b: &mut Broker, conn: u64) {
    b.handle_open(conn, T0);
    let out = feed(
        b,
        conn,
        BrokerCommand {
            r#type: ty::CONNECT,
            connect: Some(command::CommandConnect {
                client_version: "test".into(),
                protocol_version: Some(21),
            }),
            ..Default::default()
        },
    );
    let expected = BrokerCommand {
        r#type: ty::CONNECTED,
        connected: Some(command::CommandConnected {
            server_version: format!("pulsar-core {}", env!("CARGO_PKG_VERSION")),
            protocol_version: Some(PROTOCOL_VERSION),
            max_message_size: Some(MAX_MESSAGE_SIZE),
        }),
        ..Default::default()
    };
    assert_eq!(out, vec![(conn, expected, 0)]);
}

fn producer(b: &mut Broker, conn: u64, pid: u64) {
    let out = feed(
        b,
        conn,
        BrokerCommand {
            r#type: ty::PRODUCER,
            producer: Some(command::CommandProducer {
                topic: "t".into(),
                producer_id: pid,
                request_id: 100 + pid,
                producer_name: Some("p".into()),
                producer_access_mode: None,
                topic_epoch: None,
            }),
            ..Default::default()
        },
    );
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1.r#type, ty::PRODUCER_SUCCESS);
}

/// An entry as a producer writes it: `MessageMetadata` with an optional
/// partition key and `deliver_at_time`, and `batch` messages (a batch when
/// `Some`).
fn entry(key: Option<&str>, batch: Option<u32>, deliver_at: Option<i64>) -> Vec<u8> {
    let md = MessageMetadata {
        producer_name: "p".into(),
        sequence_id: 1,
        publish_time: 2,
        partition_key: key.map(str::to_string),
        num_messages_in_batch: batch.map(|n| n as i32),
        deliver_at_time: deliver_at,
        ..Default::default()
    }
    .encode_to_vec();
    let mut body = Vec::new();
    body.extend_from_slice(&(md.len() as u32).to_be_bytes());
    body.extend_from_slice(&md);
    match batch {
        None => body.extend_from_slice(b"m"),
        Some(n) => {
            for _ in 0..n {
                let s = SingleMessageMetadata {
                    payload_size: 1,
                    ..Default::default()
                }
                .encode_to_vec();
                body.extend_from_slice(&(s.len() as u32).to_be_bytes());
                body.extend_from_slice(&s);
                body.push(b'm');
            }
        }
    }
    let mut out = vec![0x0e, 0x01];
    out.extend_from_slice(&crc32c(&body).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

fn send(b: &mut Broker, conn: u64, pid: u64, seq: u64, payload: &[u8]) -> Position {
    send_with(b, conn, pid, seq, payload).0
}

/// SEND; the position of its receipt and every frame queued with it (the
/// dispatch the append triggered).
fn send_with(
    b: &mut Broker,
    conn: u64,
    pid: u64,
    seq: u64,
    payload: &[u8],
) -> (Position, Vec<(u64, BrokerCommand, usize)>) {
    let c = BrokerCommand {
        r#type: ty::SEND,
        send: Some(command::CommandSend {
            producer_id: pid,
            sequence_id: seq,
            ..Default::default()
        }),
        ..Default::default()
    };
    b.handle_frame(conn, &enc(&c), payload, T0).unwrap();
    let out = frames(b);
    let receipt = out
        .iter()
        .find(|(c, f, _)| *c == conn && f.r#type == ty::SEND_RECEIPT)
        .expect("a SEND_RECEIPT");
    let id = receipt
        .1
        .send_receipt
        .as_ref()
        .unwrap()
        .message_id
        .clone()
        .unwrap();
    (Position::new(id.ledger_id as i64, id.entry_id as i64), out)
}

#[allow(clippy::too_many_arguments)]
fn subscribe_cmd(cid: u64, sub: &str, st: i32, name: &str, priority: i32) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::SUBSCRIBE,
        subscribe: Some(CommandSubscribe {
            topic: "t".into(),
            subscription: sub.into(),
            sub_type: st,
            consumer_id: cid,
            request_id: 200 + cid,
            consumer_name: Some(name.into()),
            priority_level: Some(priority),
            durable: None,
            initial_position: Some(1),
            key_shared_meta: None,
            consumer_epoch: None,
        }),
        ..Default::default()
    }
}

fn subscribe(b: &mut Broker, conn: u64, cid: u64, sub: &str, st: i32, name: &str) {
    let out = feed(b, conn, subscribe_cmd(cid, sub, st, name, 0));
    assert_eq!(out, vec![(conn, success(200 + cid), 0)]);
}

fn success(request_id: u64) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::SUCCESS,
        success: Some(command::CommandSuccess { request_id }),
        ..Default::default()
    }
}

fn flow(b: &mut Broker, conn: u64, cid: u64, n: u32) -> Vec<(u64, BrokerCommand, usize)> {
    feed(
        b,
        conn,
        BrokerCommand {
            r#type: ty::FLOW,
            flow: Some(CommandFlow {
                consumer_id: cid,
                message_permits: n,
            }),
            ..Default::default()
        },
    )
}

fn message(
    cid: u64,
    p: Position,
    redelivery: u32,
    ack_set: Vec<i64>,
    permits: u32,
) -> BrokerCommand {
    BrokerCommand {
        r#type: ty::MESSAGE,
        message: Some(CommandMessage {
            consumer_id: cid,
            message_id: MessageIdData {
                ledger_id: p.ledger_id as u64,
                entry_id: p.entry_id as u64,
                partition: Some(-1),
                batch_index: None,
                ack_set: Vec::new(),
                batch_size: None,
                first_chunk_message_id: None,
            },
            redelivery_count: Some(redelivery),
            ack_set,
            consumer_epoch: Some(0),
            message_permits: Some(permits),
        }),
        ..Default::default()
    }
}

fn mid(p: Position, ack_set: Vec<i64>) -> MessageIdData {
    MessageIdData {
        ledger_id: p.ledger_id as u64,
        entry_id: p.entry_id as u64,
        partition: None,
        batch_index: None,
        ack_set,
        batch_size: None,
        first_chunk_message_id: None,
    }
}

fn ack(
    b: &mut Broker,
    conn: u64,
    cid: u64,
    cumulative: bool,
    ids: Vec<MessageIdData>,
    request_id: Option<u64>,
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
                txnid_least_bits: None,
                txnid_most_bits: None,
                request_id,
            }),
            ..Default::default()
        },
    )
}

fn sub<'a>(b: &'a Broker, name: &str) -> &'a Subscription {
    &b.topics()[TOPIC].subscriptions[name]
}

/// The shared start of most tests: connection 1 with producer 1.
fn with_producer() -> (tempfile::TempDir, Broker) {
    let dir = tempfile::tempdir().unwrap();
    let mut b = core(&dir);
    connect(&mut b, 1);
    producer(&mut b, 1, 1);
    (dir, b)
}

#[test]
fn subscribe_then_flow_sends_messages_with_message_permits() {
    let (_d, mut b) = with_producer();
    let p0 = send(&mut b, 1, 1, 0, &entry(None, None, None));
    let p1 = send(&mut b, 1, 1, 1, &entry(None, Some(3), None));
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    let out = flow(&mut b, 1, 7, 10);
    assert_eq!(
        out.iter()
            .map(|(c, f, _)| (*c, f.clone()))
            .collect::<Vec<_>>(),
        vec![
            (1, message(7, p0, 0, vec![], 1)),
            (1, message(7, p1, 0, vec![], 3)),
        ]
    );
    // The payload is the stored entry.
    assert_eq!(out[0].2, entry(None, None, None).len());
    let c = &sub(&b, "s").consumers[0];
    assert_eq!((c.granted, c.debited, c.commands), (10, 4, 2));
    assert_eq!(sub(&b, "s").available(c.key), 6);
}

#[test]
fn individual_cumulative_and_batch_index_acks() {
    let (_d, mut b) = with_producer();
    let ps: Vec<Position> = (0..4)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, Some(3), None)))
        .collect();
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    assert_eq!(flow(&mut b, 1, 7, 100).len(), 4);
    // Batch index ack: indexes 0 and 1 of entry 2 acknowledged (bit 2 left).
    let out = ack(&mut b, 1, 7, false, vec![mid(ps[2], vec![0b100])], Some(9));
    let ack_response = BrokerCommand {
        r#type: ty::ACK_RESPONSE,
        ack_response: Some(command::CommandAckResponse {
            consumer_id: 7,
            txnid_least_bits: None,
            txnid_most_bits: None,
            error: None,
            message: None,
            request_id: Some(9),
        }),
        ..Default::default()
    };
    assert_eq!(out, vec![(1, ack_response, 0)]);
    assert_eq!(
        sub(&b, "s").deletion().batch_ack_set(ps[2]),
        Some(vec![0b100])
    );
    // Individual ack of entry 1; cumulative ack up to entry 0.
    assert!(ack(&mut b, 1, 7, false, vec![mid(ps[1], vec![])], None).is_empty());
    assert!(sub(&b, "s").deletion().is_message_deleted(ps[1]));
    assert!(ack(&mut b, 1, 7, true, vec![mid(ps[0], vec![])], None).is_empty());
    assert_eq!(
        sub(&b, "s").mark_delete(),
        ps[1],
        "mark-delete moves over the deleted entry 1"
    );
    // The last index of entry 2 deletes it; the cumulative ack of entry 3
    // moves mark-delete to the end.
    ack(&mut b, 1, 7, false, vec![mid(ps[2], vec![0])], None);
    ack(&mut b, 1, 7, true, vec![mid(ps[3], vec![])], None);
    assert_eq!(sub(&b, "s").mark_delete(), ps[3]);
    let s = sub(&b, "s");
    assert_eq!(s.balance(s.consumers[0].key).1, 0);
    // An ack for an unknown consumer gets an error response, not a close.
    let out = ack(&mut b, 1, 99, false, vec![mid(ps[0], vec![])], Some(10));
    let r = out[0].1.ack_response.as_ref().unwrap();
    assert_eq!(r.error, Some(server_error::UNKNOWN_ERROR));
}

#[test]
fn redelivery_resends_with_a_higher_redelivery_count() {
    let (_d, mut b) = with_producer();
    let p0 = send(&mut b, 1, 1, 0, &entry(None, None, None));
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    assert_eq!(flow(&mut b, 1, 7, 10).len(), 1);
    let out = feed(
        &mut b,
        1,
        BrokerCommand {
            r#type: ty::REDELIVER_UNACKNOWLEDGED_MESSAGES,
            redeliver_unacknowledged_messages: Some(CommandRedeliverUnacknowledgedMessages {
                consumer_id: 7,
                message_ids: vec![],
                consumer_epoch: None,
            }),
            ..Default::default()
        },
    );
    assert_eq!(
        out,
        vec![(
            1,
            message(7, p0, 1, vec![], 1),
            entry(None, None, None).len()
        )]
    );
}

#[test]
fn a_closed_consumers_unacknowledged_entries_go_to_another_consumer() {
    let (_d, mut b) = with_producer();
    let ps: Vec<Position> = (0..3)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    connect(&mut b, 2);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "a");
    subscribe(&mut b, 2, 8, "s", sub_type::SHARED, "b");
    assert_eq!(flow(&mut b, 1, 7, 10).len(), 3);
    assert!(flow(&mut b, 2, 8, 10).is_empty());
    ack(&mut b, 1, 7, false, vec![mid(ps[1], vec![])], None);
    let out = feed(
        &mut b,
        1,
        BrokerCommand {
            r#type: ty::CLOSE_CONSUMER,
            close_consumer: Some(command::CommandIdRequest {
                id: 7,
                request_id: 5,
            }),
            ..Default::default()
        },
    );
    let cmds: Vec<(u64, BrokerCommand)> = out.into_iter().map(|(c, f, _)| (c, f)).collect();
    assert_eq!(
        cmds,
        vec![
            (2, message(8, ps[0], 1, vec![], 1)),
            (2, message(8, ps[2], 1, vec![], 1)),
            (1, success(5)),
        ]
    );
    // A connection close does the same for its consumers.
    b.handle_close(2, T0);
    connect(&mut b, 3);
    subscribe(&mut b, 3, 9, "s", sub_type::SHARED, "c");
    let out = flow(&mut b, 3, 9, 10);
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].1, message(9, ps[0], 2, vec![], 1));
}

/// PIP-491: a consumer closed and subscribed again with the same id on the
/// same connection is a new incarnation: the old one's unacknowledged
/// entries are redelivered to it (its client dropped them with the old
/// incarnation), and its permits are its own grant only, never the old
/// incarnation's left-over credit.
#[test]
fn a_same_connection_resubscribe_is_a_new_incarnation() {
    let (_d, mut b) = with_producer();
    let ps: Vec<Position> = (0..3)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "a");
    assert_eq!(flow(&mut b, 1, 7, 10).len(), 3);
    let close = BrokerCommand {
        r#type: ty::CLOSE_CONSUMER,
        close_consumer: Some(command::CommandIdRequest {
            id: 7,
            request_id: 5,
        }),
        ..Default::default()
    };
    assert_eq!(feed(&mut b, 1, close), vec![(1, success(5), 0)]);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "a");
    assert_eq!(sub(&b, "s").consumers.len(), 1);
    assert_eq!(
        sub(&b, "s").consumers[0].granted,
        0,
        "no credit carried over"
    );
    let out: Vec<BrokerCommand> = flow(&mut b, 1, 7, 2).into_iter().map(|f| f.1).collect();
    assert_eq!(
        out,
        vec![
            message(7, ps[0], 1, vec![], 1),
            message(7, ps[1], 1, vec![], 1)
        ]
    );
    let s = sub(&b, "s");
    assert_eq!(s.available(s.consumers[0].key), 0);
    // Acks of the new incarnation settle what it was delivered.
    ack(&mut b, 1, 7, false, vec![mid(ps[0], vec![])], None);
    let out: Vec<BrokerCommand> = flow(&mut b, 1, 7, 1).into_iter().map(|f| f.1).collect();
    assert_eq!(out, vec![message(7, ps[2], 1, vec![], 1)]);
}

#[test]
fn failover_sends_to_the_active_consumer_only() {
    let (_d, mut b) = with_producer();
    let ps: Vec<Position> = (0..2)
        .map(|i| send(&mut b, 1, 1, i, &entry(None, None, None)))
        .collect();
    connect(&mut b, 2);
    // Active: lowest priority level, then name: "a" on connection 2.
    let out = feed(&mut b, 1, subscribe_cmd(7, "f", sub_type::FAILOVER, "b", 0));
    assert_eq!(out[0], (1, success(207), 0));
    let out = feed(&mut b, 2, subscribe_cmd(8, "f", sub_type::FAILOVER, "a", 0));
    assert_eq!(out[0], (2, success(208), 0));
    assert!(flow(&mut b, 1, 7, 10).is_empty());
    let out = flow(&mut b, 2, 8, 10);
    assert_eq!(
        out.into_iter().map(|(c, f, _)| (c, f)).collect::<Vec<_>>(),
        vec![
            (2, message(8, ps[0], 0, vec![], 1)),
            (2, message(8, ps[1], 0, vec![], 1))
        ]
    );
}

#[test]
fn a_second_exclusive_consumer_is_busy_and_types_must_match() {
    let (_d, mut b) = with_producer();
    subscribe(&mut b, 1, 7, "x", sub_type::EXCLUSIVE, "a");
    let out = feed(
        &mut b,
        1,
        subscribe_cmd(8, "x", sub_type::EXCLUSIVE, "b", 0),
    );
    let e = out[0].1.error.clone().unwrap();
    assert_eq!(
        (out[0].1.r#type, e.request_id, e.error),
        (ty::ERROR, 208, server_error::CONSUMER_BUSY)
    );
    let out = feed(&mut b, 1, subscribe_cmd(9, "x", sub_type::SHARED, "b", 0));
    assert_eq!(
        out[0].1.error.as_ref().unwrap().error,
        server_error::CONSUMER_BUSY
    );
    // A re-subscribe of the live consumer id is a success (idempotent).
    let out = feed(
        &mut b,
        1,
        subscribe_cmd(7, "x", sub_type::EXCLUSIVE, "a", 0),
    );
    assert_eq!(out, vec![(1, success(207), 0)]);
}

/// Key_Shared: every key goes to the consumer the consistent-hashing ring
/// picks, and a key is never outstanding on two consumers at once, also
/// while consumers join.
#[test]
fn key_shared_holds_one_key_on_one_consumer_at_a_time() {
    let (_d, mut b) = with_producer();
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
    let mut key_of: BTreeMap<Position, &str> = BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        key_of.insert(send(&mut b, 1, 1, i as u64, &entry(Some(k), None, None)), k);
    }
    subscribe(&mut b, 1, 1, "ks", sub_type::KEY_SHARED, "c1");
    // consumer id -> positions delivered and not acknowledged
    let mut outstanding: BTreeMap<u64, BTreeSet<Position>> = BTreeMap::new();
    let record = |out: Vec<(u64, BrokerCommand, usize)>,
                  outstanding: &mut BTreeMap<u64, BTreeSet<Position>>| {
        for (_, f, _) in out {
            if let Some(m) = f.message {
                let p = Position::new(m.message_id.ledger_id as i64, m.message_id.entry_id as i64);
                outstanding.entry(m.consumer_id).or_default().insert(p);
            }
        }
    };
    record(flow(&mut b, 1, 1, 100), &mut outstanding);
    assert_eq!(
        outstanding[&1].len(),
        keys.len(),
        "the only consumer gets every key"
    );
    // Two more consumers join; the same keys are sent again.
    connect(&mut b, 2);
    subscribe(&mut b, 2, 2, "ks", sub_type::KEY_SHARED, "c2");
    subscribe(&mut b, 2, 3, "ks", sub_type::KEY_SHARED, "c3");
    record(flow(&mut b, 2, 2, 100), &mut outstanding);
    record(flow(&mut b, 2, 3, 100), &mut outstanding);
    for (i, k) in keys.iter().enumerate() {
        let (p, out) = send_with(&mut b, 1, 1, 100 + i as u64, &entry(Some(k), None, None));
        key_of.insert(p, k);
        record(out, &mut outstanding);
    }
    let holders = |outstanding: &BTreeMap<u64, BTreeSet<Position>>| {
        let mut h: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
        for (c, ps) in outstanding {
            for p in ps {
                h.entry(key_of[p]).or_default().insert(*c);
            }
        }
        h
    };
    // While c1 holds every key unacknowledged, nothing of them reached
    // c2 or c3.
    assert_eq!(outstanding.keys().copied().collect::<Vec<_>>(), vec![1]);
    // The second entries of c1's keys went to c1 (its ring keys); the
    // others wait. c1 acknowledges everything: each waiting key goes to
    // its ring owner.
    let mine: Vec<MessageIdData> = outstanding[&1].iter().map(|p| mid(*p, vec![])).collect();
    let acked = outstanding.remove(&1).unwrap();
    let out = ack(&mut b, 1, 1, false, mine, None);
    record(out, &mut outstanding);
    let h = holders(&outstanding);
    assert!(h.values().all(|cs| cs.len() == 1), "{h:?}");
    // Every entry went out exactly once, each second entry to the ring's
    // choice for its key's slot.
    let delivered: BTreeSet<Position> = outstanding.values().flatten().copied().collect();
    assert_eq!(acked.len() + delivered.len(), 2 * keys.len());
    assert!(acked.is_disjoint(&delivered));
    let s = sub(&b, "ks");
    for (c, ps) in &outstanding {
        for p in ps {
            let slot = key_shared::sticky_key_hash(key_of[p].as_bytes());
            assert_eq!(
                s.selector.select(slot).unwrap().consumer_id,
                *c,
                "key {}",
                key_of[p]
            );
        }
    }
    assert!(!outstanding.is_empty(), "some key moved off c1");
}

/// A restart: the core is dropped, the store reopened, and a new consumer
/// gets exactly what was not acknowledged (a partial batch with its
/// remaining indexes).
#[test]
fn a_restart_recovers_acks_and_partial_batches() {
    let dir = tempfile::tempdir().unwrap();
    let ps: Vec<Position>;
    {
        let mut b = core(&dir);
        connect(&mut b, 1);
        producer(&mut b, 1, 1);
        ps = (0..3)
            .map(|i| send(&mut b, 1, 1, i, &entry(None, Some(2), None)))
            .collect();
        subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
        assert_eq!(flow(&mut b, 1, 7, 100).len(), 3);
        ack(&mut b, 1, 7, false, vec![mid(ps[0], vec![])], None);
        ack(&mut b, 1, 7, false, vec![mid(ps[1], vec![0b10])], None);
    }
    let mut b = core(&dir);
    connect(&mut b, 1);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    let out = flow(&mut b, 1, 7, 100);
    assert_eq!(
        out.into_iter().map(|(c, f, _)| (c, f)).collect::<Vec<_>>(),
        vec![
            (1, message(7, ps[1], 0, vec![0b10], 1)),
            (1, message(7, ps[2], 0, vec![], 2)),
        ]
    );
}

/// A connection at its outbound high watermark gets no MESSAGE until the
/// driver reports the bytes written.
#[test]
fn dispatch_waits_for_writes_below_the_high_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = BrokerConfig::new("pulsar://node:6650");
    config.outbound_high_watermark = 1;
    let mut b = Broker::new(open_store(&dir), config, T0);
    b.handle_open(1, T0);
    b.handle_frame(
        1,
        &enc(&BrokerCommand {
            r#type: ty::CONNECT,
            connect: Some(command::CommandConnect {
                client_version: "test".into(),
                protocol_version: Some(21),
            }),
            ..Default::default()
        }),
        &[],
        T0,
    )
    .unwrap();
    let written: usize = std::iter::from_fn(|| b.poll_output())
        .map(|o| match o {
            Output::Frame { frame, .. } => frame.wire_len(),
            _ => 0,
        })
        .sum();
    b.handle_written(1, written, T0);
    producer(&mut b, 1, 1);
    b.handle_written(1, usize::MAX, T0);
    send(&mut b, 1, 1, 0, &entry(None, None, None));
    send(&mut b, 1, 1, 1, &entry(None, None, None));
    b.handle_written(1, usize::MAX, T0);
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    b.handle_written(1, usize::MAX, T0);
    let out = flow(&mut b, 1, 7, 10);
    assert_eq!(out.len(), 1, "one MESSAGE crosses the watermark, then none");
    assert!(frames(&mut b).is_empty());
    b.handle_written(1, usize::MAX, T0);
    let out = frames(&mut b);
    assert_eq!(out.len(), 1, "the write completion resumes dispatch");
    assert_eq!(out[0].1.r#type, ty::MESSAGE);
}

#[test]
fn protocol_errors_close_the_connection_and_requests_get_pulsars_codes() {
    let (_d, mut b) = with_producer();
    // A command lacking a required field: FLOW without messagePermits.
    let mut raw = Vec::new();
    prost::encoding::int32::encode(1, &ty::FLOW, &mut raw);
    let mut inner = Vec::new();
    prost::encoding::uint64::encode(1, &7u64, &mut inner);
    prost::encoding::bytes::encode(11, &inner, &mut raw);
    let e = b.handle_frame(1, &raw, &[], T0).unwrap_err();
    assert!(
        matches!(e, ConnectionError::Malformed(ref m) if m.contains("lacks required field 2")),
        "{e}"
    );
    assert!(matches!(
        b.poll_output(),
        Some(Output::Close { conn: 1, .. })
    ));
    assert!(!b.is_connected(1));
    // A command before CONNECT.
    b.handle_open(2, T0);
    let ping = BrokerCommand {
        r#type: ty::PING,
        ping: Some(command::Empty {}),
        ..Default::default()
    };
    assert!(matches!(
        b.handle_frame(2, &enc(&ping), &[], T0),
        Err(ConnectionError::Protocol(_))
    ));
    frames(&mut b);
    connect(&mut b, 3);
    producer(&mut b, 3, 1);
    // PING -> PONG.
    let out = feed(&mut b, 3, ping);
    assert_eq!(out[0].1.r#type, ty::PONG);
    // An unsupported command names its request id: CommandConsumerStats
    // (type 25) with request_id 77 (field 1), consumer_id 1 (field 4).
    let mut raw = Vec::new();
    prost::encoding::int32::encode(1, &25, &mut raw);
    let mut inner = Vec::new();
    prost::encoding::uint64::encode(1, &77u64, &mut inner);
    prost::encoding::uint64::encode(4, &1u64, &mut inner);
    prost::encoding::bytes::encode(25, &inner, &mut raw);
    b.handle_frame(3, &raw, &[], T0).unwrap();
    let out = frames(&mut b);
    let e = out[0].1.error.clone().unwrap();
    assert_eq!(
        (e.request_id, e.error),
        (77, server_error::UNSUPPORTED_VERSION_ERROR)
    );
    // A transactional SEND is refused with NotAllowedError.
    let c = BrokerCommand {
        r#type: ty::SEND,
        send: Some(command::CommandSend {
            producer_id: 1,
            sequence_id: 4,
            txnid_most_bits: Some(1),
            ..Default::default()
        }),
        ..Default::default()
    };
    b.handle_frame(3, &enc(&c), &entry(None, None, None), T0)
        .unwrap();
    let out = frames(&mut b);
    let e = out[0].1.send_error.clone().unwrap();
    // A refusal no retry cures: the code a non-Java client fails the one
    // message on (publish::final_send_error).
    assert_eq!((e.sequence_id, e.error), (4, server_error::CHECKSUM_ERROR));
    // An invalid topic name on lookup.
    let out = feed(
        &mut b,
        3,
        BrokerCommand {
            r#type: ty::LOOKUP,
            lookup_topic: Some(command::CommandLookupTopic {
                topic: "non-persistent://a/b/c".into(),
                request_id: 3,
            }),
            ..Default::default()
        },
    );
    // A non-persistent topic: NotAllowedError, which the official clients
    // do not retry (InvalidTopicName they retry until their timeout).
    let r = out[0].1.lookup_topic_response.clone().unwrap();
    assert_eq!(
        (r.response, r.error),
        (Some(2), Some(server_error::NOT_ALLOWED_ERROR))
    );
    let out = feed(
        &mut b,
        3,
        BrokerCommand {
            r#type: ty::LOOKUP,
            lookup_topic: Some(command::CommandLookupTopic {
                topic: "persistent://a//c".into(),
                request_id: 4,
            }),
            ..Default::default()
        },
    );
    let r = out[0].1.lookup_topic_response.clone().unwrap();
    assert_eq!(
        (r.response, r.error),
        (Some(2), Some(server_error::INVALID_TOPIC_NAME))
    );
}

/// A delayed entry on a Shared subscription is held until its time, and
/// the timer (driven by the injected time) delivers it.
#[test]
fn a_delayed_entry_is_delivered_when_the_injected_time_comes() {
    let (_d, mut b) = with_producer();
    let at = T0 as i64 + 60_000;
    subscribe(&mut b, 1, 7, "s", sub_type::SHARED, "c");
    assert!(flow(&mut b, 1, 7, 10).is_empty());
    let p = send(&mut b, 1, 1, 0, &entry(None, None, Some(at)));
    assert_eq!(b.poll_timeout(), Some(at as u64));
    b.handle_timeout(T0 + 1_000);
    assert!(frames(&mut b).is_empty(), "not before its time");
    b.handle_timeout(at as u64 + 1_000);
    let out = frames(&mut b);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1, message(7, p, 0, vec![], 1));
    // An entry already due when read (the tracker declines it) goes out
    // at once, never dropped.
    let now = at as u64 + 1_000;
    let c = BrokerCommand {
        r#type: ty::SEND,
        send: Some(command::CommandSend {
            producer_id: 1,
            sequence_id: 1,
            ..Default::default()
        }),
        ..Default::default()
    };
    b.handle_frame(1, &enc(&c), &entry(None, None, Some(at)), now)
        .unwrap();
    let out = frames(&mut b);
    assert_eq!(
        out.iter().map(|(_, f, _)| f.r#type).collect::<Vec<_>>(),
        vec![ty::SEND_RECEIPT, ty::MESSAGE]
    );
}

// ---- component-level tests of the pipeline's pieces ----

#[test]
fn topic_names_normalise_to_persistent() {
    assert_eq!(
        normalize_topic("t").unwrap(),
        "persistent://public/default/t"
    );
    assert_eq!(normalize_topic("a/b/c").unwrap(), "persistent://a/b/c");
    assert!(normalize_topic("non-persistent://a/b/c").is_err());
    assert!(normalize_topic("persistent://a//c").is_err());
    assert!(normalize_topic("").is_err());
    let long = "x".repeat(MAX_NAME_BYTES + 1);
    let err = normalize_topic(&long).unwrap_err().to_string();
    assert!(
        err.len() < 200,
        "the error names a prefix of the topic, not all of it: {err}"
    );
    assert!(normalize_topic(&"x".repeat(MAX_NAME_BYTES - 30)).is_ok());
}

#[test]
fn entry_metadata_gives_batch_size_and_rejects_corruption() {
    let meta = MessageMetadata {
        producer_name: "p".into(),
        sequence_id: 1,
        publish_time: 2,
        num_messages_in_batch: Some(3),
        ..Default::default()
    };
    let one = |b: &[u8]| {
        (
            SingleMessageMetadata {
                payload_size: b.len() as i32,
                ..Default::default()
            },
            b.to_vec(),
        )
    };
    let bytes = encode_entry_payload(&meta, &[one(b"a"), one(b"b"), one(b"c")]);
    let info = entry_info(&bytes).unwrap();
    assert_eq!(info.batch_size, 3);
    assert_eq!(info.deliver_at, None);
    // No key: Pulsar's NONE_KEY slot.
    assert_eq!(
        info.key_hash,
        key_shared::sticky_key_hash(key_shared::NONE_KEY)
    );
    assert_eq!(
        entry_info(&entry(Some("k1"), None, None)).unwrap().key_hash,
        key_shared::sticky_key_hash(b"k1")
    );
    let mut bad = bytes.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    assert!(
        entry_info(&bad).is_err(),
        "checksum mismatch must be an error"
    );
}

/// A batch entry of `n` messages as a producer writes it.
fn batch_entry(n: usize) -> Vec<u8> {
    entry(None, Some(n as u32), None)
}

fn open_sub(store: &RedbStore) -> (Arc<ManagedLedger>, Subscription) {
    let ml = ManagedLedger::open(TOPIC, LedgerConfig::default(), Arc::new(store.clone())).unwrap();
    let clock = Arc::new(VirtualClock::new(T0));
    let sub = Subscription::open(store, &ml, "s", 1, true, clock, T0).unwrap();
    (ml, sub)
}

/// An entry the delayed tracker declines (already due by the tracker's
/// clock) is dispatched now, whatever the dispatcher's own clock says;
/// one it accepts is held; Exclusive/Failover never delay.
#[test]
fn an_entry_the_tracker_declines_is_dispatched_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(&dir);
    let ml = ManagedLedger::open(TOPIC, LedgerConfig::default(), Arc::new(store.clone())).unwrap();
    // The tracker's clock an hour ahead of the dispatcher's: a deliver_at a
    // minute from the dispatcher's now is due for the tracker.
    let wall = T0 as i64;
    let clock = Arc::new(VirtualClock::new((wall + 3_600_000) as u64));
    let shared = Subscription::open(&store, &ml, "s", 1, true, clock.clone(), T0).unwrap();
    let p = |e| Position::new(1, e);
    assert!(!shared.held_by_tracker(p(0), Some(wall + 60_000)));
    assert!(!shared.held_by_tracker(p(1), None));
    assert!(shared.held_by_tracker(p(2), Some(wall + 7_200_000)));
    assert_eq!(shared.tracker.number_of_delayed_messages(), 1);
    let failover = Subscription::open(&store, &ml, "f", 2, true, clock, T0).unwrap();
    assert!(!failover.held_by_tracker(p(3), Some(wall + 7_200_000)));
    assert_eq!(failover.tracker.number_of_delayed_messages(), 0);
}

fn id(entry_id: u64, ack_set: Vec<i64>) -> MessageIdData {
    MessageIdData {
        ledger_id: 1,
        entry_id,
        partition: None,
        batch_index: None,
        ack_set,
        batch_size: None,
        first_chunk_message_id: None,
    }
}

#[test]
fn batch_index_acks_go_through_the_deletion_state_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open_store(&dir);
        let (ml, mut sub) = open_sub(&store);
        ml.append_batch(&[batch_entry(3).as_slice(), &batch_entry(3), &batch_entry(2)])
            .unwrap();
        sub.ack(&ml, false, &[id(1, vec![0b011])]).unwrap();
        // Entry 2: both indexes acked one by one: deleted whole.
        sub.ack(&ml, false, &[id(2, vec![0b10])]).unwrap();
        sub.ack(&ml, false, &[id(2, vec![0b01])]).unwrap();
        assert!(sub.deletion.is_message_deleted(Position::new(1, 2)));
        assert_eq!(sub.deletion.batch_ack_set(Position::new(1, 2)), None);
        // Last before the restart: a cumulative ack inside entry 0
        // (nothing before it) that changes only the batch state: index
        // 1 acked, 0 and 2 remain; bits at or above B (here bit 5) are
        // not indexes and are dropped.
        sub.ack(&ml, true, &[id(0, vec![0b10_0101])]).unwrap();
        assert_eq!(
            sub.deletion.batch_ack_set(Position::new(1, 0)),
            Some(vec![0b101])
        );
    }
    let store = open_store(&dir);
    let (ml, mut sub) = open_sub(&store);
    assert_eq!(
        sub.deletion.batch_ack_set(Position::new(1, 0)),
        Some(vec![0b101])
    );
    assert_eq!(
        sub.deletion.batch_ack_set(Position::new(1, 1)),
        Some(vec![0b011])
    );
    assert!(!sub.deletion.is_message_deleted(Position::new(1, 0)));
    assert!(!sub.deletion.is_message_deleted(Position::new(1, 1)));
    assert!(sub.deletion.is_message_deleted(Position::new(1, 2)));
    // A set that re-sets the acknowledged index 1 cannot un-acknowledge it.
    sub.ack(&ml, false, &[id(0, vec![0b111])]).unwrap();
    assert_eq!(
        sub.deletion.batch_ack_set(Position::new(1, 0)),
        Some(vec![0b101])
    );
}

#[test]
fn a_batch_count_the_payload_cannot_hold_is_rejected() {
    let meta = |n| MessageMetadata {
        producer_name: "p".into(),
        sequence_id: 1,
        publish_time: 2,
        num_messages_in_batch: Some(n),
        ..Default::default()
    };
    let one = || {
        (
            SingleMessageMetadata {
                payload_size: 0,
                ..Default::default()
            },
            Vec::new(),
        )
    };
    // Three smallest messages: 3 x 6 bytes hold a count of 3 exactly.
    let ok = encode_entry_payload(&meta(3), &[one(), one(), one()]);
    assert_eq!(entry_info(&ok).unwrap().batch_size, 3);
    // The same bytes claiming 4 or i32::MAX messages are corrupt.
    for n in [4, i32::MAX] {
        let bad = encode_entry_payload(&meta(n), &[one(), one(), one()]);
        let err = entry_info(&bad).expect_err("count above the payload");
        assert!(err.contains("num_messages_in_batch"), "{err}");
    }
}

mod batch_cumulative;
#[cfg(feature = "sim")]
mod group_commit;
mod lifecycle;
mod producers;
mod seek;
#[cfg(feature = "sim")]
mod send_commit;
mod txn;

mod admission;
mod clear_backlog;
mod counters;
mod failover;
mod read_completion;
