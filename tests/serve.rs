//! `pulsar-core serve` over TCP, driven with the library's own frame codec
//! (no Python): the built binary on a temporary data dir, one scenario per
//! broker-core behaviour a client sees: a same-connection resubscribe is a
//! new incarnation, a due delayed entry is delivered, Key_Shared holds a
//! key on one consumer at a time, Failover's active-consumer change keeps
//! publish order, an entry refused by admission keeps its place, a
//! failed MESSAGE write closes the consumer (CLOSE_CONSUMER), a seek
//! (backward across a kill -9, forward, by publish time) resets the
//! subscription, unsubscribe deletes it, a reader starts where it asks
//! and keeps nothing, and producer access modes and names hold
//! (`serve/producers.rs`). Every read
//! has a timeout; the server is killed when a test ends.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use prost::Message;
use pulsar_core::broker::{FrameCutter, OutFrame};
use pulsar_core::proto::command::{self as proto, ty, BrokerCommand};
use pulsar_core::proto::frame::crc32c;
use pulsar_core::proto::metadata::MessageMetadata;
use pulsar_core::proto::wire::{CommandAck, CommandFlow, CommandSubscribe, MessageIdData};

const WAIT: Duration = Duration::from_secs(10);

#[path = "serve/producers.rs"]
mod producers;

/// A running `serve` on a temporary data dir; killed on drop.
struct Server {
    child: Child,
    addr: String,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server(extra: &[&str]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let mut s = server_at(dir.path(), extra);
    s._dir = Some(dir);
    s
}

/// A `serve` on `data_dir` (kept by the caller, so a restart after a
/// kill -9 reopens the same store).
fn server_at(data_dir: &std::path::Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pulsar-core"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pulsar-core serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("listening on ").nth(1) {
                let _ = tx.send(rest.split(',').next().unwrap_or("").to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(WAIT)
        .expect("serve did not report its address");
    Server {
        child,
        addr,
        _dir: None,
    }
}

/// One client connection speaking frames.
struct Client {
    stream: TcpStream,
    cutter: FrameCutter,
    next_request: u64,
}

impl Client {
    fn connect(s: &Server) -> Self {
        let stream = TcpStream::connect(&s.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut c = Self {
            stream,
            cutter: FrameCutter::default(),
            next_request: 1,
        };
        c.send(BrokerCommand {
            r#type: ty::CONNECT,
            connect: Some(proto::CommandConnect {
                client_version: "tests/serve.rs".into(),
                protocol_version: Some(19),
            }),
            ..Default::default()
        });
        c.expect(|f| f.r#type == ty::CONNECTED, "CONNECTED");
        c
    }

    fn send_with(&mut self, cmd: BrokerCommand, payload: Vec<u8>) {
        let bytes = OutFrame {
            command: cmd.encode_to_vec(),
            payload,
        }
        .encode();
        self.stream.write_all(&bytes).unwrap();
    }

    fn send(&mut self, cmd: BrokerCommand) {
        self.send_with(cmd, Vec::new());
    }

    fn request(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    /// The next frame within `within`, if any.
    fn next(&mut self, within: Duration) -> Option<BrokerCommand> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(f) = self.cutter.next_frame().unwrap() {
                let cmd = BrokerCommand::decode(f.command()).unwrap();
                if cmd.r#type == ty::PING {
                    self.send(BrokerCommand {
                        r#type: ty::PONG,
                        pong: Some(proto::Empty {}),
                        ..Default::default()
                    });
                    continue;
                }
                return Some(cmd);
            }
            if Instant::now() >= deadline {
                return None;
            }
            let mut buf = [0u8; 65536];
            match self.stream.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => self.cutter.push(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// Skips frames until one matches (panics after [`WAIT`]).
    fn expect(&mut self, f: impl Fn(&BrokerCommand) -> bool, what: &str) -> BrokerCommand {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Some(c) = self.next(Duration::from_millis(200)) {
                if f(&c) {
                    return c;
                }
            }
        }
        panic!("no {what} within {WAIT:?}");
    }

    fn producer(&mut self, topic: &str) {
        let request_id = self.request();
        self.send(BrokerCommand {
            r#type: ty::PRODUCER,
            producer: Some(proto::CommandProducer {
                topic: topic.into(),
                producer_id: 1,
                request_id,
                producer_name: Some(format!("p-{topic}")),
                ..Default::default()
            }),
            ..Default::default()
        });
        self.expect(|f| f.r#type == ty::PRODUCER_SUCCESS, "PRODUCER_SUCCESS");
    }

    /// Publishes one entry; returns its (ledger_id, entry_id).
    fn publish(&mut self, seq: u64, key: Option<&str>, deliver_at: Option<i64>) -> (u64, u64) {
        self.send_with(
            BrokerCommand {
                r#type: ty::SEND,
                send: Some(proto::CommandSend {
                    producer_id: 1,
                    sequence_id: seq,
                    ..Default::default()
                }),
                ..Default::default()
            },
            entry(seq, key, deliver_at),
        );
        let r = self.expect(|f| f.r#type == ty::SEND_RECEIPT, "SEND_RECEIPT");
        let id = r.send_receipt.unwrap().message_id.unwrap();
        (id.ledger_id, id.entry_id)
    }

    fn subscribe(&mut self, topic: &str, cid: u64, sub: &str, sub_type: i32, name: &str) {
        let request_id = self.request();
        self.send(BrokerCommand {
            r#type: ty::SUBSCRIBE,
            subscribe: Some(CommandSubscribe {
                topic: topic.into(),
                subscription: sub.into(),
                sub_type,
                consumer_id: cid,
                request_id,
                consumer_name: Some(name.into()),
                priority_level: None,
                durable: None,
                initial_position: Some(1),
                key_shared_meta: None,
                consumer_epoch: None,
            }),
            ..Default::default()
        });
        self.expect(
            |f| f.r#type == ty::SUCCESS && f.success.as_ref().unwrap().request_id == request_id,
            "subscribe SUCCESS",
        );
    }

    fn flow(&mut self, cid: u64, n: u32) {
        self.send(BrokerCommand {
            r#type: ty::FLOW,
            flow: Some(CommandFlow {
                consumer_id: cid,
                message_permits: n,
            }),
            ..Default::default()
        });
    }

    /// Sends `ack` with a request id and waits for its ACK_RESPONSE, which
    /// must report success.
    fn ack_with_receipt(&mut self, mut ack: CommandAck) {
        let request_id = self.request();
        ack.request_id = Some(request_id);
        self.send(BrokerCommand {
            r#type: ty::ACK,
            ack: Some(ack),
            ..Default::default()
        });
        let r = self.expect(
            |f| {
                f.r#type == ty::ACK_RESPONSE
                    && f.ack_response.as_ref().and_then(|a| a.request_id) == Some(request_id)
            },
            "ACK_RESPONSE",
        );
        assert_eq!(r.ack_response.unwrap().error, None, "ack refused");
    }

    fn ack(&mut self, cid: u64, id: (u64, u64)) {
        self.send(BrokerCommand {
            r#type: ty::ACK,
            ack: Some(ack_of(
                cid,
                0,
                MessageIdData {
                    ledger_id: id.0,
                    entry_id: id.1,
                    ..Default::default()
                },
            )),
            ..Default::default()
        });
    }

    /// MESSAGE ids (ledger_id, entry_id) for `cid` received within `within`
    /// (other frames are skipped).
    fn messages(&mut self, cid: u64, within: Duration) -> Vec<(u64, u64)> {
        let deadline = Instant::now() + within;
        let mut v = Vec::new();
        while Instant::now() < deadline {
            if let Some(c) = self.next(Duration::from_millis(100)) {
                if let Some(m) = c.message.filter(|m| m.consumer_id == cid) {
                    v.push((m.message_id.ledger_id, m.message_id.entry_id));
                }
            }
        }
        v
    }
}

/// A `CommandAck` of `consumer_id` (`ack_type` 0: individual, 1:
/// cumulative) for one message id, without a request id.
fn ack_of(consumer_id: u64, ack_type: i32, id: MessageIdData) -> CommandAck {
    CommandAck {
        consumer_id,
        ack_type,
        message_id: vec![id],
        validation_error: None,
        txnid_least_bits: None,
        txnid_most_bits: None,
        request_id: None,
    }
}

/// An entry payload as a producer writes it (one message, not a batch).
fn entry(seq: u64, key: Option<&str>, deliver_at: Option<i64>) -> Vec<u8> {
    let mut md = MessageMetadata {
        producer_name: "p".into(),
        sequence_id: seq,
        publish_time: 1,
        ..MessageMetadata::default()
    }
    .encode_to_vec();
    if let Some(k) = key {
        prost::encoding::string::encode(6, &k.to_string(), &mut md);
    }
    if let Some(t) = deliver_at {
        prost::encoding::int64::encode(19, &t, &mut md);
    }
    let mut body = Vec::new();
    body.extend_from_slice(&(md.len() as u32).to_be_bytes());
    body.extend_from_slice(&md);
    body.extend_from_slice(format!("m{seq}").as_bytes());
    let mut out = vec![0x0e, 0x01];
    out.extend_from_slice(&crc32c(&body).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

const SHARED: i32 = 1;
const FAILOVER: i32 = 2;
const KEY_SHARED: i32 = 3;
const SETTLE: Duration = Duration::from_millis(700);

/// A consumer closed and subscribed again with the same id on the same
/// connection is a new PIP-491 incarnation: what the previous one was sent
/// and did not acknowledge is delivered to it again.
#[test]
fn a_same_connection_resubscribe_gets_the_unacknowledged_entries_again() {
    let s = server(&[]);
    let mut p = Client::connect(&s);
    p.producer("inc");
    let e0 = p.publish(0, None, None);
    let mut c = Client::connect(&s);
    c.subscribe("inc", 1, "s", SHARED, "c");
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), vec![e0]);
    let request_id = c.request();
    c.send(BrokerCommand {
        r#type: ty::CLOSE_CONSUMER,
        close_consumer: Some(proto::CommandIdRequest { id: 1, request_id }),
        ..Default::default()
    });
    c.expect(|f| f.r#type == ty::SUCCESS, "close SUCCESS");
    c.subscribe("inc", 1, "s", SHARED, "c");
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), vec![e0]);
}

/// A delayed entry already due when dispatch meets it (the tracker
/// declines it) is delivered at once, not dropped.
#[test]
fn a_due_delayed_entry_is_delivered() {
    let s = server(&[]);
    let mut p = Client::connect(&s);
    p.producer("due");
    let mut c = Client::connect(&s);
    c.subscribe("due", 1, "s", SHARED, "c");
    c.flow(1, 10);
    let past = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 10_000;
    let e0 = p.publish(0, None, Some(past));
    assert_eq!(c.messages(1, SETTLE), vec![e0]);
}

/// Key_Shared: a key whose entries one consumer holds unacknowledged is
/// not sent to a consumer that joined since (Pulsar 4 drains the hash).
#[test]
fn key_shared_never_has_one_key_on_two_consumers() {
    let s = server(&[]);
    let mut p = Client::connect(&s);
    p.producer("ks");
    let mut a = Client::connect(&s);
    a.subscribe("ks", 1, "s", KEY_SHARED, "a");
    a.flow(1, 1000);
    let keys: Vec<String> = (0..32).map(|k| format!("key-{k}")).collect();
    let mut key_of = std::collections::BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        key_of.insert(p.publish(i as u64, Some(k), None), k.clone());
    }
    let held: Vec<(u64, u64)> = a.messages(1, SETTLE);
    assert_eq!(held.len(), keys.len(), "a gets every key first");
    let mut b = Client::connect(&s);
    b.subscribe("ks", 2, "s", KEY_SHARED, "b");
    b.flow(2, 1000);
    for (i, k) in keys.iter().enumerate() {
        key_of.insert(p.publish(100 + i as u64, Some(k), None), k.clone());
    }
    let to_b = b.messages(2, SETTLE);
    if let Some(id) = to_b.first() {
        panic!(
            "{id:?} (key {}) went to b while a holds unacknowledged entries of every key",
            key_of[id]
        );
    }
    // Once a acknowledges, b gets its share of the keys.
    for id in held.iter().chain(a.messages(1, SETTLE).iter()) {
        a.ack(1, *id);
    }
    for (i, k) in keys.iter().enumerate() {
        p.publish(200 + i as u64, Some(k), None);
    }
    assert!(!b.messages(2, SETTLE).is_empty(), "b never got a key");
}

/// Failover: when a consumer that sorts first joins, it becomes active and
/// gets the former active consumer's unacknowledged entries first, in
/// publish order (the dispatcher rewinds to the mark-delete).
#[test]
fn failover_switch_keeps_publish_order() {
    let s = server(&[]);
    let mut p = Client::connect(&s);
    p.producer("fo");
    let ids: Vec<(u64, u64)> = (0..3).map(|i| p.publish(i, None, None)).collect();
    let mut b = Client::connect(&s);
    b.subscribe("fo", 1, "s", FAILOVER, "b");
    b.flow(1, 10);
    assert_eq!(b.messages(1, SETTLE), ids);
    let mut a = Client::connect(&s);
    a.subscribe("fo", 2, "s", FAILOVER, "a");
    let change = b.expect(
        |f| f.r#type == ty::ACTIVE_CONSUMER_CHANGE,
        "ACTIVE_CONSUMER_CHANGE",
    );
    assert_eq!(
        change.active_consumer_change.unwrap().is_active,
        Some(false)
    );
    let e3 = p.publish(3, None, None);
    a.flow(2, 10);
    let mut expected = ids.clone();
    expected.push(e3);
    assert_eq!(a.messages(2, SETTLE), expected);
}

/// Admission refusing every third of twelve entries of `key` on a
/// subscription of `sub_type`: every entry arrives, in publish order.
fn admission_refusals_keep_order(sub_type: i32, key: Option<&str>) {
    let s = server(&["--reject-admission-every", "3"]);
    let mut p = Client::connect(&s);
    p.producer("adm");
    let ids: Vec<(u64, u64)> = (0..12).map(|i| p.publish(i, key, None)).collect();
    let mut c = Client::connect(&s);
    c.subscribe("adm", 1, "s", sub_type, "c");
    c.flow(1, 100);
    assert_eq!(c.messages(1, SETTLE), ids);
}

/// Admission refusing every third entry: a refused entry keeps its place
/// (Failover's publish order), nothing is lost.
#[test]
fn entries_refused_by_admission_keep_publish_order() {
    admission_refusals_keep_order(FAILOVER, None);
}

/// Admission refusing every third entry on Key_Shared, every entry of one
/// key: a refused entry waits in replay and holds back the later entries of
/// its key (Pulsar's Key_Shared dispatcher), so the key's order is kept.
#[test]
fn entries_refused_by_admission_keep_key_order_on_key_shared() {
    admission_refusals_keep_order(KEY_SHARED, Some("k"));
}

/// A failed MESSAGE write removes the consumer incarnation it was for
/// (PIP-491: never re-credited): the client is told CLOSE_CONSUMER, and
/// after subscribing again it gets every entry, in order.
#[test]
fn a_failed_message_write_closes_the_consumer() {
    let s = server(&["--fail-message-writes-every", "4"]);
    let mut p = Client::connect(&s);
    p.producer("wf");
    let ids: Vec<(u64, u64)> = (0..6).map(|i| p.publish(i, None, None)).collect();
    let mut c = Client::connect(&s);
    c.subscribe("wf", 1, "s", FAILOVER, "c");
    c.flow(1, 100);
    // Each incarnation receives in publish order (a failed MESSAGE leaves a
    // gap, filled by the next incarnation); every entry is acknowledged in
    // the end.
    let mut acked = std::collections::BTreeSet::new();
    let mut closes = 0;
    let mut cid = 1;
    let mut seen: Vec<(u64, u64)> = Vec::new();
    let deadline = Instant::now() + WAIT;
    while acked.len() < ids.len() && Instant::now() < deadline {
        match c.next(Duration::from_millis(100)) {
            Some(f) if f.r#type == ty::CLOSE_CONSUMER => {
                assert_eq!(f.close_consumer.unwrap().id, cid);
                closes += 1;
                cid += 1;
                seen.clear();
                c.subscribe("wf", cid, "s", FAILOVER, "c");
                c.flow(cid, 100);
            }
            Some(f) => {
                if let Some(m) = f.message.filter(|m| m.consumer_id == cid) {
                    let id = (m.message_id.ledger_id, m.message_id.entry_id);
                    assert!(seen.last().is_none_or(|l| *l < id), "{id:?} after {seen:?}");
                    seen.push(id);
                    c.ack(cid, id);
                    acked.insert(id);
                }
            }
            None => {}
        }
    }
    assert!(closes > 0, "no CLOSE_CONSUMER after a failed write");
    assert_eq!(acked.into_iter().collect::<Vec<_>>(), ids);
}

/// An ACK_RESPONSE means the ack is durable: after a kill -9 and a restart
/// on the same store, an individually acknowledged entry is not delivered
/// again (the group commit never releases a receipt before its write).
#[test]
fn an_acknowledged_entry_stays_acknowledged_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_at(dir.path(), &[]);
    let mut p = Client::connect(&s);
    p.producer("durable-ack");
    let sent: Vec<(u64, u64)> = (0..3).map(|i| p.publish(i, None, None)).collect();
    let mut c = Client::connect(&s);
    c.subscribe("durable-ack", 1, "s", SHARED, "c");
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), sent);
    c.ack_with_receipt(ack_of(
        1,
        0,
        MessageIdData {
            ledger_id: sent[1].0,
            entry_id: sent[1].1,
            ..Default::default()
        },
    ));
    drop((c, p, s)); // SIGKILL: no clean close
    let s = server_at(dir.path(), &[]);
    let mut c = Client::connect(&s);
    c.subscribe("durable-ack", 1, "s", SHARED, "c");
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), vec![sent[0], sent[2]]);
}

/// A cumulative ack inside a batch (batch_index with the ack_set of the
/// indexes left) moves mark-delete to the entry before the batch: after a
/// kill -9 the batch is delivered again for its unacknowledged indexes.
#[test]
fn a_cumulative_ack_inside_a_batch_keeps_the_rest_across_a_kill() {
    use pulsar_core::proto::frame::encode_entry_payload;
    use pulsar_core::proto::metadata::SingleMessageMetadata;
    let dir = tempfile::tempdir().unwrap();
    let s = server_at(dir.path(), &[]);
    let mut p = Client::connect(&s);
    p.producer("batch-cumulative");
    let bodies: Vec<(SingleMessageMetadata, Vec<u8>)> = (0..4u8)
        .map(|i| {
            (
                SingleMessageMetadata {
                    payload_size: 1,
                    ..Default::default()
                },
                vec![b'a' + i],
            )
        })
        .collect();
    let md = MessageMetadata {
        producer_name: "p".into(),
        sequence_id: 0,
        publish_time: 1,
        num_messages_in_batch: Some(4),
        ..MessageMetadata::default()
    };
    p.send_with(
        BrokerCommand {
            r#type: ty::SEND,
            send: Some(proto::CommandSend {
                producer_id: 1,
                sequence_id: 0,
                num_messages: Some(4),
                ..Default::default()
            }),
            ..Default::default()
        },
        encode_entry_payload(&md, &bodies),
    );
    let r = p.expect(|f| f.r#type == ty::SEND_RECEIPT, "SEND_RECEIPT");
    let id = r.send_receipt.unwrap().message_id.unwrap();
    let batch = (id.ledger_id, id.entry_id);
    let mut c = Client::connect(&s);
    c.subscribe("batch-cumulative", 1, "s", FAILOVER, "c");
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), vec![batch]);
    // Indexes 0 and 1 taken: cumulative at index 1, indexes 2 and 3 left.
    c.ack_with_receipt(ack_of(
        1,
        1,
        MessageIdData {
            ledger_id: batch.0,
            entry_id: batch.1,
            batch_index: Some(1),
            batch_size: Some(4),
            ack_set: pulsar_core::proto::wire::ack_set_from_indexes(2..4),
            ..Default::default()
        },
    ));
    drop((c, p, s)); // SIGKILL: no clean close
    let s = server_at(dir.path(), &[]);
    let mut c = Client::connect(&s);
    c.subscribe("batch-cumulative", 1, "s", FAILOVER, "c");
    c.flow(1, 10);
    assert_eq!(
        c.messages(1, SETTLE),
        vec![batch],
        "the batch's indexes 2 and 3 are delivered again"
    );
}

/// A SEND_RECEIPT means the entry is durable: many SENDs in flight (one
/// write, so the server hands them to the core in few turns and they share
/// group commits) are answered only after their commit, so after a kill -9
/// right after the last receipt and a restart on the same store every
/// receipted entry is delivered, in publish order.
#[test]
fn receipted_sends_in_flight_survive_a_kill() {
    const N: u64 = 64;
    let dir = tempfile::tempdir().unwrap();
    let s = server_at(dir.path(), &[]);
    let mut p = Client::connect(&s);
    p.producer("durable-sends");
    let mut bytes = Vec::new();
    for seq in 0..N {
        bytes.extend(
            OutFrame {
                command: BrokerCommand {
                    r#type: ty::SEND,
                    send: Some(proto::CommandSend {
                        producer_id: 1,
                        sequence_id: seq,
                        ..Default::default()
                    }),
                    ..Default::default()
                }
                .encode_to_vec(),
                payload: entry(seq, None, None),
            }
            .encode(),
        );
    }
    p.stream.write_all(&bytes).unwrap();
    let receipted: Vec<(u64, u64)> = (0..N)
        .map(|seq| {
            let r = p.expect(|f| f.r#type == ty::SEND_RECEIPT, "SEND_RECEIPT");
            let r = r.send_receipt.unwrap();
            assert_eq!(r.sequence_id, seq, "receipts in send order");
            let id = r.message_id.unwrap();
            (id.ledger_id, id.entry_id)
        })
        .collect();
    drop((p, s)); // SIGKILL right after the last receipt: no clean close
    let s = server_at(dir.path(), &[]);
    let mut c = Client::connect(&s);
    c.subscribe("durable-sends", 1, "s", SHARED, "c");
    c.flow(1, 1000);
    assert_eq!(c.messages(1, SETTLE), receipted);
}

/// An entry published at `publish_time` (one message).
fn entry_at(seq: u64, publish_time: u64) -> Vec<u8> {
    let md = MessageMetadata {
        producer_name: "p".into(),
        sequence_id: seq,
        publish_time,
        ..MessageMetadata::default()
    }
    .encode_to_vec();
    let mut body = Vec::new();
    body.extend_from_slice(&(md.len() as u32).to_be_bytes());
    body.extend_from_slice(&md);
    body.extend_from_slice(format!("m{seq}").as_bytes());
    let mut out = vec![0x0e, 0x01];
    out.extend_from_slice(&crc32c(&body).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

impl Client {
    /// Publishes entry `seq` at `publish_time`; returns its id.
    fn publish_at(&mut self, seq: u64, publish_time: u64) -> (u64, u64) {
        self.send_with(
            BrokerCommand {
                r#type: ty::SEND,
                send: Some(proto::CommandSend {
                    producer_id: 1,
                    sequence_id: seq,
                    ..Default::default()
                }),
                ..Default::default()
            },
            entry_at(seq, publish_time),
        );
        let r = self.expect(|f| f.r#type == ty::SEND_RECEIPT, "SEND_RECEIPT");
        let id = r.send_receipt.unwrap().message_id.unwrap();
        (id.ledger_id, id.entry_id)
    }

    /// SEEK of consumer `cid` to a message id or a publish time: the
    /// consumer gets CLOSE_CONSUMER, the request SUCCESS (Pulsar's order).
    fn seek(&mut self, cid: u64, id: Option<(u64, u64)>, time: Option<u64>) {
        let request_id = self.request();
        self.send(BrokerCommand {
            r#type: ty::SEEK,
            seek: Some(proto::CommandSeek {
                consumer_id: cid,
                request_id,
                message_id: id.map(|(ledger_id, entry_id)| MessageIdData {
                    ledger_id,
                    entry_id,
                    ..Default::default()
                }),
                message_publish_time: time,
            }),
            ..Default::default()
        });
        self.expect(
            |f| f.r#type == ty::CLOSE_CONSUMER && f.close_consumer.as_ref().unwrap().id == cid,
            "CLOSE_CONSUMER",
        );
        let r = self.expect(
            |f| {
                (f.r#type == ty::SUCCESS && f.success.as_ref().unwrap().request_id == request_id)
                    || (f.r#type == ty::ERROR && f.error.as_ref().unwrap().request_id == request_id)
            },
            "seek answer",
        );
        assert_eq!(r.r#type, ty::SUCCESS, "seek refused: {r:?}");
    }

    /// UNSUBSCRIBE of `cid`; the answer (SUCCESS or ERROR).
    fn unsubscribe(&mut self, cid: u64) -> BrokerCommand {
        let request_id = self.request();
        self.send(BrokerCommand {
            r#type: ty::UNSUBSCRIBE,
            unsubscribe: Some(proto::CommandIdRequest {
                id: cid,
                request_id,
            }),
            ..Default::default()
        });
        self.expect(
            |f| {
                (f.r#type == ty::SUCCESS && f.success.as_ref().unwrap().request_id == request_id)
                    || (f.r#type == ty::ERROR && f.error.as_ref().unwrap().request_id == request_id)
            },
            "unsubscribe answer",
        )
    }

    /// A reader: a non-durable Exclusive subscribe with `start_message_id`
    /// (ledger id u64::MAX: earliest).
    fn reader(&mut self, topic: &str, cid: u64, sub: &str, start: (u64, u64)) {
        let request_id = self.request();
        let mut s = CommandSubscribe {
            topic: topic.into(),
            subscription: sub.into(),
            sub_type: 0,
            consumer_id: cid,
            request_id,
            consumer_name: Some("reader".into()),
            priority_level: None,
            durable: Some(false),
            initial_position: None,
            key_shared_meta: None,
            consumer_epoch: None,
        }
        .encode_to_vec();
        let id = MessageIdData {
            ledger_id: start.0,
            entry_id: start.1,
            ..Default::default()
        };
        prost::encoding::message::encode(9, &id, &mut s);
        let mut base = Vec::new();
        prost::encoding::int32::encode(1, &ty::SUBSCRIBE, &mut base);
        prost::encoding::bytes::encode(4, &s, &mut base);
        let bytes = OutFrame {
            command: base,
            payload: Vec::new(),
        }
        .encode();
        self.stream.write_all(&bytes).unwrap();
        self.expect(
            |f| f.r#type == ty::SUCCESS && f.success.as_ref().unwrap().request_id == request_id,
            "reader SUCCESS",
        );
    }
}

/// A backward seek by message id makes acknowledged entries deliverable
/// again (the individually deleted range past the seek position is
/// cleared), and the reset is durable: after a kill -9 the subscription
/// reads from the seek position.
#[test]
fn a_backward_seek_redelivers_and_survives_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_at(dir.path(), &[]);
    let mut p = Client::connect(&s);
    p.producer("seek-back");
    let sent: Vec<(u64, u64)> = (0..5).map(|i| p.publish(i, None, None)).collect();
    let mut c = Client::connect(&s);
    c.subscribe("seek-back", 1, "s", SHARED, "c");
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), sent);
    // Individual acks: 0 (the mark-delete) and 2, 3 (a range past the
    // seek position, which the reset must clear).
    for i in [0, 2, 3] {
        c.ack_with_receipt(ack_of(
            1,
            0,
            MessageIdData {
                ledger_id: sent[i].0,
                entry_id: sent[i].1,
                ..Default::default()
            },
        ));
    }
    c.seek(1, Some(sent[1]), None);
    c.subscribe("seek-back", 1, "s", SHARED, "c");
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), sent[1..].to_vec());
    drop((c, p, s)); // SIGKILL: no clean close
    let s = server_at(dir.path(), &[]);
    let mut c = Client::connect(&s);
    c.subscribe("seek-back", 1, "s", SHARED, "c");
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), sent[1..].to_vec());
}

/// A forward seek acknowledges what it skips; a seek by publish time starts
/// at the first entry published at or after the time.
#[test]
fn a_forward_seek_and_a_seek_by_publish_time() {
    let s = server(&[]);
    let mut p = Client::connect(&s);
    p.producer("seek-fwd");
    let sent: Vec<(u64, u64)> = (0..5).map(|i| p.publish_at(i, 1_000 + 10 * i)).collect();
    let mut c = Client::connect(&s);
    c.subscribe("seek-fwd", 1, "s", SHARED, "c");
    c.seek(1, Some(sent[3]), None);
    c.subscribe("seek-fwd", 1, "s", SHARED, "c");
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), sent[3..].to_vec());
    c.seek(1, None, Some(1_015));
    c.subscribe("seek-fwd", 1, "s", SHARED, "c");
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), sent[2..].to_vec());
}

/// Unsubscribe is refused while another consumer is attached
/// (MetadataError), then deletes the subscription: a new subscribe with
/// the default initial position (Latest) gets nothing of the old backlog.
#[test]
fn unsubscribe_deletes_the_subscription() {
    let s = server(&[]);
    let mut p = Client::connect(&s);
    p.producer("unsub");
    for i in 0..3 {
        p.publish(i, None, None);
    }
    let mut c = Client::connect(&s);
    c.subscribe("unsub", 1, "s", SHARED, "c");
    c.subscribe("unsub", 2, "s", SHARED, "d");
    let r = c.unsubscribe(1);
    assert_eq!(r.error.unwrap().error, proto::server_error::METADATA_ERROR);
    c.send(BrokerCommand {
        r#type: ty::CLOSE_CONSUMER,
        close_consumer: Some(proto::CommandIdRequest {
            id: 2,
            request_id: 999,
        }),
        ..Default::default()
    });
    let r = c.unsubscribe(1);
    assert_eq!(r.r#type, ty::SUCCESS, "{r:?}");
    // Subscribe again with Latest: the subscription is new.
    let request_id = c.request();
    c.send(BrokerCommand {
        r#type: ty::SUBSCRIBE,
        subscribe: Some(CommandSubscribe {
            topic: "unsub".into(),
            subscription: "s".into(),
            sub_type: SHARED,
            consumer_id: 3,
            request_id,
            consumer_name: Some("e".into()),
            priority_level: None,
            durable: None,
            initial_position: None,
            key_shared_meta: None,
            consumer_epoch: None,
        }),
        ..Default::default()
    });
    c.expect(
        |f| f.r#type == ty::SUCCESS && f.success.as_ref().unwrap().request_id == request_id,
        "subscribe SUCCESS",
    );
    c.flow(3, 10);
    assert!(c.messages(3, SETTLE).is_empty());
}

/// A reader (non-durable subscription) from earliest and from a message
/// id; after a kill -9 nothing of it was kept (a new reader of that name
/// starts where it asks).
#[test]
fn a_reader_from_earliest_and_from_a_message_id() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_at(dir.path(), &[]);
    let mut p = Client::connect(&s);
    p.producer("reader");
    let sent: Vec<(u64, u64)> = (0..4).map(|i| p.publish(i, None, None)).collect();
    let mut c = Client::connect(&s);
    c.reader("reader", 1, "r1", (u64::MAX, u64::MAX));
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), sent);
    c.reader("reader", 2, "r2", sent[2]);
    c.flow(2, 10);
    assert_eq!(c.messages(2, SETTLE), sent[2..].to_vec());
    drop((c, p, s));
    let s = server_at(dir.path(), &[]);
    let mut c = Client::connect(&s);
    c.reader("reader", 1, "r2", sent[1]);
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), sent[1..].to_vec());
}

/// A transaction's END_TXN_RESPONSE (and the ACK_RESPONSE of its
/// transactional ack) means what it wrote is durable (Pulsar answers after
/// the pending-ack log and the coordinator's log completed): after a
/// kill -9 and a restart on the same store, the entry a committed
/// transaction acknowledged is not delivered again.
#[test]
fn a_committed_transactional_ack_stays_acknowledged_after_a_kill() {
    use pulsar_core::proto::txn as tp;
    const TOPIC: &str = "persistent://public/default/durable-txn-ack";
    let dir = tempfile::tempdir().unwrap();
    let s = server_at(dir.path(), &[]);
    let mut p = Client::connect(&s);
    p.producer(TOPIC);
    let sent: Vec<(u64, u64)> = (0..3).map(|i| p.publish(i, None, None)).collect();
    let mut c = Client::connect(&s);
    c.subscribe(TOPIC, 1, "s", SHARED, "c");
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), sent);
    let request_id = c.request();
    c.send(BrokerCommand {
        r#type: ty::TC_CLIENT_CONNECT_REQUEST,
        tc_client_connect_request: Some(tp::CommandTcClientConnectRequest {
            request_id,
            tc_id: 0,
        }),
        ..Default::default()
    });
    c.expect(
        |f| f.r#type == ty::TC_CLIENT_CONNECT_RESPONSE,
        "TC_CLIENT_CONNECT_RESPONSE",
    );
    let request_id = c.request();
    c.send(BrokerCommand {
        r#type: ty::NEW_TXN,
        new_txn: Some(tp::CommandNewTxn {
            request_id,
            txn_ttl_millis: Some(600_000),
            tc_id: Some(0),
        }),
        ..Default::default()
    });
    let r = c
        .expect(|f| f.r#type == ty::NEW_TXN_RESPONSE, "NEW_TXN_RESPONSE")
        .new_txn_response
        .unwrap();
    assert_eq!(r.error, None, "{r:?}");
    let (most, least) = (r.txnid_most_bits, r.txnid_least_bits);
    let request_id = c.request();
    c.send(BrokerCommand {
        r#type: ty::ADD_SUBSCRIPTION_TO_TXN,
        add_subscription_to_txn: Some(tp::CommandAddSubscriptionToTxn {
            request_id,
            txnid_least_bits: least,
            txnid_most_bits: most,
            subscription: vec![tp::TxnSubscription {
                topic: TOPIC.into(),
                subscription: "s".into(),
            }],
        }),
        ..Default::default()
    });
    let r = c.expect(
        |f| f.r#type == ty::ADD_SUBSCRIPTION_TO_TXN_RESPONSE,
        "ADD_SUBSCRIPTION_TO_TXN_RESPONSE",
    );
    assert_eq!(r.add_subscription_to_txn_response.unwrap().error, None);
    let mut a = ack_of(
        1,
        0,
        MessageIdData {
            ledger_id: sent[1].0,
            entry_id: sent[1].1,
            ..Default::default()
        },
    );
    a.txnid_most_bits = most;
    a.txnid_least_bits = least;
    c.ack_with_receipt(a);
    let request_id = c.request();
    c.send(BrokerCommand {
        r#type: ty::END_TXN,
        end_txn: Some(tp::CommandEndTxn {
            request_id,
            txnid_least_bits: least,
            txnid_most_bits: most,
            txn_action: Some(tp::txn_action::COMMIT),
        }),
        ..Default::default()
    });
    let r = c.expect(|f| f.r#type == ty::END_TXN_RESPONSE, "END_TXN_RESPONSE");
    assert_eq!(r.end_txn_response.unwrap().error, None);
    drop((c, p, s)); // SIGKILL: no clean close
    let s = server_at(dir.path(), &[]);
    let mut c = Client::connect(&s);
    c.subscribe(TOPIC, 1, "s", SHARED, "c");
    c.flow(1, 10);
    assert_eq!(
        c.messages(1, SETTLE),
        vec![sent[0], sent[2]],
        "the entry a committed transaction acknowledged is delivered again"
    );
}
