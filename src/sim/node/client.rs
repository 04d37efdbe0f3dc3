//! The simulated Pulsar clients: producers and consumers that encode real
//! commands, decode every frame the core sends, and report to the checker
//! only what a client sees (receipts, deliveries, ack receipts,
//! reconnects).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use prost::Message;
use rand::Rng;

use crate::proto::command::{self, ty, BrokerCommand};
// The PIP-491 client state takes the facade's `Arc` (loom's under `--cfg loom`).
use crate::broker::MAX_FRAME_SIZE;
use crate::permits::client::{
    ClientConnection, ClientConsumer, ClientFrame, CloseReason, CommandOutcomeKind, Incarnation,
    ReceivedMessage,
};
use crate::position::Position;
use crate::proto::metadata::SingleMessageMetadata;
use crate::proto::wire::{
    self, CommandAck, CommandFlow, CommandRedeliverUnacknowledgedMessages, CommandSubscribe,
    KeySharedMeta, MessageIdData,
};
use crate::sim::checker::MessageRef;
use crate::sim::options::Sabotage;
use crate::sim::workload::{SubscriptionType, Workload};
use crate::sync::Arc;

use super::faulty::Damage;
use super::wire::frame;
use super::{ClientRef, Ev, Node, EPOCH_BASE_MS, TOPIC};
use crate::broker::FrameCutter;
use crate::proto::frame::encode_entry_payload;
use crate::proto::metadata::MessageMetadata;

/// The consumer id every simulated consumer uses on its connection (one
/// consumer per connection).
pub(super) const CONSUMER_ID: u64 = 1;
/// The producer id on its connection.
pub(super) const PRODUCER_ID: u64 = 1;

/// One message of an entry waiting for its receipt: its key and delivery
/// time (virtual ms, 0 = immediate).
#[derive(Debug, Clone, Copy)]
struct PendingMessage {
    key: u32,
    deliver_at: u64,
}

/// An entry sent and not yet receipted.
#[derive(Debug, Clone)]
pub(super) struct PendingSend {
    payload: Vec<u8>,
    messages: Vec<PendingMessage>,
    /// A chunked message's chunk payloads (`chunks.rs`; empty: one entry).
    chunks: Vec<Vec<u8>>,
    /// Its chunks receipted so far (removed as Pulsar's pending ops are).
    chunks_receipted: usize,
}

/// A simulated producer (one connection, producer id 1).
#[derive(Debug, Default)]
pub(super) struct Producer {
    pub(super) conn: Option<u64>,
    cutter: FrameCutter,
    pub(super) ready: bool,
    publishing: bool,
    /// Logical messages not yet put into an entry.
    pub(super) to_create: u64,
    next_seq: u64,
    pub(super) pending: BTreeMap<u64, PendingSend>,
    /// Sequence ids whose connection was lost before their receipt came:
    /// a copy of them may be in the topic.
    uncertain: BTreeSet<u64>,
    /// Logical messages receipted.
    pub(super) receipted: u64,
    pub(super) next_req: u64,
}

impl Producer {
    /// Whether the send of sequence id `seq` lost its connection before
    /// its receipt (a copy of it may be in the topic).
    pub(super) fn is_uncertain(&self, seq: u64) -> bool {
        self.uncertain.contains(&seq)
    }

    /// Logical messages not yet published (no receipt).
    pub(super) fn unpublished(&self) -> u64 {
        self.to_create
            + self
                .pending
                .values()
                .map(|p| p.messages.len() as u64)
                .sum::<u64>()
    }
}

/// An ack sent and not yet receipted.
#[derive(Debug, Clone)]
pub(super) struct OutAck {
    /// The consumer's era when the ack was sent (see [`Consumer::era`]).
    pub(super) era: u64,
    pub(super) ids: Vec<MessageIdData>,
    pub(super) msgs: Vec<MessageRef>,
    pub(super) cumulative: Option<Position>,
    /// Inside transaction (number, id) (`txn.rs`).
    pub(super) txn: Option<(u64, crate::broker::txn::TxnId)>,
}

/// A simulated consumer (one connection, consumer id 1).
#[derive(Debug)]
pub(super) struct Consumer {
    pub(super) sub: usize,
    /// The checker's stable id of this consumer within its subscription.
    pub(super) id: usize,
    name: String,
    pub(super) conn: Option<u64>,
    cutter: FrameCutter,
    connection: Option<Arc<ClientConnection>>,
    client: Option<ClientConsumer>,
    subscribes: BTreeMap<u64, Incarnation>,
    acks: BTreeMap<u64, OutAck>,
    retry: Vec<OutAck>,
    /// Bumped whenever the checker starts a new incarnation of this
    /// consumer (reconnect, resubscribe, redelivery request, restart): an
    /// ack receipt of an earlier era counts as an ack only.
    pub(super) era: u64,
    next_req: u64,
    pub(super) poll_scheduled: bool,
    /// Messages the client library handed off (recorded as delivered when
    /// they arrived), waiting for the application; each holds its permit.
    pub(super) app: VecDeque<(ReceivedMessage, MessageRef)>,
    since_cumulative: u32,
    cumulative_candidate: Option<CumulativeUpTo>,
    /// The entry whose batch the application is inside and the next index
    /// it expects: indexes 0..next were all taken in this era.
    batch_seen: Option<(Position, i32)>,
    /// Connections closed on an injected invalid P in a row, with no
    /// message taken by the application in between
    /// (`faults.faulty_closes_without_progress`).
    pub(super) faulty_closes: u32,
    /// While set, Flows the client library decides stay queued on its
    /// connection (a re-creation right after a poll: `same_connection`).
    hold_flows: bool,
    /// Messages the application negatively acknowledged, per entry, with
    /// the era they were delivered in (`nack.rs`).
    pub(super) nacks: BTreeMap<Position, (u64, Vec<MessageRef>)>,
    /// The transaction (client number) holding this consumer's
    /// transactional cumulative ack, not ended yet, and the era it was
    /// sent in (`txn_cumulative.rs`): its later cumulative acks go into it
    /// or wait for its end.
    pub(super) cum_txn: Option<(u64, u64)>,
    /// Entries of corrupted MESSAGEs stamped with an epoch older than the
    /// client's (sent before the core saw this consumer's
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES, which gave them back already):
    /// the client's validation-error ack of each is not sent as a negative
    /// ack (`faulty.rs`), which would give the entry back a second time
    /// while the epoch's redelivered copy is on its way.
    pub(super) corrupt_given_back: BTreeSet<Position>,
}

/// What the next cumulative ack covers: an entry whole, or (a cumulative
/// ack inside a batch, with the `ack_set` of the indexes left) the entries
/// before it and indexes `0..=index` of it.
#[derive(Debug, Clone, Copy)]
struct CumulativeUpTo {
    position: Position,
    /// `(index, batch size)` for an ack inside the batch at `position`.
    within: Option<(i32, i32)>,
}

impl Consumer {
    /// The client library's consumer epoch (`None`: no client).
    pub(super) fn client_epoch(&self) -> Option<u64> {
        self.client.as_ref().map(|cl| cl.epoch())
    }

    /// Whether it is subscribed and may take messages.
    pub(super) fn ready(&self) -> bool {
        self.conn.is_some() && self.client.is_some()
    }

    /// Whether an ack of it may be in the cursor without a receipt the
    /// client saw: one to resend, or one of an earlier era in flight.
    pub(super) fn acks_unsettled(&self) -> bool {
        !self.retry.is_empty() || self.acks.values().any(|a| a.era != self.era)
    }

    /// Whether the application holds its consumer: subscribed on its
    /// current connection, the subscribe answered (Pulsar's subscribe
    /// hands the consumer over on SUCCESS, so only then can the
    /// application close and re-create it).
    pub(super) fn subscribed(&self) -> bool {
        self.subscribes.is_empty()
            && self
                .client
                .as_ref()
                .zip(self.conn)
                .is_some_and(|(cl, conn)| cl.connection().id() == conn)
    }
}

impl Node<'_> {
    /// The connection of consumer `c` and a new request id on it (`None`
    /// while it is not subscribed).
    pub(super) fn consumer_request(&mut self, c: usize) -> Option<(u64, u64)> {
        let co = &mut self.consumers[c];
        let conn = co.conn.filter(|_| co.client.is_some())?;
        co.next_req += 1;
        Some((conn, co.next_req))
    }
}

fn payload_text(p: usize, seq: u64, index: usize, m: PendingMessage) -> Vec<u8> {
    format!("{p} {seq} {index} {} {}", m.key, m.deliver_at).into_bytes()
}

/// (producer, sequence id, key, delivery time) of a message payload.
fn parse_payload(bytes: &[u8]) -> Option<(usize, u64, u32, u64)> {
    let s = std::str::from_utf8(bytes).ok()?;
    let mut it = s.split(' ');
    let p = it.next()?.parse().ok()?;
    let seq = it.next()?.parse().ok()?;
    let _index: u32 = it.next()?.parse().ok()?;
    let key = it.next()?.parse().ok()?;
    let at = it.next()?.parse().ok()?;
    Some((p, seq, key, at))
}

/// (producer, sequence id, index in the entry) of a message payload.
pub(super) fn payload_origin(bytes: &[u8]) -> Option<(usize, u64, u32)> {
    let s = std::str::from_utf8(bytes).ok()?;
    let mut it = s.split(' ');
    Some((
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    ))
}

fn position_of(id: &MessageIdData) -> Position {
    Position::new(id.ledger_id as i64, id.entry_id as i64)
}

impl Node<'_> {
    /// Creates the clients and schedules their first connect.
    pub(super) fn setup_clients(&mut self) {
        let w = self.w;
        let per = w.messages / u64::from(w.producers);
        let extra = w.messages % u64::from(w.producers);
        for i in 0..w.producers as u64 {
            self.producers.push(Producer {
                to_create: per + u64::from(i < extra),
                ..Producer::default()
            });
            let at = self.rng.random_range(20..=50);
            self.sched
                .at(at, Ev::Connect(ClientRef::Producer(i as usize)));
        }
        for s in 0..w.subscriptions as usize {
            for i in 0..w.consumers_per_subscription as usize {
                self.consumers.push(Consumer {
                    sub: s,
                    id: i,
                    name: format!("c-{s}-{i}"),
                    conn: None,
                    cutter: FrameCutter::default(),
                    connection: None,
                    client: None,
                    subscribes: BTreeMap::new(),
                    acks: BTreeMap::new(),
                    retry: Vec::new(),
                    era: 0,
                    next_req: 0,
                    poll_scheduled: false,
                    app: VecDeque::new(),
                    since_cumulative: 0,
                    cumulative_candidate: None,
                    batch_seen: None,
                    faulty_closes: 0,
                    hold_flows: false,
                    nacks: BTreeMap::new(),
                    cum_txn: None,
                    corrupt_given_back: BTreeSet::new(),
                });
                let c = self.consumers.len() - 1;
                let at = self.rng.random_range(0..=10);
                self.sched.at(at, Ev::Connect(ClientRef::Consumer(c)));
            }
        }
    }

    /// A client opens a connection and sends CONNECT.
    pub(super) fn connect(&mut self, client: ClientRef) {
        let conn = self.open_conn(client);
        match client {
            ClientRef::Producer(p) => {
                let pr = &mut self.producers[p];
                pr.conn = Some(conn);
                pr.cutter = FrameCutter::default();
                pr.ready = false;
            }
            ClientRef::Consumer(c) => {
                let co = &mut self.consumers[c];
                co.conn = Some(conn);
                co.cutter = FrameCutter::default();
                co.connection = Some(Arc::new(ClientConnection::new(conn)));
                co.subscribes.clear();
            }
            ClientRef::Txn(r) => self.txn_connecting(r, conn),
            ClientRef::Reader(r) => self.readers_connecting(r, conn),
        }
        let cmd = BrokerCommand {
            r#type: ty::CONNECT,
            connect: Some(command::CommandConnect {
                client_version: "pulsar-core sim-node".into(),
                protocol_version: Some(crate::broker::PROTOCOL_VERSION),
            }),
            ..Default::default()
        };
        self.send_to_broker(conn, frame(&cmd, Vec::new()));
    }

    /// The connection `conn` of `client` is gone (closed by either side or
    /// with the broker process): the client reconnects after its backoff.
    pub(super) fn connection_lost(&mut self, conn: u64, client: ClientRef, broker_gone: bool) {
        let now = self.now();
        match client {
            ClientRef::Producer(p) => {
                let pr = &mut self.producers[p];
                if pr.conn != Some(conn) {
                    return;
                }
                pr.conn = None;
                pr.ready = false;
                let seqs: Vec<u64> = pr.pending.keys().copied().collect();
                let seqs: Vec<u64> = seqs
                    .into_iter()
                    .filter(|s| self.access_may_be_stored(p, *s))
                    .collect();
                self.producers[p].uncertain.extend(seqs);
                if !self.access_conn_lost(p, conn) {
                    return;
                }
            }
            ClientRef::Consumer(c) => {
                let co = &mut self.consumers[c];
                if co.conn != Some(conn) {
                    return;
                }
                co.conn = None;
                self.unsubs_consumer_gone(c);
                let co = &mut self.consumers[c];
                if let Some(cx) = co.connection.take() {
                    cx.close(CloseReason::Requested);
                }
                co.subscribes.clear();
                let acks: Vec<OutAck> = std::mem::take(&mut co.acks).into_values().collect();
                co.retry.extend(acks);
                co.era += 1;
                co.app.clear();
                co.poll_scheduled = false;
                co.since_cumulative = 0;
                co.cumulative_candidate = None;
                co.batch_seen = None;
                let (sub, id) = (co.sub, co.id);
                if !broker_gone {
                    self.checker.consumer_reconnected(&self.subs[sub], id);
                }
                self.activity.reconnects += 1;
            }
            ClientRef::Txn(r) => {
                if !self.txn_connection_lost(r, conn, broker_gone) {
                    return;
                }
            }
            ClientRef::Reader(r) => {
                if !self.readers_connection_lost(r, conn) {
                    return;
                }
            }
        }
        let _ = now;
        let at = self.backoff();
        self.sched.after(at, Ev::Connect(client));
    }

    /// Bytes from the core reach the client of `conn`.
    pub(super) fn client_receive(&mut self, conn: u64, client: ClientRef, bytes: &[u8]) {
        let cutter = match client {
            ClientRef::Producer(p) => &mut self.producers[p].cutter,
            ClientRef::Consumer(c) => &mut self.consumers[c].cutter,
            ClientRef::Txn(r) => self.txn_cutter(r),
            ClientRef::Reader(r) => self.readers_cutter(r),
        };
        cutter.push(bytes);
        loop {
            let cutter = match client {
                ClientRef::Producer(p) => &mut self.producers[p].cutter,
                ClientRef::Consumer(c) => &mut self.consumers[c].cutter,
                ClientRef::Txn(r) => self.txn_cutter(r),
                ClientRef::Reader(r) => self.readers_cutter(r),
            };
            let f = match cutter.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => return,
                Err(e) => {
                    self.checker.livelock(
                        &format!("the core sent a frame the client cannot cut: {e}"),
                        self.now(),
                    );
                    self.done = true;
                    return;
                }
            };
            let cmd = match BrokerCommand::decode(f.command()) {
                Ok(c) => c,
                Err(e) => {
                    self.checker.livelock(
                        &format!("the core sent a BaseCommand that does not decode: {e}"),
                        self.now(),
                    );
                    self.done = true;
                    return;
                }
            };
            if cmd.r#type == ty::PING {
                let pong = BrokerCommand {
                    r#type: ty::PONG,
                    pong: Some(command::Empty {}),
                    ..Default::default()
                };
                self.send_to_broker(conn, frame(&pong, Vec::new()));
                continue;
            }
            match client {
                ClientRef::Producer(p) => self.producer_command(p, conn, cmd),
                ClientRef::Consumer(c) => {
                    self.consumer_command(c, conn, cmd, &f.whole, f.payload())
                }
                ClientRef::Txn(r) => self.txn_command(r, conn, cmd, &f),
                ClientRef::Reader(r) => self.readers_command(r, conn, cmd, f.payload()),
            }
            // A command may have closed the connection.
            if !self.conns.contains_key(&conn) {
                return;
            }
        }
    }

    fn producer_command(&mut self, p: usize, conn: u64, cmd: BrokerCommand) {
        let receipt = cmd.r#type == ty::SEND_RECEIPT;
        self.producer_frame(p, conn, cmd);
        if receipt && self.conns.contains_key(&conn) {
            // With access modes: the producer may release the topic.
            self.access_maybe_release(p);
        }
    }

    fn producer_frame(&mut self, p: usize, conn: u64, cmd: BrokerCommand) {
        match cmd.r#type {
            ty::CONNECTED => {
                let pr = &mut self.producers[p];
                pr.next_req += 1;
                let request_id = pr.next_req;
                let producer_access_mode = self.access_open(p, request_id);
                let c = BrokerCommand {
                    r#type: ty::PRODUCER,
                    producer: Some(command::CommandProducer {
                        topic: TOPIC.into(),
                        producer_id: PRODUCER_ID,
                        request_id,
                        producer_name: Some(format!("p-{p}")),
                        producer_access_mode,
                        topic_epoch: None,
                    }),
                    ..Default::default()
                };
                self.send_to_broker(conn, frame(&c, Vec::new()));
            }
            ty::PRODUCER_SUCCESS => {
                let ready = match &cmd.producer_success {
                    Some(s) => self.access_success(p, conn, s),
                    None => true,
                };
                if !ready {
                    return;
                }
                let pr = &mut self.producers[p];
                pr.ready = true;
                // Pulsar's producer resends what had no receipt, in order.
                let resend: Vec<(u64, Vec<u8>, usize, bool)> = pr
                    .pending
                    .iter()
                    .flat_map(|(s, e)| {
                        if e.chunks.is_empty() {
                            vec![(*s, e.payload.clone(), e.messages.len(), false)]
                        } else {
                            e.chunks[e.chunks_receipted..]
                                .iter()
                                .map(|c| (*s, c.clone(), 1, true))
                                .collect()
                        }
                    })
                    .collect();
                for (seq, payload, n, is_chunk) in resend {
                    self.access_sending(p, seq);
                    self.node.resent_entries += 1;
                    if is_chunk {
                        self.chunks.activity.chunks_resent += 1;
                    }
                    self.send_entry(conn, seq, n, payload, is_chunk);
                }
                if !self.producers[p].publishing {
                    self.producers[p].publishing = true;
                    self.sched.after(0, Ev::Publish(p));
                }
                if self.producers[p].to_create == 0 {
                    self.access_maybe_release(p);
                }
            }
            ty::SEND_RECEIPT => {
                let Some(r) = cmd.send_receipt else { return };
                self.access_receipt(p, conn, r.sequence_id);
                if let Some(e) = self.producers[p].pending.get_mut(&r.sequence_id) {
                    if !e.chunks.is_empty() {
                        self.chunks.activity.chunk_receipts += 1;
                        e.chunks_receipted += 1;
                        if e.chunks_receipted < e.chunks.len() {
                            return; // not the last chunk's receipt
                        }
                    }
                }
                let Some(e) = self.producers[p].pending.remove(&r.sequence_id) else {
                    return; // a receipt of a resent entry already receipted
                };
                let Some(id) = r.message_id else { return };
                if super::stored_once::is_duplicate_receipt(&id) {
                    // Not stored again: the copy of an earlier send (whose
                    // receipt was lost) is the message, registered when it
                    // is delivered (its sequence id is uncertain).
                    self.node.deduplicated_messages += e.messages.len() as u64;
                    let due = e.messages.iter().map(|m| m.deliver_at).max().unwrap_or(0);
                    self.stored_once.deduplicated(p, r.sequence_id, due);
                    self.producers[p].receipted += e.messages.len() as u64;
                    // The copy the answer stands for, if the store holds
                    // it, is published at its position (`dup_copy.rs`).
                    if let Some(pos) = self.stored_copy(p, r.sequence_id) {
                        self.check_stored_once(p, r.sequence_id, pos);
                        let copies: Vec<MessageRef> = e
                            .messages
                            .iter()
                            .enumerate()
                            .map(|(i, m)| {
                                let mref = MessageRef {
                                    position: pos,
                                    batch_index: i as u32,
                                };
                                if !self.checker.knows(mref) {
                                    self.node.dup_copies_in_store += 1;
                                    self.checker.published(mref, m.key, m.deliver_at);
                                    for s in &self.subs {
                                        self.checker.exempt_from_order(s, mref);
                                    }
                                }
                                mref
                            })
                            .collect();
                        self.published_after_clears(&copies);
                    }
                    return;
                }
                let pos = position_of(&id);
                self.check_stored_once(p, r.sequence_id, pos);
                for (i, m) in e.messages.iter().enumerate() {
                    self.checker.published(
                        MessageRef {
                            position: pos,
                            batch_index: i as u32,
                        },
                        m.key,
                        m.deliver_at,
                    );
                }
                let msgs: Vec<MessageRef> = (0..e.messages.len())
                    .map(|i| MessageRef {
                        position: pos,
                        batch_index: i as u32,
                    })
                    .collect();
                self.published_after_clears(&msgs);
                self.producers[p].receipted += e.messages.len() as u64;
            }
            ty::SEND_ERROR | ty::ERROR => {
                if let Some(e) = &cmd.error {
                    if self.access_error(p, conn, e) {
                        return;
                    }
                }
                // Pulsar's producer closes the connection on a SendError
                // and resends after reconnecting.
                self.close_conn(conn);
                self.connection_lost(conn, ClientRef::Producer(p), false);
            }
            ty::CLOSE_PRODUCER => {
                let id = cmd.close_producer.as_ref().map_or(0, |c| c.id);
                if self.access_closed_by_core(id) {
                    self.close_conn(conn);
                    self.connection_lost(conn, ClientRef::Producer(p), false);
                }
            }
            ty::SUCCESS => {
                if let Some(s) = &cmd.success {
                    self.access_success_answer(p, conn, s.request_id);
                }
            }
            _ => {}
        }
    }

    fn send_entry(&mut self, conn: u64, seq: u64, n: usize, payload: Vec<u8>, is_chunk: bool) {
        let c = BrokerCommand {
            r#type: ty::SEND,
            send: Some(command::CommandSend {
                producer_id: PRODUCER_ID,
                sequence_id: seq,
                num_messages: Some(n as i32),
                txnid_least_bits: None,
                txnid_most_bits: None,
                highest_sequence_id: None,
                is_chunk: is_chunk.then_some(true),
            }),
            ..Default::default()
        };
        self.send_to_broker(conn, frame(&c, payload));
    }

    /// The producer's next entry: a delayed message alone (Pulsar never
    /// batches one), else a batch of up to `batch_size` messages of one key
    /// (key-based batching, as Key_Shared producers use).
    pub(super) fn publish(&mut self, p: usize) {
        let w = self.w;
        let now = self.now();
        let pr = &self.producers[p];
        let Some(conn) = pr.conn.filter(|_| pr.ready) else {
            self.producers[p].publishing = false;
            return;
        };
        if pr.to_create == 0 {
            self.producers[p].publishing = false;
            return;
        }
        let key = self.rng.random_range(0..w.keys);
        let delayed = w.delayed_ratio > 0.0 && self.rng.random_bool(w.delayed_ratio);
        let pr = &mut self.producers[p];
        let seq = pr.next_seq;
        pr.next_seq += 1;
        let (n, deliver_at) = if delayed {
            (1, now + self.rng.random_range(1..=w.max_delay_ms.max(1)))
        } else {
            (u64::from(w.batch_size).min(pr.to_create), 0)
        };
        let pr = &mut self.producers[p];
        pr.to_create -= n;
        let batched = !delayed && w.batch_size > 1;
        let messages: Vec<PendingMessage> =
            (0..n).map(|_| PendingMessage { key, deliver_at }).collect();
        let key_text = format!("key-{key}");
        let bodies: Vec<(SingleMessageMetadata, Vec<u8>)> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let body = payload_text(p, seq, i, *m);
                (
                    SingleMessageMetadata {
                        partition_key: Some(key_text.clone()),
                        payload_size: body.len() as i32,
                        compacted_out: None,
                    },
                    body,
                )
            })
            .collect();
        let meta = MessageMetadata {
            producer_name: format!("p-{p}"),
            sequence_id: seq,
            publish_time: EPOCH_BASE_MS + now,
            partition_key: Some(key_text),
            num_messages_in_batch: batched.then_some(n as i32),
            deliver_at_time: delayed.then_some((EPOCH_BASE_MS + deliver_at) as i64),
            ..Default::default()
        };
        // A drawn fraction of single messages goes as 2-4 chunks
        // (`chunks.rs`; the workload refuses chunks with batches).
        let chunks = if !delayed
            && n == 1
            && w.faults.chunked_ratio > 0.0
            && self.rng.random_bool(w.faults.chunked_ratio)
        {
            let k = self.rng.random_range(2..=4usize);
            super::chunks::chunk_payloads(&meta, &bodies[0].1, k)
        } else {
            Vec::new()
        };
        let pr = &mut self.producers[p];
        if !chunks.is_empty() {
            self.chunks.activity.messages_sent += 1;
            self.chunks.activity.chunks_sent += chunks.len() as u64;
            pr.pending.insert(
                seq,
                PendingSend {
                    payload: Vec::new(),
                    messages,
                    chunks: chunks.clone(),
                    chunks_receipted: 0,
                },
            );
            self.access_sending(p, seq);
            for c in chunks {
                self.send_entry(conn, seq, 1, c, true);
            }
        } else {
            let payload = encode_entry_payload(&meta, &bodies);
            pr.pending.insert(
                seq,
                PendingSend {
                    payload: payload.clone(),
                    messages,
                    chunks: Vec::new(),
                    chunks_receipted: 0,
                },
            );
            self.access_sending(p, seq);
            self.send_entry(conn, seq, n as usize, payload, false);
        }
        let next = w.publish_interval_ms.max(1);
        self.sched.after(next, Ev::Publish(p));
    }

    /// Encodes what the consumer's connection wrote (Subscribe, Flow,
    /// CloseConsumer, redelivery, validation-error acks) and sends it.
    fn flush_consumer(&mut self, c: usize) {
        let w = self.w;
        let co = &mut self.consumers[c];
        let (Some(conn), Some(cx)) = (co.conn, co.connection.clone()) else {
            return;
        };
        if co.hold_flows {
            return;
        }
        let flushed = cx.flush_flows();
        self.activity.stale_flows_dropped += flushed.dropped.len() as u64;
        let current = co.client.as_ref().map(|cl| cl.state().incarnation());
        let mut stale = Vec::new();
        let mut bytes = Vec::new();
        for f in cx.take_outbox() {
            if let ClientFrame::AckValidationError { message_id, .. } = &f {
                let p = Position::new(message_id.ledger_id as i64, message_id.entry_id as i64);
                if co.corrupt_given_back.remove(&p) {
                    continue;
                }
            }
            // PIP-491: credit is scoped to one incarnation. A Flow of an
            // incarnation closed since (re-created on this same connection,
            // so the core cannot tell) would credit its replacement with
            // permits it never used.
            if let ClientFrame::Flow {
                incarnation,
                command,
            } = &f
            {
                if current.is_some_and(|cur| cur != *incarnation) {
                    stale.push((command.message_permits, *incarnation, current));
                }
            }
            let cmd = match f {
                ClientFrame::Subscribe {
                    consumer_id,
                    incarnation,
                } => {
                    co.next_req += 1;
                    co.subscribes.insert(co.next_req, incarnation);
                    subscribe_command(w, &self.subs[co.sub], co, consumer_id)
                }
                ClientFrame::Flow { command, .. } => {
                    self.activity.flows += 1;
                    BrokerCommand {
                        r#type: ty::FLOW,
                        flow: Some(CommandFlow {
                            consumer_id: command.consumer_id,
                            message_permits: command.message_permits,
                        }),
                        ..Default::default()
                    }
                }
                ClientFrame::CloseConsumer { consumer_id, .. } => {
                    co.next_req += 1;
                    BrokerCommand {
                        r#type: ty::CLOSE_CONSUMER,
                        close_consumer: Some(command::CommandIdRequest {
                            id: consumer_id,
                            request_id: co.next_req,
                        }),
                        ..Default::default()
                    }
                }
                // The simulator damages entries in transit only (the stored
                // entry is intact): the validation-error ack goes out as a
                // negative ack of the entry, so the core redelivers it
                // (Pulsar's broker would delete it) and the loss check
                // stays exact (see `faulty.rs`).
                ClientFrame::AckValidationError {
                    consumer_id,
                    message_id,
                    ..
                } => {
                    self.activity.negative_acks += 1;
                    BrokerCommand {
                        r#type: ty::REDELIVER_UNACKNOWLEDGED_MESSAGES,
                        redeliver_unacknowledged_messages: Some(
                            CommandRedeliverUnacknowledgedMessages {
                                consumer_id,
                                message_ids: vec![MessageIdData {
                                    ledger_id: message_id.ledger_id,
                                    entry_id: message_id.entry_id,
                                    ..Default::default()
                                }],
                                consumer_epoch: None,
                            },
                        ),
                        ..Default::default()
                    }
                }
                ClientFrame::RedeliverUnacknowledged {
                    consumer_id,
                    consumer_epoch,
                } => BrokerCommand {
                    r#type: ty::REDELIVER_UNACKNOWLEDGED_MESSAGES,
                    redeliver_unacknowledged_messages: Some(
                        CommandRedeliverUnacknowledgedMessages {
                            consumer_id,
                            message_ids: Vec::new(),
                            consumer_epoch: Some(consumer_epoch),
                        },
                    ),
                    ..Default::default()
                },
            };
            bytes.extend(frame(&cmd, Vec::new()));
        }
        let (sub, id) = (self.subs[co.sub].clone(), co.id);
        for (permits, incarnation, current) in stale {
            self.checker.permit_violation(
                &sub,
                id,
                &format!(
                    "a Flow of {permits} permits from closed incarnation {incarnation:?} reached its replacement {current:?} on the same connection"
                ),
                self.sched.now(),
            );
        }
        self.send_to_broker(conn, bytes);
    }

    /// Sends an ack with a `request_id` (Pulsar's ack receipt).
    pub(super) fn send_ack(&mut self, c: usize, ack: OutAck) {
        let co = &mut self.consumers[c];
        let Some(conn) = co.conn else {
            co.retry.push(ack);
            return;
        };
        co.next_req += 1;
        let req = co.next_req;
        let cmd = BrokerCommand {
            r#type: ty::ACK,
            ack: Some(CommandAck {
                consumer_id: CONSUMER_ID,
                ack_type: if ack.cumulative.is_some() { 1 } else { 0 },
                message_id: ack.ids.clone(),
                validation_error: None,
                txnid_least_bits: ack.txn.map(|(_, t)| t.least_sig_bits),
                txnid_most_bits: ack.txn.map(|(_, t)| t.most_sig_bits),
                request_id: Some(req),
            }),
            ..Default::default()
        };
        co.acks.insert(req, ack);
        self.send_to_broker(conn, frame(&cmd, Vec::new()));
    }

    fn consumer_command(
        &mut self,
        c: usize,
        conn: u64,
        cmd: BrokerCommand,
        whole: &[u8],
        payload: &[u8],
    ) {
        match cmd.r#type {
            ty::CONNECTED => {
                let co = &mut self.consumers[c];
                let Some(cx) = co.connection.clone() else {
                    return;
                };
                let rq = self.w.receiver_queue_size;
                let subscribed = match co.client.as_mut() {
                    None => ClientConsumer::subscribe(cx, CONSUMER_ID, rq).map(|n| {
                        co.client = Some(n);
                    }),
                    Some(cl) => cl.resubscribe(cx).map(|_| ()),
                };
                if subscribed.is_ok() {
                    self.flush_consumer(c);
                }
            }
            ty::SUCCESS => {
                let Some(s) = cmd.success else { return };
                if self.unsubscribe_answered(c, conn, s.request_id) {
                    return;
                }
                let co = &mut self.consumers[c];
                let Some(inc) = co.subscribes.remove(&s.request_id) else {
                    return; // CloseConsumer's
                };
                if let Some(cl) = co.client.as_mut() {
                    let _ = cl.subscribe_succeeded(inc);
                }
                self.flush_consumer(c);
                let retry = std::mem::take(&mut self.consumers[c].retry);
                for a in retry {
                    if let Some((k, _)) = a.txn {
                        // A transactional ack without a receipt: its
                        // transaction is aborted, the entry comes back.
                        let sub = self.subs[self.consumers[c].sub].clone();
                        self.txn_ack_settled(k, &sub, &a.msgs, None, true);
                        continue;
                    }
                    self.node.ack_retries += 1;
                    self.send_ack(c, a);
                }
            }
            ty::ERROR => {
                let Some(e) = cmd.error else { return };
                if self.unsubscribe_answered(c, conn, e.request_id) {
                    return;
                }
                if self.consumers[c].subscribes.contains_key(&e.request_id) {
                    // A refused subscribe: reconnect and try again.
                    self.close_conn(conn);
                    self.connection_lost(conn, ClientRef::Consumer(c), false);
                }
            }
            ty::MESSAGE => {
                self.chunk_frame(c, cmd.message.as_ref().map(|m| &m.message_id), payload);
                let (damage, damaged) =
                    self.damage_message(self.consumers[c].faulty_closes, &cmd, payload);
                let whole = damaged.as_deref().unwrap_or(whole);
                let co = &mut self.consumers[c];
                let Some(cl) = co.client.as_mut() else { return };
                let outcome = cl.handle_frame(whole, MAX_FRAME_SIZE);
                if damage != Damage::None {
                    let kind = outcome.map(|o| o.kind).ok();
                    if self.damaged_message(c, conn, &cmd, payload, damage, kind) {
                        return; // the client closed the connection
                    }
                } else {
                    match outcome {
                        Ok(o) => match o.kind {
                            CommandOutcomeKind::StaleEpoch
                            | CommandOutcomeKind::StaleIncarnation => {
                                self.node.stale_commands += 1;
                            }
                            CommandOutcomeKind::ProtocolError(e) => {
                                self.checker.permit_violation(
                                    &self.subs[self.consumers[c].sub],
                                    self.consumers[c].id,
                                    &format!("the client closed its connection on a MESSAGE: {e}"),
                                    self.now(),
                                );
                                self.close_conn(conn);
                                self.connection_lost(conn, ClientRef::Consumer(c), false);
                                return;
                            }
                            _ => {}
                        },
                        Err(e) => {
                            self.checker.permit_violation(
                                &self.subs[self.consumers[c].sub],
                                self.consumers[c].id,
                                &format!("MESSAGE not for this consumer: {e}"),
                                self.now(),
                            );
                            return;
                        }
                    }
                }
                self.hand_off(c);
                self.flush_consumer(c);
                let co = &mut self.consumers[c];
                if !co.poll_scheduled && !co.app.is_empty() {
                    co.poll_scheduled = true;
                    // Mostly a quick application, sometimes a slow one (it
                    // holds what it was delivered, unacknowledged, longer).
                    let at = if self.rng.random_bool(0.1) {
                        self.rng.random_range(20..=300)
                    } else {
                        self.rng.random_range(0..=3)
                    };
                    self.sched.after(at, Ev::Poll(c));
                }
            }
            ty::CLOSE_CONSUMER => {
                // The broker closed the consumer (a failed write): the
                // client subscribes again, on a new connection here.
                self.close_conn(conn);
                self.connection_lost(conn, ClientRef::Consumer(c), false);
            }
            ty::ACTIVE_CONSUMER_CHANGE
                if cmd.active_consumer_change.and_then(|a| a.is_active) == Some(false) =>
            {
                self.became_inactive(c);
            }
            ty::ACK_RESPONSE => {
                let Some(r) = cmd.ack_response else { return };
                if self.probe_answered(conn, &r) {
                    return;
                }
                let Some(req) = r.request_id else { return };
                let Some(ack) = self.consumers[c].acks.remove(&req) else {
                    return;
                };
                if ack.txn.is_some() && ack.cumulative.is_some() {
                    self.txn_cumulative_settled(c, ack, r.error);
                    return;
                }
                if let Some((k, _)) = ack.txn {
                    let sub = self.subs[self.consumers[c].sub].clone();
                    self.txn_ack_settled(k, &sub, &ack.msgs, r.error, false);
                    if r.error.is_some() {
                        // Refused inside the transaction: acknowledged again
                        // without it.
                        self.send_ack(c, OutAck { txn: None, ..ack });
                    }
                    return;
                }
                if r.error.is_some() {
                    // Not persisted: the application acknowledges again.
                    self.send_ack(c, ack);
                    return;
                }
                self.node.ack_receipts += 1;
                if ack.cumulative.is_none() {
                    self.probe_deleted_ack(c, &ack.ids);
                }
                self.ack_receipt(c, ack);
            }
            _ => {}
        }
    }

    /// An ack's receipt: it is durable. Applied to the consumer's current
    /// incarnation when it was sent in it; an ack of an earlier era (sent
    /// before a reconnect, resubscribe or redelivery request, or resent
    /// after one) only counts as an ack.
    fn ack_receipt(&mut self, c: usize, ack: OutAck) {
        let now = self.now();
        let co = &self.consumers[c];
        let sub = self.subs[co.sub].clone();
        let current = ack.era == co.era;
        let id = co.id;
        match ack.cumulative {
            Some(upto) => {
                // An ack of this subscription whose receipt was lost (a
                // crash after its fsync, a closed connection) may be in the
                // mark-delete already: until its resend is receipted the
                // client cannot tell what a cumulative ack may cover.
                let unsettled = self.cumulative_unsettled(co.sub);
                if current && !unsettled {
                    self.checker.cumulative_ack_applied(&sub, id, upto, now);
                    if !ack.msgs.is_empty() {
                        self.checker.ack_applied(&sub, id, &ack.msgs, now);
                    }
                }
                self.activity.cumulative_acks += 1;
                self.checker.cumulative_acked(&sub, upto);
                // The indexes a cumulative ack inside a batch covers.
                for m in &ack.msgs {
                    self.checker.acked(&sub, *m, now);
                }
            }
            None => {
                if current {
                    self.checker.ack_applied(&sub, id, &ack.msgs, now);
                }
                for m in &ack.msgs {
                    self.checker.acked(&sub, *m, now);
                }
            }
        }
    }

    /// The application takes up to a seeded number of messages from the
    /// receiver queue: each is a delivery; it acknowledges them (individual
    /// acks with batch-index `ack_set`, or cumulative acks every
    /// `cumulative_ack_every` messages on Failover) and returns their
    /// permits (the client library decides the Flow).
    pub(super) fn poll(&mut self, c: usize) {
        let now = self.now();
        let w = self.w;
        self.consumers[c].poll_scheduled = false;
        if !self.consumers[c].ready() {
            return;
        }
        let take = self.rng.random_range(1..=64usize);
        let cumulative_every = w.cumulative_ack_every;
        let (sub_name, id) = {
            let co = &self.consumers[c];
            (self.subs[co.sub].clone(), co.id)
        };
        let mut ids = Vec::new();
        let mut msgs = Vec::new();
        // This poll's acks may go inside the open transaction (`txn.rs`).
        let txn = if cumulative_every == 0 {
            self.txn_for_ack()
        } else {
            None
        };
        let (mut txn_ids, mut txn_msgs) = (Vec::new(), Vec::new());
        let mut txn_batches: std::collections::BTreeMap<(u64, u64), (i32, Vec<u32>)> =
            std::collections::BTreeMap::new();
        let _ = (&sub_name, id, now);
        for _ in 0..take {
            let Some((m, mref)) = self.consumers[c].app.pop_front() else {
                break;
            };
            // The application took a message (its ack goes out on this
            // connection): progress for the faulty broker's fairness bound.
            // A hand-off the same instant's close takes back is none.
            self.consumers[c].faulty_closes = 0;
            let pos = mref.position;
            let bi = m.message_id.batch_index.unwrap_or(-1);
            let batch = m.message_id.batch_size.filter(|_| bi >= 0);
            if txn.is_some() {
                // A transactional ack (of a batch's message: the batch-index
                // ack of its index, Pulsar's `ack_set`): an abort makes the
                // entry come back, so the client does not mark it
                // acknowledged.
                match batch {
                    // A batch's messages taken in this poll: one id per
                    // entry, its `ack_set` clearing every index taken (two
                    // ids of one entry in one ack would conflict with each
                    // other in the pending-ack state).
                    Some(b) => {
                        self.node.batch_index_acks += 1;
                        txn_batches
                            .entry((m.message_id.ledger_id, m.message_id.entry_id))
                            .or_insert_with(|| (b, Vec::new()))
                            .1
                            .push(bi as u32);
                    }
                    None => txn_ids.push(MessageIdData {
                        ledger_id: m.message_id.ledger_id,
                        entry_id: m.message_id.entry_id,
                        ..Default::default()
                    }),
                }
                txn_msgs.push(mref);
                drop(m);
                continue;
            }
            // A negative ack (`nack.rs`): not acknowledged; the entry's
            // negatively acknowledged messages go back in one request once
            // the application is done with the entry's delivery.
            if cumulative_every == 0 && self.nack_drawn() {
                let era = self.consumers[c].era;
                let e = self.consumers[c]
                    .nacks
                    .entry(pos)
                    .or_insert_with(|| (era, Vec::new()));
                if e.0 != era {
                    *e = (era, Vec::new());
                }
                e.1.push(mref);
                drop(m);
                continue;
            }
            let co = &mut self.consumers[c];
            // An individual ack is sent now: the client skips redeliveries
            // of it (Pulsar's ack-grouping `isDuplicate`). A message only
            // covered by a later cumulative ack is not acknowledged yet.
            if cumulative_every == 0 {
                if let Some(cl) = co.client.as_mut() {
                    cl.acknowledge(&m.message_id);
                }
            }
            if cumulative_every > 0 {
                co.since_cumulative += 1;
                if batch.is_none_or(|b| bi == b - 1) {
                    co.batch_seen = None;
                    co.cumulative_candidate = Some(CumulativeUpTo {
                        position: pos,
                        within: None,
                    });
                } else if let Some(b) = batch {
                    co.batch_seen = match co.batch_seen {
                        Some((p, next)) if p == pos && next == bi => Some((pos, bi + 1)),
                        _ if bi == 0 => Some((pos, 1)),
                        _ => None,
                    };
                    // Inside a batch whose indexes 0..=bi the application
                    // took: sometimes the cumulative ack stops here.
                    if co.batch_seen.is_some() && self.rng.random_bool(0.5) {
                        co.cumulative_candidate = Some(CumulativeUpTo {
                            position: pos,
                            within: Some((bi, b)),
                        });
                    }
                }
            } else {
                let id = match batch {
                    Some(b) => {
                        self.node.batch_index_acks += 1;
                        MessageIdData {
                            ledger_id: m.message_id.ledger_id,
                            entry_id: m.message_id.entry_id,
                            ack_set: wire::ack_set_from_indexes(
                                (0..b.max(0) as u32).filter(|i| *i as i32 != bi),
                            ),
                            batch_size: Some(b),
                            ..Default::default()
                        }
                    }
                    None => MessageIdData {
                        ledger_id: m.message_id.ledger_id,
                        entry_id: m.message_id.entry_id,
                        ..Default::default()
                    },
                };
                // A chunked message: every chunk's id (`chunks.rs`).
                ids.extend(self.chunk_ack_ids(c, id));
                msgs.push(mref);
            }
            drop(m); // the application is done with it: its permit returns
        }
        let era = self.consumers[c].era;
        for ((ledger_id, entry_id), (b, taken)) in txn_batches {
            txn_ids.push(MessageIdData {
                ledger_id,
                entry_id,
                ack_set: wire::ack_set_from_indexes(
                    (0..b.max(0) as u32).filter(|i| !taken.contains(i)),
                ),
                batch_size: Some(b),
                ..Default::default()
            });
        }
        if let Some(t) = txn {
            if txn_ids.is_empty() {
                self.txn_ack_unused(t.0);
            } else {
                self.send_ack(
                    c,
                    OutAck {
                        era,
                        ids: txn_ids,
                        msgs: txn_msgs,
                        cumulative: None,
                        txn: Some(t),
                    },
                );
            }
        }
        if !ids.is_empty() {
            self.send_ack(
                c,
                OutAck {
                    era,
                    ids,
                    msgs,
                    cumulative: None,
                    txn: None,
                },
            );
        }
        self.send_nacks(c);
        let co = &mut self.consumers[c];
        let empty = co.app.is_empty();
        if cumulative_every > 0
            && (co.since_cumulative >= cumulative_every || empty)
            && co.cumulative_candidate.is_some()
        {
            let within = co.cumulative_candidate.is_some_and(|u| u.within.is_some());
            // Inside the open transaction, or after the one holding this
            // consumer's transactional cumulative ack ended (`txn_cumulative.rs`).
            let choice = self.txn_cumulative_choice(c, within);
            let co = &mut self.consumers[c];
            let upto = match choice {
                super::txn_cumulative::CumulativeChoice::Wait => None,
                _ => co.cumulative_candidate.take(),
            };
            if let Some(upto) = upto {
                co.since_cumulative = 0;
                if upto.within.is_some() {
                    self.node.batch_index_acks += 1;
                }
                let mut ack = cumulative_ack(era, upto);
                if let super::txn_cumulative::CumulativeChoice::Txn(k, id) = choice {
                    ack.txn = Some((k, id));
                    self.consumers[c].cum_txn = Some((k, era));
                }
                self.send_ack(c, ack);
            }
        }
        self.flush_consumer(c);
        let co = &mut self.consumers[c];
        if !empty && !co.poll_scheduled {
            co.poll_scheduled = true;
            let at = self.rng.random_range(1..=5);
            self.sched.after(at, Ev::Poll(c));
        }
    }

    /// Takes what the client library handed off into the application's
    /// queue: each message is a delivery as the client sees it (at its
    /// arrival, before any later frame of the connection).
    fn hand_off(&mut self, c: usize) {
        if self.unsubscribing(c) {
            // The application called unsubscribe: what still arrives is
            // discarded with the consumer (`unsubscribe.rs`).
            while let Some(m) = self.consumers[c]
                .client
                .as_mut()
                .and_then(|cl| cl.receive())
            {
                drop(m);
            }
            return;
        }
        let now = self.now();
        let sub = self.subs[self.consumers[c].sub].clone();
        let id = self.consumers[c].id;
        while let Some(m) = self.consumers[c]
            .client
            .as_mut()
            .and_then(|cl| cl.receive())
        {
            // A chunk goes into its chunked message (`chunks.rs`).
            let Some(m) = self.chunk_arrived(c, m) else {
                continue;
            };
            let sabotage = self.opts.sabotage.filter(|_| !self.sabotage_spent);
            if sabotage == Some(Sabotage::DropOneDelivery) {
                self.sabotage_spent = true;
                continue;
            }
            let bi = m.message_id.batch_index.unwrap_or(-1);
            let mref = MessageRef {
                position: position_of(&m.message_id),
                batch_index: bi.max(0) as u32,
            };
            if let Some((p, seq, _, _)) = parse_payload(&m.payload) {
                self.check_stored_once(p, seq, mref.position);
            }
            self.txn_on_delivery(&sub, mref, &m.payload);
            if !self.checker.knows(mref) {
                self.maybe_copy(mref, &m.payload);
            }
            let clears = self
                .delayed
                .clears_before(self.consumers[c].sub, self.consumers[c].conn);
            self.checker.delivered(&sub, id, mref, now, clears);
            if sabotage == Some(Sabotage::DeliverOneTwice) {
                self.sabotage_spent = true;
                self.checker.delivered(&sub, id, mref, now, clears);
            }
            self.consumers[c].app.push_back((m, mref));
        }
        // PIP-491: an incarnation is sent entries while it has permits left
        // (its receiver queue, then what it returned), a batch costing its
        // deliverable messages: what it holds unprocessed stays within its
        // receiver queue plus one batch less one message.
        let held = self.consumers[c].app.len();
        let rq = self.w.receiver_queue_size as usize + self.w.batch_size as usize - 1;
        if held > rq {
            self.checker.permit_violation(
                &sub,
                id,
                &format!(
                    "the receiver queue holds {held} messages, above its size {rq}: the broker sent more than this incarnation granted"
                ),
                now,
            );
        }
    }

    /// Producer `p`'s entry `seq` is at `pos`: a second position is the
    /// "stored twice" violation ([`super::stored_once`]).
    fn check_stored_once(&mut self, p: usize, seq: u64, pos: Position) {
        if let Err(first) = self.stored_once.stored(p, seq, pos) {
            let now = self.now();
            self.checker.stored_twice(
                &format!("producer p-{p} sequence id {seq} at {first} and at {pos}"),
                now,
            );
        }
    }

    /// A delivered entry the checker does not know: accepted as the copy
    /// of a send whose connection was lost before its receipt (registered
    /// as published), else left to the checker's unknown-message rule.
    fn maybe_copy(&mut self, mref: MessageRef, payload: &[u8]) {
        let Some((p, seq, key, at)) = parse_payload(payload) else {
            return;
        };
        if self
            .producers
            .get(p)
            .is_some_and(|pr| pr.uncertain.contains(&seq))
        {
            self.node.lost_receipt_copies += 1;
            self.checker.published(mref, key, at);
            for s in &self.subs {
                self.checker.exempt_from_order(s, mref);
            }
            self.published_after_clears(&[mref]);
        }
    }
}

impl Node<'_> {
    /// The consumer closes and subscribes again with the same consumer id
    /// on the same connection: a new incarnation, whose permits must not
    /// be credited by anything of the old one (PIP-491).
    pub(super) fn same_connection(&mut self, c: usize) {
        // Right after a poll whose returned permits queued a Flow (not yet
        // written): the revalidation must drop it, it must never credit
        // the replacement (PIP-491).
        self.consumers[c].hold_flows = true;
        self.poll(c);
        self.consumers[c].hold_flows = false;
        let co = &mut self.consumers[c];
        let (Some(cx), Some(cl)) = (co.connection.clone(), co.client.as_mut()) else {
            return;
        };
        if cl.resubscribe(cx).is_err() {
            return;
        }
        co.era += 1;
        co.app.clear();
        co.since_cumulative = 0;
        co.cumulative_candidate = None;
        co.batch_seen = None;
        let (sub, id) = (co.sub, co.id);
        self.checker.consumer_reconnected(&self.subs[sub], id);
        self.activity.same_connection_recreations += 1;
        self.flush_consumer(c);
    }

    /// The application of consumer `c` unsubscribes: it stops taking
    /// messages and drops what it holds unprocessed; for the checker its
    /// hold on what it was delivered ends (the broker redelivers it to the
    /// others as it removes this consumer).
    pub(super) fn consumer_leaves(&mut self, c: usize) {
        let co = &mut self.consumers[c];
        co.era += 1;
        co.app.clear();
        co.since_cumulative = 0;
        co.cumulative_candidate = None;
        co.batch_seen = None;
        let (sub, id) = (co.sub, co.id);
        self.checker.consumer_reconnected(&self.subs[sub], id);
    }

    /// ACTIVE_CONSUMER_CHANGE told a Failover consumer it is not the
    /// active one: the broker rewound to the mark-delete, so what this
    /// consumer holds unacknowledged goes to the active consumer. The
    /// application drops what it had not processed (its permits return)
    /// and, for the checker, this incarnation's hold on its messages ends
    /// (their redelivery to the active consumer is Pulsar's Failover).
    pub(super) fn became_inactive(&mut self, c: usize) {
        let co = &mut self.consumers[c];
        if co.client.is_none() {
            return;
        }
        co.era += 1;
        co.app.clear();
        co.since_cumulative = 0;
        co.cumulative_candidate = None;
        let (sub, id) = (co.sub, co.id);
        self.checker.consumer_reconnected(&self.subs[sub], id);
        self.node.inactive_notices += 1;
        self.flush_consumer(c);
    }

    /// The consumer asks for its unacknowledged messages again
    /// (REDELIVER_UNACKNOWLEDGED_MESSAGES with its bumped epoch).
    pub(super) fn redeliver(&mut self, c: usize) {
        let co = &mut self.consumers[c];
        let Some(cl) = co.client.as_mut().filter(|_| co.conn.is_some()) else {
            return;
        };
        cl.redeliver_unacknowledged();
        co.era += 1;
        co.app.clear();
        co.since_cumulative = 0;
        co.cumulative_candidate = None;
        co.batch_seen = None;
        let (sub, id) = (co.sub, co.id);
        self.checker.consumer_reconnected(&self.subs[sub], id);
        self.node.redelivery_requests += 1;
        self.flush_consumer(c);
    }
}

/// The SUBSCRIBE of consumer `co` of subscription `sub` with its next
/// request id.
fn subscribe_command(w: &Workload, sub: &str, co: &Consumer, consumer_id: u64) -> BrokerCommand {
    let sub_type = match w.subscription_type {
        SubscriptionType::KeyShared => wire::SubType::KeyShared,
        SubscriptionType::Shared => wire::SubType::Shared,
        SubscriptionType::Failover => wire::SubType::Failover,
    } as i32;
    BrokerCommand {
        r#type: ty::SUBSCRIBE,
        subscribe: Some(CommandSubscribe {
            topic: TOPIC.into(),
            subscription: sub.to_string(),
            sub_type,
            consumer_id,
            request_id: co.next_req,
            consumer_name: Some(co.name.clone()),
            priority_level: None,
            durable: None,
            initial_position: Some(1),
            key_shared_meta: (w.subscription_type == SubscriptionType::KeyShared)
                .then_some(KeySharedMeta { key_shared_mode: 0 }),
            consumer_epoch: co.client.as_ref().map(|c| c.epoch()),
        }),
        ..Default::default()
    }
}

impl Node<'_> {
    /// Consumer `c`'s SUBSCRIBE again, as framed bytes, with a request id
    /// of its own (a duplicate Subscribe: its Success changes nothing on
    /// the client).
    pub(super) fn subscribe_again_frame(&mut self, c: usize) -> Option<Vec<u8>> {
        let w = self.w;
        let co = &mut self.consumers[c];
        co.client.as_ref()?;
        co.next_req += 1;
        let cmd = subscribe_command(w, &self.subs[co.sub], co, CONSUMER_ID);
        Some(frame(&cmd, Vec::new()))
    }
}

/// The cumulative ACK covering `upto`: the entry's id alone, or inside a
/// batch (Pulsar's cumulative batch-index ack) the id with the `ack_set` of
/// the indexes after `index`, which moves mark-delete to the entry before
/// and keeps the rest of the batch (`ManagedCursorImpl`'s
/// batchDeletedIndexes); the checker counts the entries before it and
/// indexes `0..=index` of it as acknowledged.
fn cumulative_ack(era: u64, upto: CumulativeUpTo) -> OutAck {
    let p = upto.position;
    let mut id = MessageIdData {
        ledger_id: p.ledger_id as u64,
        entry_id: p.entry_id as u64,
        ..Default::default()
    };
    let Some((index, size)) = upto.within else {
        return OutAck {
            era,
            ids: vec![id],
            msgs: Vec::new(),
            cumulative: Some(p),
            txn: None,
        };
    };
    id.batch_index = Some(index);
    id.batch_size = Some(size);
    id.ack_set = wire::ack_set_from_indexes(index as u32 + 1..size.max(0) as u32);
    OutAck {
        era,
        ids: vec![id],
        msgs: (0..=index as u32)
            .map(|batch_index| MessageRef {
                position: p,
                batch_index,
            })
            .collect(),
        cumulative: Some(p.previous_in_ledger()),
        txn: None,
    }
}

impl Node<'_> {
    /// Individual acks a chunk context sends at once (duplicated chunks,
    /// chunks of a chunked message the producer sent again): no message
    /// of the checker's is among them.
    pub(super) fn chunk_ack_now(&mut self, c: usize, ids: Vec<MessageIdData>) {
        let era = self.consumers[c].era;
        self.send_ack(
            c,
            OutAck {
                era,
                ids,
                msgs: Vec::new(),
                cumulative: None,
                txn: None,
            },
        );
    }
}
