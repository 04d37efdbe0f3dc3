//! One client connection: frame decoding with a size bound, the command
//! handlers, and the writer shared with dispatch.
//!
//! A frame larger than [`MAX_FRAME_SIZE`], a frame whose sizes disagree, a
//! command that does not decode or lacks a required field closes this
//! connection with a logged reason (the process keeps serving others).
//! Commands the server does not implement get a `CommandError` naming their
//! request id (`UnsupportedVersionError`), never a silent drop.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use pulsar_core::ledger::ManagedLedger;
use pulsar_core::permits::broker::ConsumerKey;
use pulsar_core::permits::frame::{parse_entry_payload, DEFAULT_MAX_FRAME_SIZE};
use pulsar_core::permits::wire::MessageIdData;
use pulsar_core::Position;

use super::broker::{entry_info, lock, Broker, BrokerError, Subscription, Topic};
use super::proto::{self, server_error, ty, ServeCommand};
use super::record::Recorder;

/// Largest frame accepted (`maxMessageSize` 5 MiB + 10 KiB padding).
pub const MAX_FRAME_SIZE: usize = DEFAULT_MAX_FRAME_SIZE;
/// Advertised `max_message_size`.
const MAX_MESSAGE_SIZE: i32 = 5 * 1024 * 1024;
/// Protocol version the server speaks (v19: up to transactions' TC connect).
const PROTOCOL_VERSION: i32 = 19;

/// Why a connection was closed by the server.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// Socket failure or end of stream.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A frame above the bound.
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME_SIZE} bytes")]
    FrameTooLarge(u64),
    /// Sizes that disagree.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// A command before CONNECT, or a second CONNECT.
    #[error("protocol violation: {0}")]
    Protocol(String),
}

/// The write half of a connection, shared with dispatch.
pub struct ConnWriter {
    /// Broker-side connection id.
    pub id: u64,
    stream: Mutex<TcpStream>,
    closed: AtomicBool,
    recorder: Option<Arc<Recorder>>,
}

impl ConnWriter {
    /// Writes one frame `[total][cmd size][cmd][payload]`.
    pub fn send(&self, cmd: &ServeCommand, payload: &[u8]) -> std::io::Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(std::io::Error::new(
                ErrorKind::NotConnected,
                "connection closed",
            ));
        }
        let body = cmd.encode_to_vec();
        if let Some(r) = &self.recorder {
            r.record("out", self.id, &body, payload.len());
        }
        let total = 4 + body.len() + payload.len();
        let mut buf = Vec::with_capacity(4 + total);
        buf.extend_from_slice(&(total as u32).to_be_bytes());
        buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
        buf.extend_from_slice(&body);
        buf.extend_from_slice(payload);
        let mut s = lock(&self.stream);
        let r = s.write_all(&buf);
        if r.is_err() {
            self.closed.store(true, Ordering::Release);
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        r
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = lock(&self.stream).shutdown(std::net::Shutdown::Both);
    }
}

struct ConsumerRef {
    topic: Arc<Topic>,
    sub: Arc<Mutex<Subscription>>,
}

struct ProducerRef {
    topic: Arc<Topic>,
    name: String,
}

/// Serves one connection until it ends; returns why it ended.
pub fn serve_connection(
    broker: Arc<Broker>,
    stream: TcpStream,
    id: u64,
    advertised: String,
    recorder: Option<Arc<Recorder>>,
) -> ConnError {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(30)));
    let write_half = match stream.try_clone() {
        Ok(s) => s,
        Err(e) => return ConnError::Io(e),
    };
    let writer = Arc::new(ConnWriter {
        id,
        stream: Mutex::new(write_half),
        closed: AtomicBool::new(false),
        recorder: recorder.clone(),
    });
    let mut conn = Conn {
        broker,
        writer: Arc::clone(&writer),
        advertised,
        connected: false,
        consumers: HashMap::new(),
        producers: HashMap::new(),
        recorder,
    };
    let err = conn.read_loop(stream);
    conn.cleanup();
    writer.close();
    err
}

struct Conn {
    broker: Arc<Broker>,
    writer: Arc<ConnWriter>,
    advertised: String,
    connected: bool,
    consumers: HashMap<u64, ConsumerRef>,
    producers: HashMap<u64, ProducerRef>,
    recorder: Option<Arc<Recorder>>,
}

impl Conn {
    fn read_loop(&mut self, mut stream: TcpStream) -> ConnError {
        let mut size = [0u8; 4];
        loop {
            if let Err(e) = stream.read_exact(&mut size) {
                return ConnError::Io(e);
            }
            let total = u32::from_be_bytes(size) as u64;
            if total as usize > MAX_FRAME_SIZE {
                return ConnError::FrameTooLarge(total);
            }
            if total < 4 {
                return ConnError::Malformed(format!("total_size {total} below 4"));
            }
            let mut frame = vec![0u8; total as usize];
            if let Err(e) = stream.read_exact(&mut frame) {
                return ConnError::Io(e);
            }
            let cmd_size = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as u64;
            if cmd_size + 4 > total {
                return ConnError::Malformed(format!(
                    "command_size {cmd_size} exceeds total_size {total}"
                ));
            }
            let cmd_bytes = &frame[4..4 + cmd_size as usize];
            let payload = &frame[4 + cmd_size as usize..];
            if let Some(r) = &self.recorder {
                r.record("in", self.writer.id, cmd_bytes, payload.len());
            }
            let cmd = match ServeCommand::decode(cmd_bytes) {
                Ok(c) => c,
                Err(e) => return ConnError::Malformed(format!("BaseCommand: {e}")),
            };
            if let Err(e) = self.handle(cmd, cmd_bytes, payload) {
                return e;
            }
        }
    }

    fn reply(&self, cmd: ServeCommand) -> Result<(), ConnError> {
        self.writer.send(&cmd, &[]).map_err(ConnError::Io)
    }

    fn error(&self, request_id: u64, error: i32, message: String) -> Result<(), ConnError> {
        tracing::info!(conn = self.writer.id, request_id, error, %message, "CommandError");
        self.reply(ServeCommand {
            r#type: ty::ERROR,
            error: Some(proto::CommandError {
                request_id,
                error,
                message,
            }),
            ..Default::default()
        })
    }

    fn require(&self, raw: &[u8], ty: i32, fields: &[u32]) -> Result<(), ConnError> {
        proto::has_required(raw, ty as u32, fields).map_err(ConnError::Malformed)
    }

    fn handle(&mut self, cmd: ServeCommand, raw: &[u8], payload: &[u8]) -> Result<(), ConnError> {
        tracing::debug!(conn = self.writer.id, ty = cmd.r#type, "command");
        if !proto::is_command_type(cmd.r#type) {
            return Err(ConnError::Malformed(format!(
                "command type {} is not a BaseCommand.Type value",
                cmd.r#type
            )));
        }
        if !self.connected && cmd.r#type != ty::CONNECT {
            return Err(ConnError::Protocol(format!(
                "command type {} before CONNECT",
                cmd.r#type
            )));
        }
        if !payload.is_empty() && cmd.r#type != ty::SEND {
            return Err(ConnError::Malformed(format!(
                "command type {} carries a payload",
                cmd.r#type
            )));
        }
        match cmd.r#type {
            ty::CONNECT => {
                if self.connected {
                    return Err(ConnError::Protocol("second CONNECT".into()));
                }
                self.require(raw, ty::CONNECT, &[1])?;
                let c = cmd.connect.unwrap_or_default();
                tracing::info!(conn = self.writer.id, client = %c.client_version, protocol = ?c.protocol_version, "connected");
                self.connected = true;
                let pv = c.protocol_version.unwrap_or(0).min(PROTOCOL_VERSION);
                self.reply(ServeCommand {
                    r#type: ty::CONNECTED,
                    connected: Some(proto::CommandConnected {
                        server_version: format!("pulsar-core {}", env!("CARGO_PKG_VERSION")),
                        protocol_version: Some(pv),
                        max_message_size: Some(MAX_MESSAGE_SIZE),
                    }),
                    ..Default::default()
                })
            }
            ty::PING => self.reply(ServeCommand {
                r#type: ty::PONG,
                pong: Some(proto::Empty {}),
                ..Default::default()
            }),
            ty::PONG => Ok(()),
            ty::PARTITIONED_METADATA => {
                self.require(raw, ty::PARTITIONED_METADATA, &[1, 2])?;
                let m = cmd.partition_metadata.unwrap_or_default();
                let resp = match self.broker.topic(&m.topic) {
                    Ok(_) => proto::CommandPartitionedTopicMetadataResponse {
                        partitions: Some(0),
                        request_id: m.request_id,
                        response: Some(0),
                        error: None,
                        message: None,
                    },
                    Err(e) => proto::CommandPartitionedTopicMetadataResponse {
                        partitions: None,
                        request_id: m.request_id,
                        response: Some(1),
                        error: Some(e.server_error()),
                        message: Some(e.to_string()),
                    },
                };
                self.reply(ServeCommand {
                    r#type: ty::PARTITIONED_METADATA_RESPONSE,
                    partition_metadata_response: Some(resp),
                    ..Default::default()
                })
            }
            ty::LOOKUP => {
                self.require(raw, ty::LOOKUP, &[1, 2])?;
                let m = cmd.lookup_topic.unwrap_or_default();
                let resp = match self.broker.topic(&m.topic) {
                    Ok(_) => proto::CommandLookupTopicResponse {
                        broker_service_url: Some(self.advertised.clone()),
                        response: Some(1),
                        request_id: m.request_id,
                        authoritative: Some(true),
                        error: None,
                        message: None,
                    },
                    Err(e) => proto::CommandLookupTopicResponse {
                        broker_service_url: None,
                        response: Some(2),
                        request_id: m.request_id,
                        authoritative: None,
                        error: Some(e.server_error()),
                        message: Some(e.to_string()),
                    },
                };
                self.reply(ServeCommand {
                    r#type: ty::LOOKUP_RESPONSE,
                    lookup_topic_response: Some(resp),
                    ..Default::default()
                })
            }
            ty::PRODUCER => {
                self.require(raw, ty::PRODUCER, &[1, 2, 3])?;
                let p = cmd.producer.unwrap_or_default();
                match self.broker.topic(&p.topic) {
                    Ok(topic) => {
                        let name = p
                            .producer_name
                            .filter(|n| !n.is_empty())
                            .unwrap_or_else(|| {
                                format!("serve-{}-{}", self.writer.id, p.producer_id)
                            });
                        tracing::info!(conn = self.writer.id, topic = %topic.name, producer = %name, "producer");
                        self.producers.insert(
                            p.producer_id,
                            ProducerRef {
                                topic,
                                name: name.clone(),
                            },
                        );
                        self.reply(ServeCommand {
                            r#type: ty::PRODUCER_SUCCESS,
                            producer_success: Some(proto::CommandProducerSuccess {
                                request_id: p.request_id,
                                producer_name: name,
                                last_sequence_id: Some(-1),
                            }),
                            ..Default::default()
                        })
                    }
                    Err(e) => self.error(p.request_id, e.server_error(), e.to_string()),
                }
            }
            ty::SEND => {
                self.require(raw, ty::SEND, &[1, 2])?;
                let s = cmd.send.unwrap_or_default();
                self.handle_send(s, payload)
            }
            ty::CLOSE_PRODUCER => {
                self.require(raw, ty::CLOSE_PRODUCER, &[1, 2])?;
                let c = cmd.close_producer.unwrap_or_default();
                if let Some(p) = self.producers.remove(&c.id) {
                    tracing::info!(conn = self.writer.id, producer = %p.name, "producer closed");
                }
                self.success(c.request_id)
            }
            ty::SUBSCRIBE => {
                self.require(raw, ty::SUBSCRIBE, &[1, 2, 3, 4, 5])?;
                let s = cmd.subscribe.unwrap_or_default();
                self.handle_subscribe(s)
            }
            ty::FLOW => {
                self.require(raw, ty::FLOW, &[1, 2])?;
                let f = cmd.flow.unwrap_or_default();
                let Some(c) = self.consumers.get(&f.consumer_id) else {
                    tracing::warn!(
                        conn = self.writer.id,
                        consumer_id = f.consumer_id,
                        "Flow for an unknown consumer ignored"
                    );
                    return Ok(());
                };
                let key = self.key(f.consumer_id);
                let mut sub = lock(&c.sub);
                if let Err(e) = sub.flow(&c.topic.ml, key, f.message_permits) {
                    tracing::warn!(conn = self.writer.id, error = %e, "Flow rejected");
                }
                Ok(())
            }
            ty::ACK => {
                self.require(raw, ty::ACK, &[1, 2])?;
                let a = cmd.ack.unwrap_or_default();
                let result = match self.consumers.get(&a.consumer_id) {
                    None => Err(format!("ack for unknown consumer {}", a.consumer_id)),
                    Some(c) => lock(&c.sub).ack(&c.topic.ml, a.ack_type == 1, &a.message_id),
                };
                if let Err(e) = &result {
                    tracing::warn!(conn = self.writer.id, error = %e, "ack failed");
                }
                if let Some(request_id) = a.request_id {
                    let (error, message) = match result {
                        Ok(()) => (None, None),
                        Err(e) => (Some(server_error::UNKNOWN_ERROR), Some(e)),
                    };
                    self.reply(ServeCommand {
                        r#type: ty::ACK_RESPONSE,
                        ack_response: Some(proto::CommandAckResponse {
                            consumer_id: a.consumer_id,
                            error,
                            message,
                            request_id: Some(request_id),
                        }),
                        ..Default::default()
                    })?;
                }
                Ok(())
            }
            ty::REDELIVER_UNACKNOWLEDGED_MESSAGES => {
                self.require(raw, ty::REDELIVER_UNACKNOWLEDGED_MESSAGES, &[1])?;
                let r = cmd.redeliver_unacknowledged_messages.unwrap_or_default();
                if let Some(c) = self.consumers.get(&r.consumer_id) {
                    let key = self.key(r.consumer_id);
                    let positions: Vec<Position> = r
                        .message_ids
                        .iter()
                        .map(|m| Position::new(m.ledger_id as i64, m.entry_id as i64))
                        .collect();
                    lock(&c.sub).redeliver(&c.topic.ml, key, &positions, r.consumer_epoch);
                }
                Ok(())
            }
            ty::CLOSE_CONSUMER => {
                self.require(raw, ty::CLOSE_CONSUMER, &[1, 2])?;
                let c = cmd.close_consumer.unwrap_or_default();
                self.drop_consumer(c.id, "closed");
                self.success(c.request_id)
            }
            ty::UNSUBSCRIBE => {
                self.require(raw, ty::UNSUBSCRIBE, &[1, 2])?;
                let u = cmd.unsubscribe.unwrap_or_default();
                self.error(
                    u.request_id,
                    server_error::UNSUPPORTED_VERSION_ERROR,
                    "unsubscribe is not supported by pulsar-core serve".into(),
                )
            }
            ty::GET_LAST_MESSAGE_ID => {
                self.require(raw, ty::GET_LAST_MESSAGE_ID, &[1, 2])?;
                let g = cmd.get_last_message_id.unwrap_or_default();
                let Some(c) = self.consumers.get(&g.id) else {
                    return self.error(
                        g.request_id,
                        server_error::CONSUMER_NOT_FOUND,
                        format!("consumer {} not found", g.id),
                    );
                };
                let last = c.topic.ml.last_confirmed_entry();
                let md = lock(&c.sub).mark_delete();
                let id = |p: Position| MessageIdData {
                    ledger_id: p.ledger_id.max(0) as u64,
                    entry_id: p.entry_id as u64,
                    partition: Some(-1),
                    ..Default::default()
                };
                // (L, -1) is "no entry": Pulsar writes entryId as the
                // unsigned form of -1.
                self.reply(ServeCommand {
                    r#type: ty::GET_LAST_MESSAGE_ID_RESPONSE,
                    get_last_message_id_response: Some(proto::CommandGetLastMessageIdResponse {
                        last_message_id: id(last),
                        request_id: g.request_id,
                        consumer_mark_delete_position: Some(id(md)),
                    }),
                    ..Default::default()
                })
            }
            ty::GET_SCHEMA => {
                let request_id = proto::nested_varint(raw, ty::GET_SCHEMA as u32, 1).unwrap_or(0);
                self.reply(ServeCommand {
                    r#type: ty::GET_SCHEMA_RESPONSE,
                    get_schema_response: Some(proto::CommandGetSchemaResponse {
                        request_id,
                        error_code: Some(server_error::TOPIC_NOT_FOUND),
                        error_message: Some("pulsar-core serve keeps no schemas".into()),
                    }),
                    ..Default::default()
                })
            }
            other => {
                let name = format!("command type {other} is not supported by pulsar-core serve");
                match proto::request_id_tag(other)
                    .and_then(|tag| proto::nested_varint(raw, other as u32, tag))
                {
                    Some(request_id) => {
                        self.error(request_id, server_error::UNSUPPORTED_VERSION_ERROR, name)
                    }
                    None => {
                        tracing::warn!(
                            conn = self.writer.id,
                            ty = other,
                            "unsupported command without a request id ignored"
                        );
                        Ok(())
                    }
                }
            }
        }
    }

    fn success(&self, request_id: u64) -> Result<(), ConnError> {
        self.reply(ServeCommand {
            r#type: ty::SUCCESS,
            success: Some(proto::CommandSuccess { request_id }),
            ..Default::default()
        })
    }

    fn key(&self, consumer_id: u64) -> ConsumerKey {
        ConsumerKey {
            connection_id: self.writer.id,
            consumer_id,
        }
    }

    fn send_error(
        &self,
        s: &proto::CommandSend,
        error: i32,
        message: String,
    ) -> Result<(), ConnError> {
        tracing::warn!(conn = self.writer.id, producer_id = s.producer_id, sequence_id = s.sequence_id, %message, "SendError");
        self.reply(ServeCommand {
            r#type: ty::SEND_ERROR,
            send_error: Some(proto::CommandSendError {
                producer_id: s.producer_id,
                sequence_id: s.sequence_id,
                error,
                message,
            }),
            ..Default::default()
        })
    }

    fn handle_send(&mut self, s: proto::CommandSend, payload: &[u8]) -> Result<(), ConnError> {
        let Some(p) = self.producers.get(&s.producer_id) else {
            return self.send_error(
                &s,
                server_error::TOPIC_NOT_FOUND,
                format!("producer {} not found", s.producer_id),
            );
        };
        if s.is_chunk == Some(true) {
            return self.send_error(
                &s,
                server_error::NOT_ALLOWED_ERROR,
                "chunked messages are not supported".into(),
            );
        }
        if s.txnid_most_bits.unwrap_or(0) != 0 || s.txnid_least_bits.unwrap_or(0) != 0 {
            return self.send_error(
                &s,
                server_error::NOT_ALLOWED_ERROR,
                "transactions are not supported".into(),
            );
        }
        if let Err(e) = parse_entry_payload(payload) {
            return self.send_error(
                &s,
                server_error::CHECKSUM_ERROR,
                format!("bad entry payload: {e}"),
            );
        }
        if let Err(e) = entry_info(payload) {
            return self.send_error(
                &s,
                server_error::NOT_ALLOWED_ERROR,
                format!("bad message metadata: {e}"),
            );
        }
        let topic = Arc::clone(&p.topic);
        let pos = match topic.ml.append(payload) {
            Ok(p) => p,
            Err(e) => return self.send_error(&s, server_error::PERSISTENCE_ERROR, e.to_string()),
        };
        self.reply(ServeCommand {
            r#type: ty::SEND_RECEIPT,
            send_receipt: Some(proto::CommandSendReceipt {
                producer_id: s.producer_id,
                sequence_id: s.sequence_id,
                message_id: Some(MessageIdData {
                    ledger_id: pos.ledger_id as u64,
                    entry_id: pos.entry_id as u64,
                    ..Default::default()
                }),
                highest_sequence_id: Some(s.highest_sequence_id.unwrap_or(0)),
            }),
            ..Default::default()
        })?;
        dispatch_topic(&topic.ml, &topic);
        Ok(())
    }

    fn handle_subscribe(&mut self, s: proto::CommandSubscribe) -> Result<(), ConnError> {
        if self.consumers.contains_key(&s.consumer_id) {
            // A re-subscribe of a live consumer id is idempotent in Pulsar.
            return self.success(s.request_id);
        }
        if s.durable == Some(false) {
            return self.error(
                s.request_id,
                server_error::NOT_ALLOWED_ERROR,
                "non-durable subscriptions (readers) are not supported".into(),
            );
        }
        if !(0..=3).contains(&s.sub_type) {
            return self.error(
                s.request_id,
                server_error::NOT_ALLOWED_ERROR,
                format!("unknown subType {}", s.sub_type),
            );
        }
        let topic = match self.broker.topic(&s.topic) {
            Ok(t) => t,
            Err(e) => return self.error(s.request_id, e.server_error(), e.to_string()),
        };
        let key = self.key(s.consumer_id);
        let result = self.broker.subscribe(
            &topic,
            &s.subscription,
            s.sub_type,
            s.initial_position == Some(1),
            key,
            s.consumer_epoch.unwrap_or(0),
            s.consumer_name.clone().unwrap_or_default(),
            s.priority_level.unwrap_or(0),
            Arc::clone(&self.writer),
        );
        match result {
            Ok(sub) => {
                self.consumers
                    .insert(s.consumer_id, ConsumerRef { topic, sub });
                self.success(s.request_id)
            }
            Err(e @ BrokerError::ConsumerBusy(_))
            | Err(e @ BrokerError::InvalidTopic(_))
            | Err(e @ BrokerError::Component(_)) => {
                self.error(s.request_id, e.server_error(), e.to_string())
            }
        }
    }

    fn drop_consumer(&mut self, consumer_id: u64, end: &str) {
        let Some(c) = self.consumers.remove(&consumer_id) else {
            return;
        };
        let key = self.key(consumer_id);
        let mut sub = lock(&c.sub);
        if let Some(removed) = sub.remove_consumer(&c.topic.ml, key) {
            self.broker
                .write_ledger(&c.topic.name, sub.name(), &removed, end);
            tracing::info!(
                conn = self.writer.id,
                ?key,
                incarnation = removed.incarnation,
                granted = removed.granted,
                debited = removed.debited,
                available = removed.permits.available_permits(),
                end,
                "consumer removed"
            );
        }
    }

    fn cleanup(&mut self) {
        let ids: Vec<u64> = self.consumers.keys().copied().collect();
        for id in ids {
            self.drop_consumer(id, "disconnected");
        }
        self.producers.clear();
    }
}

/// Dispatches every subscription of `topic` (after an append).
pub fn dispatch_topic(ml: &ManagedLedger, topic: &Topic) {
    let subs: Vec<_> = lock(&topic.subscriptions).values().cloned().collect();
    for s in subs {
        let mut s = lock(&s);
        if !s.consumers.is_empty() {
            s.dispatch(ml);
        }
    }
}
