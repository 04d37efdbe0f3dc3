//! Per-connection command handling (Pulsar's `ServerCnx`): the handshake,
//! lookups, producers and SEND, consumers and their Flow / ACK / redelivery
//! / close, GET_LAST_MESSAGE_ID, GET_SCHEMA, PING, and the answers to
//! commands the core does not implement.
//!
//! A command that does not decode, lacks a required field, has a type that
//! is no `BaseCommand.Type`, carries a payload it cannot have, comes before
//! CONNECT or is a second CONNECT closes the connection
//! ([`ConnectionError`]). Commands the core does not implement get a
//! `CommandError` naming their request id (`UnsupportedVersionError`),
//! never a silent drop.

use std::collections::BTreeMap;

use prost::Message;

use crate::permits::broker::{ConsumerKey, RemovedConsumer};
use crate::proto::wire::MessageIdData;
use crate::Position;

use super::error::{BrokerError, ConnectionError};
use super::output::{Output, SentMessage};
use super::subscription::{sub_type, Leave, SubConsumer, Subscription};
use super::topic::{name_for_error, MAX_NAME_BYTES};
use super::{Broker, ConnectionId, MAX_MESSAGE_SIZE, PROTOCOL_VERSION};
use crate::proto::command::{self, server_error, ty, BrokerCommand};

/// A consumer on a connection: where it is attached.
#[derive(Debug, Clone)]
struct ConsumerRef {
    topic: String,
    subscription: String,
}

/// One open connection's state.
#[derive(Debug, Default)]
pub(crate) struct Connection {
    connected: bool,
    consumers: BTreeMap<u64, ConsumerRef>,
    pub(super) producers: BTreeMap<u64, super::publish::ProducerRef>,
    /// CONNECT's `client_version` (which SEND_ERROR a client treats as
    /// final: [`super::publish`]).
    pub(super) client_version: String,
}

impl Connection {
    /// (topic, subscription) of consumer `consumer_id`.
    pub(super) fn consumer_target(&self, consumer_id: u64) -> Option<(String, String)> {
        self.consumers
            .get(&consumer_id)
            .map(|r| (r.topic.clone(), r.subscription.clone()))
    }

    /// Forgets consumer `consumer_id` (already removed from its
    /// subscription).
    pub(super) fn forget_consumer(&mut self, consumer_id: u64) {
        self.consumers.remove(&consumer_id);
    }
}

/// The position of a message id; `None` when its ledger_id or entry_id is
/// above `i64::MAX` (no entry is there: positions are signed).
fn position_of(m: &MessageIdData) -> Option<Position> {
    Some(Position::new(
        i64::try_from(m.ledger_id).ok()?,
        i64::try_from(m.entry_id).ok()?,
    ))
}

fn require(raw: &[u8], ty: i32, fields: &[u32]) -> Result<(), ConnectionError> {
    command::has_required(raw, ty as u32, fields).map_err(ConnectionError::Malformed)
}

impl Broker {
    /// Connection `conn` opened (Pulsar's channel active). Reopening an id
    /// still open closes the old connection first.
    pub fn handle_open(&mut self, conn: ConnectionId, now_ms: u64) {
        self.commit_sends();
        self.tick(now_ms);
        if self.conns.contains_key(&conn) {
            self.forget(conn);
        }
        self.conns.insert(conn, Connection::default());
        self.out.outbound.insert(conn, 0);
    }

    /// Connection `conn` is gone: its consumers are removed (their
    /// unacknowledged entries go to replay and other consumers get them)
    /// and its producers closed.
    pub fn handle_close(&mut self, conn: ConnectionId, now_ms: u64) {
        self.commit_sends();
        self.tick(now_ms);
        self.forget(conn);
    }

    /// Whether `conn` is open and has completed CONNECT.
    pub fn is_connected(&self, conn: ConnectionId) -> bool {
        self.conns.get(&conn).is_some_and(|c| c.connected)
    }

    pub(super) fn forget(&mut self, conn: ConnectionId) {
        let Some(c) = self.conns.remove(&conn) else {
            return;
        };
        for id in c.consumers.keys() {
            self.drop_consumer(conn, &c.consumers, *id, "disconnected", Leave::Connection);
        }
        for (id, p) in &c.producers {
            self.remove_producer(conn, *id, p);
        }
        self.out.outbound.remove(&conn);
        self.out.active_listeners.remove(&conn);
        self.out.writes.remove(&conn);
    }

    /// One frame of connection `conn`: its `BaseCommand` bytes and the
    /// payload after them. On an error the connection is closed: the core
    /// forgets it and queues [`Output::Close`].
    ///
    /// # Errors
    /// [`ConnectionError`]: why the connection closes.
    pub fn handle_frame(
        &mut self,
        conn: ConnectionId,
        command: &[u8],
        payload: &[u8],
        now_ms: u64,
    ) -> Result<(), ConnectionError> {
        self.tick(now_ms);
        if !self.conns.contains_key(&conn) {
            return Err(ConnectionError::UnknownConnection(conn));
        }
        let result = BrokerCommand::decode(command)
            .map_err(|e| ConnectionError::Malformed(format!("BaseCommand: {e}")))
            .and_then(|cmd| self.handle_command(conn, cmd, command, payload));
        if let Err(e) = &result {
            self.forget(conn);
            self.out.queue.push_back(Output::Close {
                conn,
                reason: e.to_string(),
            });
        }
        result
    }

    pub(super) fn reply(&mut self, conn: ConnectionId, cmd: BrokerCommand) {
        self.out.frame(conn, &cmd, Vec::new());
    }

    pub(super) fn error(
        &mut self,
        conn: ConnectionId,
        request_id: u64,
        error: i32,
        message: String,
    ) {
        tracing::info!(conn, request_id, error, %message, "CommandError");
        self.reply(
            conn,
            BrokerCommand {
                r#type: ty::ERROR,
                error: Some(command::CommandError {
                    request_id,
                    error,
                    message,
                }),
                ..Default::default()
            },
        );
    }

    pub(super) fn success(&mut self, conn: ConnectionId, request_id: u64) {
        self.reply(
            conn,
            BrokerCommand {
                r#type: ty::SUCCESS,
                success: Some(command::CommandSuccess { request_id }),
                ..Default::default()
            },
        );
    }

    pub(super) fn conn_mut(&mut self, conn: ConnectionId) -> &mut Connection {
        self.conns.entry(conn).or_default()
    }

    /// The subscription consumer `consumer_id` of `conn` is attached to,
    /// with its topic's ledger.
    fn consumer_sub(
        &mut self,
        conn: ConnectionId,
        consumer_id: u64,
    ) -> Option<(
        &std::sync::Arc<crate::ledger::ManagedLedger>,
        &mut Subscription,
    )> {
        let r = self.conns.get(&conn)?.consumers.get(&consumer_id)?.clone();
        let t = self.topics.get_mut(&r.topic)?;
        let s = t.subscriptions.get_mut(&r.subscription)?;
        Some((&t.ml, s))
    }

    /// The subscription the incarnation that `m` was sent to is attached
    /// to; `None` when that incarnation left.
    pub(super) fn subscription_of(&mut self, m: &SentMessage) -> Option<&mut Subscription> {
        let r = self
            .conns
            .get(&m.consumer.connection_id)?
            .consumers
            .get(&m.consumer.consumer_id)?;
        let s = self
            .topics
            .get_mut(&r.topic)?
            .subscriptions
            .get_mut(&r.subscription)?;
        s.consumers
            .iter()
            .any(|c| c.key == m.consumer && c.incarnation == m.incarnation)
            .then_some(s)
    }

    /// Dispatches the subscription of consumer `consumer_id` of `conn`.
    fn dispatch_consumer_sub(&mut self, conn: ConnectionId, consumer_id: u64) {
        let Some(r) = self
            .conns
            .get(&conn)
            .and_then(|c| c.consumers.get(&consumer_id))
            .cloned()
        else {
            return;
        };
        self.dispatch_sub(&r.topic, &r.subscription);
    }

    pub(crate) fn dispatch_sub(&mut self, topic: &str, subscription: &str) {
        if let Some(t) = self.topics.get_mut(topic) {
            if let Some(s) = t.subscriptions.get_mut(subscription) {
                if !s.consumers.is_empty() {
                    s.dispatch(&t.ml, &mut self.out);
                }
            }
        }
    }

    fn handle_command(
        &mut self,
        conn: ConnectionId,
        cmd: BrokerCommand,
        raw: &[u8],
        payload: &[u8],
    ) -> Result<(), ConnectionError> {
        tracing::debug!(conn, ty = cmd.r#type, "command");
        if !command::is_command_type(cmd.r#type) {
            return Err(ConnectionError::Malformed(format!(
                "command type {} is not a BaseCommand.Type value",
                cmd.r#type
            )));
        }
        let connected = self.conns.get(&conn).is_some_and(|c| c.connected);
        if !connected && cmd.r#type != ty::CONNECT {
            return Err(ConnectionError::Protocol(format!(
                "command type {} before CONNECT",
                cmd.r#type
            )));
        }
        if !payload.is_empty() && cmd.r#type != ty::SEND {
            return Err(ConnectionError::Malformed(format!(
                "command type {} carries a payload",
                cmd.r#type
            )));
        }
        if !super::send_commit::passes_batch(cmd.r#type) {
            // Its handling depends on the outcome of the turn's SENDs.
            self.commit_sends();
        }
        match cmd.r#type {
            ty::CONNECT => {
                if connected {
                    return Err(ConnectionError::Protocol("second CONNECT".into()));
                }
                require(raw, ty::CONNECT, &[1])?;
                let c = cmd.connect.unwrap_or_default();
                tracing::info!(conn, client = %c.client_version, protocol = ?c.protocol_version, "connected");
                self.conn_mut(conn).connected = true;
                self.conn_mut(conn).client_version = c.client_version.clone();
                let pv = c.protocol_version.unwrap_or(0).min(PROTOCOL_VERSION);
                if c.protocol_version.unwrap_or(0) >= super::ACTIVE_CONSUMER_LISTENER_VERSION {
                    self.out.active_listeners.insert(conn);
                }
                let server_version = self.config.server_version.clone();
                self.reply(
                    conn,
                    BrokerCommand {
                        r#type: ty::CONNECTED,
                        connected: Some(command::CommandConnected {
                            server_version,
                            protocol_version: Some(pv),
                            max_message_size: Some(MAX_MESSAGE_SIZE),
                        }),
                        ..Default::default()
                    },
                );
            }
            ty::PING => self.reply(
                conn,
                BrokerCommand {
                    r#type: ty::PONG,
                    pong: Some(command::Empty {}),
                    ..Default::default()
                },
            ),
            ty::PONG => {}
            ty::PARTITIONED_METADATA => {
                require(raw, ty::PARTITIONED_METADATA, &[1, 2])?;
                let m = cmd.partition_metadata.unwrap_or_default();
                // The coordinator assignment topic: one partition, one
                // coordinator (tc_id 0) on this node.
                let tc = m.topic == super::txn::TC_ASSIGN_TOPIC;
                let resp = match if tc {
                    Ok(String::new())
                } else {
                    self.topic(&m.topic)
                } {
                    Ok(_) if tc => command::CommandPartitionedTopicMetadataResponse {
                        partitions: Some(1),
                        request_id: m.request_id,
                        response: Some(0),
                        error: None,
                        message: None,
                    },
                    Ok(_) => command::CommandPartitionedTopicMetadataResponse {
                        partitions: Some(0),
                        request_id: m.request_id,
                        response: Some(0),
                        error: None,
                        message: None,
                    },
                    Err(e) => command::CommandPartitionedTopicMetadataResponse {
                        partitions: None,
                        request_id: m.request_id,
                        response: Some(1),
                        error: Some(e.server_error()),
                        message: Some(e.to_string()),
                    },
                };
                self.reply(
                    conn,
                    BrokerCommand {
                        r#type: ty::PARTITIONED_METADATA_RESPONSE,
                        partition_metadata_response: Some(resp),
                        ..Default::default()
                    },
                );
            }
            ty::LOOKUP => {
                require(raw, ty::LOOKUP, &[1, 2])?;
                let m = cmd.lookup_topic.unwrap_or_default();
                // A coordinator partition is served here without opening a topic.
                let tc = m.topic.starts_with(super::txn::TC_ASSIGN_TOPIC);
                let resp = match if tc {
                    Ok(String::new())
                } else {
                    self.topic(&m.topic)
                } {
                    Ok(_) => command::CommandLookupTopicResponse {
                        broker_service_url: Some(self.config.advertised_url.clone()),
                        response: Some(1),
                        request_id: m.request_id,
                        authoritative: Some(true),
                        error: None,
                        message: None,
                    },
                    Err(e) => command::CommandLookupTopicResponse {
                        broker_service_url: None,
                        response: Some(2),
                        request_id: m.request_id,
                        authoritative: None,
                        error: Some(e.server_error()),
                        message: Some(e.to_string()),
                    },
                };
                self.reply(
                    conn,
                    BrokerCommand {
                        r#type: ty::LOOKUP_RESPONSE,
                        lookup_topic_response: Some(resp),
                        ..Default::default()
                    },
                );
            }
            ty::PRODUCER => {
                require(raw, ty::PRODUCER, &[1, 2, 3])?;
                let p = cmd.producer.unwrap_or_default();
                self.handle_producer(conn, p);
            }
            ty::SEND => {
                require(raw, ty::SEND, &[1, 2])?;
                let s = cmd.send.unwrap_or_default();
                self.handle_send(conn, s, payload);
            }
            ty::CLOSE_PRODUCER => {
                require(raw, ty::CLOSE_PRODUCER, &[1, 2])?;
                let c = cmd.close_producer.unwrap_or_default();
                if let Some(p) = self.conn_mut(conn).producers.remove(&c.id) {
                    tracing::info!(conn, producer = %p.name, "producer closed");
                    self.remove_producer(conn, c.id, &p);
                }
                self.success(conn, c.request_id);
            }
            ty::SUBSCRIBE => {
                require(raw, ty::SUBSCRIBE, &[1, 2, 3, 4, 5])?;
                let s = cmd.subscribe.unwrap_or_default();
                let start = super::reader::ReaderStart::of(raw)?;
                self.handle_subscribe(conn, s, start);
            }
            ty::FLOW => {
                require(raw, ty::FLOW, &[1, 2])?;
                let f = cmd.flow.unwrap_or_default();
                let key = ConsumerKey {
                    connection_id: conn,
                    consumer_id: f.consumer_id,
                };
                let Some((_, sub)) = self.consumer_sub(conn, f.consumer_id) else {
                    // Received, credited to no one (the dispatcher records
                    // the Flows of its consumers).
                    crate::trace::permits::broker_recv_flow(
                        (conn, f.consumer_id),
                        f.message_permits,
                    );
                    tracing::warn!(
                        conn,
                        consumer_id = f.consumer_id,
                        "Flow for an unknown consumer ignored"
                    );
                    return Ok(());
                };
                if let Err(e) = sub.flow(key, f.message_permits) {
                    tracing::warn!(conn, error = %e, "Flow rejected");
                }
                self.dispatch_consumer_sub(conn, f.consumer_id);
            }
            ty::ACK => {
                require(raw, ty::ACK, &[1, 2])?;
                let a = cmd.ack.unwrap_or_default();
                self.handle_ack(conn, a);
            }
            ty::REDELIVER_UNACKNOWLEDGED_MESSAGES => {
                require(raw, ty::REDELIVER_UNACKNOWLEDGED_MESSAGES, &[1])?;
                let r = cmd.redeliver_unacknowledged_messages.unwrap_or_default();
                let key = ConsumerKey {
                    connection_id: conn,
                    consumer_id: r.consumer_id,
                };
                let positions: Vec<Position> =
                    r.message_ids.iter().filter_map(position_of).collect();
                if positions.len() != r.message_ids.len() {
                    tracing::warn!(conn, "redeliver: message ids above i64::MAX ignored");
                    if positions.is_empty() {
                        // Never "redeliver everything" for ids that were all invalid.
                        return Ok(());
                    }
                }
                if let Some((_, sub)) = self.consumer_sub(conn, r.consumer_id) {
                    sub.redeliver(key, &positions, r.consumer_epoch);
                    self.dispatch_consumer_sub(conn, r.consumer_id);
                }
            }
            ty::CLOSE_CONSUMER => {
                require(raw, ty::CLOSE_CONSUMER, &[1, 2])?;
                let c = cmd.close_consumer.unwrap_or_default();
                match self.conn_mut(conn).consumers.remove(&c.id) {
                    Some(r) => {
                        let one = BTreeMap::from([(c.id, r)]);
                        self.drop_consumer(conn, &one, c.id, "closed", Leave::Close);
                    }
                    // Received, removing no one (the dispatcher records the
                    // closes of its consumers).
                    None => crate::trace::permits::broker_recv_close((conn, c.id)),
                }
                self.success(conn, c.request_id);
            }
            ty::UNSUBSCRIBE => {
                require(raw, ty::UNSUBSCRIBE, &[1, 2])?;
                let u = cmd.unsubscribe.unwrap_or_default();
                // CommandUnsubscribe.force = 3 (optional bool, default false).
                let force =
                    command::nested_varint(raw, ty::UNSUBSCRIBE as u32, 3).is_some_and(|v| v != 0);
                self.handle_unsubscribe(conn, u.id, u.request_id, force);
            }
            ty::SEEK => {
                require(raw, ty::SEEK, &[1, 2])?;
                let s = cmd.seek.unwrap_or_default();
                self.handle_seek(conn, s);
            }
            ty::GET_LAST_MESSAGE_ID => {
                require(raw, ty::GET_LAST_MESSAGE_ID, &[1, 2])?;
                let g = cmd.get_last_message_id.unwrap_or_default();
                let Some((ml, sub)) = self.consumer_sub(conn, g.id) else {
                    self.error(
                        conn,
                        g.request_id,
                        server_error::CONSUMER_NOT_FOUND,
                        format!("consumer {} not found", g.id),
                    );
                    return Ok(());
                };
                let md = sub.mark_delete();
                let resp = super::reader::last_message_id_response(ml, md, g.request_id);
                self.reply(
                    conn,
                    BrokerCommand {
                        r#type: ty::GET_LAST_MESSAGE_ID_RESPONSE,
                        get_last_message_id_response: Some(resp),
                        ..Default::default()
                    },
                );
            }
            ty::GET_SCHEMA => {
                let request_id = command::nested_varint(raw, ty::GET_SCHEMA as u32, 1).unwrap_or(0);
                self.reply(
                    conn,
                    BrokerCommand {
                        r#type: ty::GET_SCHEMA_RESPONSE,
                        get_schema_response: Some(command::CommandGetSchemaResponse {
                            request_id,
                            error_code: Some(server_error::TOPIC_NOT_FOUND),
                            error_message: Some("pulsar-core serve keeps no schemas".into()),
                        }),
                        ..Default::default()
                    },
                );
            }
            ty::TC_CLIENT_CONNECT_REQUEST => {
                require(raw, cmd.r#type, &[1, 2])?;
                self.handle_txn_command(conn, cmd);
            }
            ty::NEW_TXN | ty::ADD_PARTITION_TO_TXN | ty::ADD_SUBSCRIPTION_TO_TXN | ty::END_TXN => {
                require(raw, cmd.r#type, &[1])?;
                self.handle_txn_command(conn, cmd);
            }
            other => {
                let name = format!("command type {other} is not supported by pulsar-core serve");
                match command::request_id_tag(other)
                    .and_then(|tag| command::nested_varint(raw, other as u32, tag))
                {
                    Some(request_id) => self.error(
                        conn,
                        request_id,
                        server_error::UNSUPPORTED_VERSION_ERROR,
                        name,
                    ),
                    None => tracing::warn!(
                        conn,
                        ty = other,
                        "unsupported command without a request id ignored"
                    ),
                }
            }
        }
        Ok(())
    }

    /// A (non-transactional) ACK: applied to the subscription's deletion
    /// state now, persisted by the turn's group commit
    /// ([`Broker::flush`], `group_commit.rs`); its receipt is held until
    /// that commit completed. An ack refused before any write (unknown
    /// consumer, a position out of range, an unreadable entry) is answered
    /// at once.
    fn handle_ack(&mut self, conn: ConnectionId, a: crate::proto::wire::CommandAck) {
        if a.txnid_most_bits.is_some() || a.txnid_least_bits.is_some() {
            return self.handle_txn_ack(conn, a);
        }
        let target = self
            .conns
            .get(&conn)
            .and_then(|c| c.consumers.get(&a.consumer_id))
            .cloned();
        let result = if a.message_id.iter().any(|m| position_of(m).is_none()) {
            if self.consumer_sub(conn, a.consumer_id).is_none() {
                Err(format!("ack for unknown consumer {}", a.consumer_id))
            } else {
                Err("ack of a message id whose ledger_id or entry_id is above i64::MAX".into())
            }
        } else {
            match self.consumer_sub(conn, a.consumer_id) {
                None => Err(format!("ack for unknown consumer {}", a.consumer_id)),
                Some((ml, sub)) => {
                    let ml = std::sync::Arc::clone(ml);
                    sub.apply_ack(&ml, a.ack_type == 1, &a.message_id)
                }
            }
        };
        match (result, target) {
            (Ok(changed), Some(r)) => {
                if changed {
                    self.acks.mark(&r.topic, &r.subscription);
                }
                if let Some(request_id) = a.request_id {
                    self.acks
                        .hold(&r.topic, &r.subscription, conn, a.consumer_id, request_id);
                }
            }
            (result, _) => {
                let result = result.map(|_| ());
                if let Err(e) = &result {
                    tracing::warn!(conn, error = %e, "ack failed");
                }
                if let Some(request_id) = a.request_id {
                    let resp =
                        super::group_commit::ack_response(a.consumer_id, request_id, &result);
                    self.reply(conn, resp);
                }
            }
        }
    }

    /// A transactional ACK (`txnid_*` present): pending in the
    /// subscription's pending-ack log until the transaction ends; answered
    /// with a `CommandAckResponse` carrying the transaction id (error
    /// `TransactionConflict` on a conflict), as Pulsar's `ServerCnx` does.
    fn handle_txn_ack(&mut self, conn: ConnectionId, a: crate::proto::wire::CommandAck) {
        let target = self
            .conns
            .get(&conn)
            .and_then(|c| c.consumers.get(&a.consumer_id))
            .cloned();
        let result = match target {
            None => Err(super::txn::TxnError::NotAllowed(format!(
                "ack for unknown consumer {}",
                a.consumer_id
            ))),
            Some(r) => self.txn_ack(conn, &r.topic, &r.subscription, &a),
        };
        if let Err(e) = &result {
            tracing::warn!(conn, error = %e, "transactional ack refused");
        }
        if a.request_id.is_some() {
            let resp = super::txn::handlers_ack_response(&a, &result);
            self.reply(
                conn,
                BrokerCommand {
                    r#type: ty::ACK_RESPONSE,
                    ack_response: Some(resp),
                    ..Default::default()
                },
            );
        }
        self.dispatch_consumer_sub(conn, a.consumer_id);
    }

    fn handle_subscribe(
        &mut self,
        conn: ConnectionId,
        s: crate::proto::wire::CommandSubscribe,
        start: super::reader::ReaderStart,
    ) {
        if self.conn_mut(conn).consumers.contains_key(&s.consumer_id) {
            // A re-subscribe of a live consumer id is idempotent in Pulsar.
            return self.success(conn, s.request_id);
        }
        if s.subscription.len() > MAX_NAME_BYTES {
            return self.error(
                conn,
                s.request_id,
                server_error::NOT_ALLOWED_ERROR,
                format!(
                    "subscription name {} is above {} bytes",
                    name_for_error(&s.subscription),
                    MAX_NAME_BYTES
                ),
            );
        }
        if s.subscription == super::dedup::CURSOR {
            return self.error(
                conn,
                s.request_id,
                server_error::NOT_ALLOWED_ERROR,
                format!(
                    "{} is the deduplication cursor's name",
                    super::dedup::CURSOR
                ),
            );
        }
        if !(0..=3).contains(&s.sub_type) {
            return self.error(
                conn,
                s.request_id,
                server_error::NOT_ALLOWED_ERROR,
                format!("unknown subType {}", s.sub_type),
            );
        }
        let topic = match self.topic(&s.topic) {
            Ok(t) => t,
            Err(e) => return self.error(conn, s.request_id, e.server_error(), e.to_string()),
        };
        match self.subscribe(conn, &topic, &s, &start) {
            Ok(active_before) => {
                if let Err(e) = self.attach_txn(&topic, &s.subscription) {
                    // Transactional acks on it are refused (ServiceNotReady)
                    // until a later subscribe opens the handle.
                    tracing::warn!(conn, error = %e, "pending-ack handle not opened");
                }
                self.conn_mut(conn).consumers.insert(
                    s.consumer_id,
                    ConsumerRef {
                        topic: topic.clone(),
                        subscription: s.subscription.clone(),
                    },
                );
                self.success(conn, s.request_id);
                let key = ConsumerKey {
                    connection_id: conn,
                    consumer_id: s.consumer_id,
                };
                if let Some(sub) = self
                    .topics
                    .get_mut(&topic)
                    .and_then(|t| t.subscriptions.get_mut(&s.subscription))
                {
                    sub.after_consumers_changed(active_before, Some(key), &mut self.out);
                }
            }
            Err(e) => self.error(conn, s.request_id, e.server_error(), e.to_string()),
        }
    }

    /// Attaches a consumer to subscription `s.subscription` of `topic`
    /// (opening or recovering it); returns the subscription's active
    /// consumer before it (Exclusive / Failover).
    fn subscribe(
        &mut self,
        conn: ConnectionId,
        topic: &str,
        s: &crate::proto::wire::CommandSubscribe,
        start: &super::reader::ReaderStart,
    ) -> Result<Option<ConsumerKey>, BrokerError> {
        let now = self.now();
        let clock: std::sync::Arc<dyn crate::delayed::Clock> = self.clock.clone();
        self.check_durability(topic, s)?;
        let Some(t) = self.topics.get_mut(topic) else {
            return Err(BrokerError::Component(format!("topic {topic} not open")));
        };
        if !t.subscriptions.contains_key(&s.subscription) && s.durable == Some(false) {
            let sub = Subscription::open_non_durable(
                &self.store,
                &t.ml,
                &s.subscription,
                s.sub_type,
                start.mark_delete(&t.ml, s.initial_position == Some(1)),
                clock.clone(),
                self.config.delayed.clone(),
            )?;
            t.subscriptions.insert(s.subscription.clone(), sub);
            if let Some(secs) = start.rollback_secs.filter(|s| *s > 0) {
                super::reader::rollback(t, &s.subscription, now, secs)?;
            }
        }
        if !t.subscriptions.contains_key(&s.subscription) {
            let sub = self.config.open_subscription(
                &self.store,
                &t.ml,
                &s.subscription,
                s.sub_type,
                s.initial_position == Some(1),
                clock,
                now,
            )?;
            t.subscriptions.insert(s.subscription.clone(), sub);
        }
        let admission = self.config.admission.clone();
        let Some(sub) = t.subscriptions.get_mut(&s.subscription) else {
            return Err(BrokerError::Component("subscription vanished".into()));
        };
        if sub.consumers.is_empty() {
            sub.sub_type = s.sub_type;
            sub.rewind_for_first_consumer();
        } else if sub.sub_type != s.sub_type {
            return Err(BrokerError::ConsumerBusy(format!(
                "subscription {} has type {}, not {}",
                s.subscription, sub.sub_type, s.sub_type
            )));
        } else if s.sub_type == sub_type::EXCLUSIVE {
            return Err(BrokerError::ConsumerBusy(format!(
                "exclusive subscription {} already has a consumer",
                s.subscription
            )));
        }
        let key = ConsumerKey {
            connection_id: conn,
            consumer_id: s.consumer_id,
        };
        sub.admission = admission;
        let active_before = sub.active_consumer();
        let epoch = s.consumer_epoch.unwrap_or(0);
        let incarnation = self.next_incarnation;
        sub.add_consumer(SubConsumer {
            key,
            incarnation,
            epoch,
            name: s.consumer_name.clone().unwrap_or_default(),
            priority: s.priority_level.unwrap_or(0),
            conn,
            granted: 0,
            debited: 0,
            commands: 0,
            min_available: 0,
            redeliveries: 0,
        })
        .map_err(BrokerError::ConsumerBusy)?;
        self.next_incarnation += 1;
        tracing::info!(topic = %t.name, subscription = %s.subscription, ?key, incarnation, sub_type = s.sub_type, "consumer subscribed");
        if let Some(c) = sub.consumers.iter().find(|c| c.key == key) {
            let record = c.record(&t.name, &s.subscription, "subscribed", sub.balance(key));
            self.out.queue.push_back(Output::Incarnation(record));
        }
        Ok(active_before)
    }

    /// Removes consumer `consumer_id` of `conn` as a close does (its end
    /// labelled `end`); whether it was attached.
    pub(crate) fn remove_consumer_of(
        &mut self,
        conn: ConnectionId,
        consumer_id: u64,
        end: &str,
    ) -> bool {
        let Some(r) = self
            .conns
            .get_mut(&conn)
            .and_then(|c| c.consumers.remove(&consumer_id))
        else {
            return false;
        };
        let one = BTreeMap::from([(consumer_id, r)]);
        self.drop_consumer(conn, &one, consumer_id, end, Leave::Disconnect);
        true
    }

    /// Removes consumer `consumer_id` of `conn` (found in `refs`) from its
    /// subscription's dispatcher (`how`: with every consumer of `conn` on
    /// it when the connection closed), records its permit ledger and
    /// dispatches what it left to the others.
    fn drop_consumer(
        &mut self,
        conn: ConnectionId,
        refs: &BTreeMap<u64, ConsumerRef>,
        consumer_id: u64,
        end: &str,
        how: Leave,
    ) {
        let Some(r) = refs.get(&consumer_id) else {
            return;
        };
        let key = ConsumerKey {
            connection_id: conn,
            consumer_id,
        };
        let Some(sub) = self
            .topics
            .get_mut(&r.topic)
            .and_then(|t| t.subscriptions.get_mut(&r.subscription))
        else {
            // No dispatcher holds it: the frame or the connection's close
            // is received and removes no one.
            match how {
                Leave::Close => crate::trace::permits::broker_recv_close((conn, consumer_id)),
                Leave::Connection => {
                    crate::trace::permits::broker_remove((conn, consumer_id), "connection");
                }
                Leave::Disconnect => {}
            }
            return;
        };
        let active_before = sub.active_consumer();
        let removed = sub.leave(key, how);
        self.end_incarnations(&r.topic, &r.subscription, active_before, removed, end);
    }

    /// Ends the incarnations `removed` (already out of the dispatcher of
    /// `subscription` of `topic`, whose active consumer was
    /// `active_before`): detached, their permit ledgers recorded (end
    /// `end`), and what they left dispatched to the others.
    pub(super) fn end_incarnations(
        &mut self,
        topic: &str,
        subscription: &str,
        active_before: Option<ConsumerKey>,
        removed: Vec<RemovedConsumer>,
        end: &str,
    ) {
        let Some(t) = self.topics.get_mut(topic) else {
            return;
        };
        let Some(sub) = t.subscriptions.get_mut(subscription) else {
            return;
        };
        let detached: Vec<(SubConsumer, RemovedConsumer)> = removed
            .into_iter()
            .filter_map(|r| Some((sub.detach(&r)?, r)))
            .collect();
        if !detached.is_empty() {
            sub.after_consumers_changed(active_before, None, &mut self.out);
            for (c, r) in &detached {
                tracing::info!(
                    conn = c.conn,
                    key = ?c.key,
                    incarnation = c.incarnation,
                    granted = c.granted,
                    debited = c.debited,
                    available = r.permits,
                    end,
                    "consumer removed"
                );
                let record = c.record(&t.name, subscription, end, (r.permits, r.unacked));
                self.out.queue.push_back(Output::Incarnation(record));
            }
            if !sub.consumers.is_empty() {
                sub.dispatch(&t.ml, &mut self.out);
            }
        }
        self.drop_idle_non_durable(topic, subscription);
    }
}
