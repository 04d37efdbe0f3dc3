//! PRODUCER, CLOSE_PRODUCER's topic side and SEND (Pulsar's
//! `ServerCnx.handleProducer` / `handleSend`, `Producer.publishMessage`,
//! `PersistentTopic.publishMessage`): access modes and names
//! ([`super::producer`]), deduplication ([`super::dedup`]), chunks
//! ([`super::chunking`]), and which SEND_ERROR each refusal gets.
//!
//! ## SEND_ERROR and what the clients do with it
//!
//! The official C++ client (and the Python client built on it) fails a
//! single message only on `ChecksumError` (`ClientConnection::handleSendError`
//! → `ProducerImpl::removeCorruptMessage`); on any other code it closes the
//! whole connection, reconnects and resends every pending message. The
//! Java client fails the message on `NotAllowedError`
//! (`recoverNotAllowedError`), marks the producer terminated on
//! `TopicTerminatedError`, and on `ChecksumError` resends the message when
//! its own copy verifies. So a refusal that a retry cannot cure is
//! answered with the code the connected client treats as final for that
//! message ([`final_send_error`]): `NotAllowedError` to a Java client,
//! `ChecksumError` to every other; the message text names the real reason.
//! A refusal a retry can cure keeps Pulsar's code (the client reconnects
//! and resends, bounded by its send timeout):
//!
//! | refusal | answered | client |
//! |---|---|---|
//! | payload checksum or sizes wrong | `ChecksumError` (Pulsar's) | message failed |
//! | metadata undecodable, a batch count the payload cannot hold, chunk fields that describe no chunk, a plain SEND carrying a txnid or marker, a transactional SEND the transaction refuses | final ([`final_send_error`]) | message failed |
//! | the store fails the append | `PersistenceError` (Pulsar's) | reconnect, resend |
//! | unknown producer id, a producer still waiting for exclusive access | `ServiceNotReady` (Pulsar closes the connection) | reconnect, re-create the producer, resend |
//! | a duplicate (deduplication) | no error: SEND_RECEIPT `(-1, -1)` | send completed |
//!
//! A message above `max_message_size` never reaches SEND: the clients
//! refuse it locally (`MessageTooBig`) or chunk it; a frame above the
//! frame limit closes the connection, as Pulsar's frame decoder does.

use crate::proto::command::{self, server_error, ty, BrokerCommand};
use crate::proto::frame::parse_entry_payload;

use super::chunking::{publish_metadata, PublishFields};
use super::dedup::Verdict;
use super::entry::entry_info;
use super::producer::{AccessMode, Admitted, ProducerSlot};
use super::send_commit::{dup_receipt_cmd, send_error_cmd, PendingEntry, SendId};
use super::topic::{name_for_error, MAX_NAME_BYTES};
use super::{Broker, ConnectionId};

/// A producer on a connection.
#[derive(Debug, Clone)]
pub(crate) struct ProducerRef {
    pub(super) topic: String,
    pub(super) name: String,
    /// False while a `WaitForExclusive` producer is queued.
    pub(super) ready: bool,
}

/// The SEND_ERROR code a client with CONNECT `client_version` treats as
/// final for one message (see the module table).
pub fn final_send_error(client_version: &str) -> i32 {
    if client_version.starts_with("Pulsar-Java") {
        server_error::NOT_ALLOWED_ERROR
    } else {
        server_error::CHECKSUM_ERROR
    }
}

/// `request_id` of a CLOSE_PRODUCER the broker sends on its own (Pulsar's
/// `-1L`).
const BROKER_REQUEST_ID: u64 = u64::MAX;

impl Broker {
    #[allow(clippy::too_many_arguments)]
    fn producer_success(
        &mut self,
        conn: ConnectionId,
        request_id: u64,
        producer_name: String,
        last_sequence_id: i64,
        topic_epoch: Option<u64>,
        producer_ready: bool,
    ) {
        self.reply(
            conn,
            BrokerCommand {
                r#type: ty::PRODUCER_SUCCESS,
                producer_success: Some(command::CommandProducerSuccess {
                    request_id,
                    producer_name,
                    last_sequence_id: Some(last_sequence_id),
                    topic_epoch,
                    producer_ready: Some(producer_ready),
                }),
                ..Default::default()
            },
        );
    }

    fn last_sequence_id(&self, topic: &str, name: &str) -> i64 {
        self.topics
            .get(topic)
            .map_or(-1, |t| t.dedup.last_sequence_id(name))
    }

    pub(super) fn handle_producer(&mut self, conn: ConnectionId, p: command::CommandProducer) {
        if let Some(existing) = self.conn_mut(conn).producers.get(&p.producer_id).cloned() {
            // Pulsar's ServerCnx: a producer id already open on this
            // connection answers success with that producer's name and
            // keeps it (on its topic).
            let last = self.last_sequence_id(&existing.topic, &existing.name);
            let epoch = self
                .topics
                .get(&existing.topic)
                .and_then(|t| t.producers.topic_epoch());
            return self.producer_success(
                conn,
                p.request_id,
                existing.name,
                last,
                epoch,
                existing.ready,
            );
        }
        let Some(mode) = AccessMode::from_wire(p.producer_access_mode.unwrap_or(0)) else {
            return self.error(
                conn,
                p.request_id,
                server_error::NOT_ALLOWED_ERROR,
                format!("unknown producer_access_mode {:?}", p.producer_access_mode),
            );
        };
        let topic = match self.topic(&p.topic) {
            Ok(t) => t,
            Err(e) => return self.error(conn, p.request_id, e.server_error(), e.to_string()),
        };
        let name = p
            .producer_name
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("serve-{}-{conn}-{}", self.started_ms, p.producer_id));
        if name.len() > MAX_NAME_BYTES {
            return self.error(
                conn,
                p.request_id,
                server_error::NOT_ALLOWED_ERROR,
                format!(
                    "producer name {} is above {MAX_NAME_BYTES} bytes",
                    name_for_error(&name)
                ),
            );
        }
        let slot = ProducerSlot {
            conn,
            producer_id: p.producer_id,
            request_id: p.request_id,
            name: name.clone(),
            topic_epoch: p.topic_epoch,
        };
        let Some(t) = self.topics.get_mut(&topic) else {
            return;
        };
        let admitted = t.producers.check(&slot, mode).and_then(|(epoch, queued)| {
            if let Some(e) = epoch {
                t.dedup.set_topic_epoch(e)?;
            }
            Ok(t.producers.admit(slot, mode, epoch, queued))
        });
        let admitted = match admitted {
            Ok(a) => a,
            Err(e) => {
                tracing::info!(conn, topic = %topic, producer = %name, ?mode, error = %e, "producer refused");
                return self.error(conn, p.request_id, e.server_error(), e.to_string());
            }
        };
        tracing::info!(conn, topic = %topic, producer = %name, ?mode, "producer");
        let ready = !matches!(admitted, Admitted::Queued);
        self.conn_mut(conn).producers.insert(
            p.producer_id,
            ProducerRef {
                topic: topic.clone(),
                name: name.clone(),
                ready,
            },
        );
        match admitted {
            Admitted::Queued => self.producer_success(conn, p.request_id, name, -1, None, false),
            Admitted::Ready {
                topic_epoch,
                fenced,
                refused,
            } => {
                let last = self.last_sequence_id(&topic, &name);
                self.producer_success(conn, p.request_id, name, last, topic_epoch, true);
                for f in fenced {
                    tracing::info!(conn = f.conn, producer = %f.name, "producer fenced out");
                    self.forget_producer(&f);
                    self.reply(
                        f.conn,
                        BrokerCommand {
                            r#type: ty::CLOSE_PRODUCER,
                            close_producer: Some(command::CommandIdRequest {
                                id: f.producer_id,
                                request_id: BROKER_REQUEST_ID,
                            }),
                            ..Default::default()
                        },
                    );
                }
                for r in refused {
                    self.forget_producer(&r);
                    self.error(
                        r.conn,
                        r.request_id,
                        server_error::PRODUCER_FENCED,
                        "Fenced out".into(),
                    );
                }
            }
        }
    }

    /// Drops `slot` from its connection's producers (the topic already did).
    fn forget_producer(&mut self, slot: &ProducerSlot) {
        if let Some(c) = self.conns.get_mut(&slot.conn) {
            c.producers.remove(&slot.producer_id);
        }
    }

    /// Producer `producer_id` of `conn` left (closed, or its connection
    /// went): the topic forgets it, and a queued `WaitForExclusive`
    /// producer gets the topic if it is now free.
    pub(super) fn remove_producer(
        &mut self,
        conn: ConnectionId,
        producer_id: u64,
        p: &ProducerRef,
    ) {
        let Some(t) = self.topics.get_mut(&p.topic) else {
            return;
        };
        t.producers.remove(conn, producer_id);
        if let Some(next) = t.producers.next_waiting() {
            let (slot, epoch) = match next {
                Ok(n) => n,
                Err((slot, e)) => {
                    let msg = e.to_string();
                    let code = e.server_error();
                    self.forget_producer(&slot);
                    self.error(slot.conn, slot.request_id, code, msg);
                    return self.remove_producer_continue(&p.topic);
                }
            };
            if let Err(e) = t.dedup.set_topic_epoch(epoch) {
                let (code, msg) = (e.server_error(), e.to_string());
                self.forget_producer(&slot);
                self.error(slot.conn, slot.request_id, code, msg);
                return self.remove_producer_continue(&p.topic);
            }
            t.producers.promote(slot.clone(), epoch);
            let last = t.dedup.last_sequence_id(&slot.name);
            if let Some(r) = self
                .conns
                .get_mut(&slot.conn)
                .and_then(|c| c.producers.get_mut(&slot.producer_id))
            {
                r.ready = true;
            }
            tracing::info!(conn = slot.conn, producer = %slot.name, epoch, "queued producer got the topic");
            self.producer_success(
                slot.conn,
                slot.request_id,
                slot.name,
                last,
                Some(epoch),
                true,
            );
        }
    }

    /// Continues promotion on `topic` after a queued producer was refused.
    fn remove_producer_continue(&mut self, topic: &str) {
        let p = ProducerRef {
            topic: topic.to_string(),
            name: String::new(),
            ready: false,
        };
        // No producer has id u64::MAX on connection u64::MAX: removes nothing.
        self.remove_producer(u64::MAX, u64::MAX, &p);
    }

    fn send_error(
        &mut self,
        conn: ConnectionId,
        s: &command::CommandSend,
        error: i32,
        message: String,
    ) {
        tracing::warn!(conn, producer_id = s.producer_id, sequence_id = s.sequence_id, error, %message, "SendError");
        self.send_reply(conn, send_error_cmd(SendId::of(s), error, message));
    }

    /// A refusal no retry cures: the code `conn`'s client fails the message on.
    fn final_error(&mut self, conn: ConnectionId, s: &command::CommandSend, message: String) {
        let code = final_send_error(
            self.conns
                .get(&conn)
                .map_or("", |c| c.client_version.as_str()),
        );
        self.send_error(conn, s, code, message);
    }

    /// SEND: validates the entry, answers a duplicate without storing it,
    /// and adds the entry to the turn's group commit (`send_commit.rs`: its
    /// receipt is queued after the commit, then the topic dispatches).
    pub(super) fn handle_send(
        &mut self,
        conn: ConnectionId,
        s: command::CommandSend,
        payload: &[u8],
    ) {
        let Some(p) = self
            .conn_mut(conn)
            .producers
            .get(&s.producer_id)
            .filter(|p| p.ready)
            .cloned()
        else {
            return self.send_error(
                conn,
                &s,
                server_error::SERVICE_NOT_READY,
                format!("producer {} not found or not ready", s.producer_id),
            );
        };
        if let Err(e) = parse_entry_payload(payload) {
            return self.send_error(
                conn,
                &s,
                server_error::CHECKSUM_ERROR,
                format!("bad entry payload: {e}"),
            );
        }
        if let Err(e) = entry_info(payload) {
            return self.final_error(conn, &s, format!("bad message metadata: {e}"));
        }
        let md = match publish_metadata(payload) {
            Ok(m) => m,
            Err(e) => return self.final_error(conn, &s, format!("bad message metadata: {e}")),
        };
        let chunk = match md.chunk(s.is_chunk == Some(true)) {
            Ok(c) => c,
            Err(e) => return self.final_error(conn, &s, format!("bad chunk metadata: {e}")),
        };
        let transactional = s.txnid_most_bits.is_some() || s.txnid_least_bits.is_some();
        // A transactional SEND goes to the transaction buffer; a plain one
        // may not carry a transaction id or a marker in its metadata (a
        // client cannot forge a commit or abort marker).
        let txn = if transactional {
            match self.txn_send_check(&p.topic, s.txnid_most_bits, s.txnid_least_bits, payload) {
                Ok(id) => Some(id),
                Err(e) => {
                    return self.final_error(conn, &s, format!("{e} ({:?})", e.server_error()))
                }
            }
        } else {
            if super::txn::entry_txn(payload) != super::txn::EntryTxn::Plain {
                return self.final_error(
                    conn,
                    &s,
                    "a non-transactional SEND whose metadata carries a txnid or marker_type".into(),
                );
            }
            None
        };
        let Some(topic) = self.topics.get_mut(&p.topic) else {
            return self.send_error(
                conn,
                &s,
                server_error::SERVICE_NOT_READY,
                format!("topic {} not open", p.topic),
            );
        };
        match topic.dedup.check(&p.name, s.sequence_id, chunk) {
            Verdict::Dup => {
                tracing::info!(conn, producer = %p.name, sequence_id = s.sequence_id, "duplicate SEND answered without storing it");
                self.send_reply(conn, dup_receipt_cmd(SendId::of(&s)));
            }
            Verdict::Pending => {
                tracing::info!(conn, producer = %p.name, sequence_id = s.sequence_id, "duplicate of an entry of this group commit: answered after it");
                self.hold_dup_of_pending(conn, SendId::of(&s));
            }
            Verdict::NotDup => self.hold_entry(PendingEntry {
                conn,
                send: SendId::of(&s),
                topic: p.topic.clone(),
                producer_name: p.name.clone(),
                chunk,
                txn,
                payload: payload.to_vec(),
            }),
        }
    }
}
