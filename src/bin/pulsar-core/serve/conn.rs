//! One client connection: frame decoding with a size bound, the command
//! handlers, and the writer shared with dispatch.
//!
//! A frame larger than [`MAX_FRAME_SIZE`], a frame whose sizes disagree, a
//! command that does not decode or lacks a required field closes this
//! connection with a logged reason (the process keeps serving others).
//! Commands the server does not implement get a `CommandError` naming their
//! request id (`UnsupportedVersionError`), never a silent drop.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex};
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

/// Outbound bytes queued on a connection above which dispatch sends it no
/// more MESSAGE frames (its consumers count as having no permits until the
/// writer drains the queue; Pulsar's `Consumer.isWritable`).
pub const OUTBOUND_HIGH_WATERMARK: usize = 4 * 1024 * 1024;
/// Outbound bytes above which the connection is closed: only a peer that
/// keeps sending commands while not reading the replies gets there (dispatch
/// stops at [`OUTBOUND_HIGH_WATERMARK`], one frame past it at most).
pub const OUTBOUND_LIMIT: usize = OUTBOUND_HIGH_WATERMARK + 2 * MAX_FRAME_SIZE;
/// Bytes read from the socket per `read` call.
const READ_CHUNK: usize = 64 * 1024;

/// Why a connection was closed by the server.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// Socket failure or end of stream.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A frame above the bound.
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME_SIZE} bytes")]
    FrameTooLarge(u64),
    /// Sizes that disagree, or a stream that ends inside a frame.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// A command before CONNECT, or a second CONNECT.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// No CONNECT, or no command at all (not even the PONG to the server's
    /// PING), within two keep-alive intervals (Pulsar's `keepAliveIntervalSeconds`).
    #[error("keep-alive timeout: {0}")]
    KeepAlive(String),
    /// The peer does not read what the server writes.
    #[error("outbound queue above {OUTBOUND_LIMIT} bytes: the client does not read its socket")]
    NotReading,
}

/// Frames waiting for the connection's writer thread.
#[derive(Default)]
struct Outbound {
    frames: VecDeque<Vec<u8>>,
    /// Bytes queued or being written.
    bytes: usize,
    /// Set when the connection is closed or the socket failed.
    closed: bool,
    /// The hard limit was crossed.
    overflowed: bool,
}

/// The write half of a connection, shared with dispatch. [`send`](Self::send)
/// only queues the frame (never blocks on the socket), so a peer that stops
/// reading stalls nothing but its own connection; the connection's writer
/// thread writes the queue in order.
pub struct ConnWriter {
    /// Broker-side connection id.
    pub id: u64,
    out: Mutex<Outbound>,
    ready: Condvar,
    /// A handle to the socket for `shutdown` (unblocks both halves).
    socket: TcpStream,
    recorder: Option<Arc<Recorder>>,
}

impl ConnWriter {
    /// Queues one frame `[total][cmd size][cmd][payload]`; an error when the
    /// connection is closed or its queue is above [`OUTBOUND_LIMIT`] (which
    /// closes it).
    pub fn send(&self, cmd: &ServeCommand, payload: &[u8]) -> std::io::Result<()> {
        let body = cmd.encode_to_vec();
        let total = 4 + body.len() + payload.len();
        let mut buf = Vec::with_capacity(4 + total);
        buf.extend_from_slice(&(total as u32).to_be_bytes());
        buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
        buf.extend_from_slice(&body);
        buf.extend_from_slice(payload);
        let mut out = lock(&self.out);
        if out.closed {
            return Err(std::io::Error::new(
                ErrorKind::NotConnected,
                "connection closed",
            ));
        }
        if out.bytes + buf.len() > OUTBOUND_LIMIT {
            out.overflowed = true;
            drop(out);
            self.close();
            return Err(std::io::Error::other(ConnError::NotReading.to_string()));
        }
        // Recorded under the queue lock: the recording's order is the wire's.
        if let Some(r) = &self.recorder {
            r.record("out", self.id, &body, payload.len());
        }
        out.bytes += buf.len();
        out.frames.push_back(buf);
        self.ready.notify_one();
        Ok(())
    }

    /// Whether dispatch may queue MESSAGE frames (below the high watermark).
    pub fn is_writable(&self) -> bool {
        let out = lock(&self.out);
        !out.closed && out.bytes < OUTBOUND_HIGH_WATERMARK
    }

    fn overflowed(&self) -> bool {
        lock(&self.out).overflowed
    }

    fn close(&self) {
        lock(&self.out).closed = true;
        self.ready.notify_all();
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }

    /// The writer thread: writes queued frames in order until the
    /// connection closes or a write fails.
    fn write_queue(&self, mut stream: TcpStream) {
        loop {
            let batch: Vec<Vec<u8>> = {
                let mut out = lock(&self.out);
                while out.frames.is_empty() && !out.closed {
                    out = self.ready.wait(out).unwrap_or_else(|p| p.into_inner());
                }
                if out.closed {
                    return;
                }
                out.frames.drain(..).collect()
            };
            for frame in batch {
                if let Err(e) = stream.write_all(&frame) {
                    tracing::debug!(conn = self.id, error = %e, "write failed");
                    self.close();
                    return;
                }
                let mut out = lock(&self.out);
                out.bytes = out.bytes.saturating_sub(frame.len());
            }
        }
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

/// Serves one connection until it ends; returns why it ended. Two
/// threads: this one reads and handles commands, a second one writes the
/// connection's outbound queue. Every `keep_alive` without a command the
/// server sends PING; a second interval without one (or without CONNECT)
/// closes the connection.
pub fn serve_connection(
    broker: Arc<Broker>,
    stream: TcpStream,
    id: u64,
    advertised: String,
    recorder: Option<Arc<Recorder>>,
    keep_alive: Duration,
) -> ConnError {
    let _ = stream.set_nodelay(true);
    if let Err(e) = stream.set_read_timeout(Some(keep_alive)) {
        return ConnError::Io(e);
    }
    let (write_half, socket) = match (stream.try_clone(), stream.try_clone()) {
        (Ok(w), Ok(s)) => (w, s),
        (Err(e), _) | (_, Err(e)) => return ConnError::Io(e),
    };
    let writer = Arc::new(ConnWriter {
        id,
        out: Mutex::new(Outbound::default()),
        ready: Condvar::new(),
        socket,
        recorder: recorder.clone(),
    });
    let writer_thread = {
        let writer = Arc::clone(&writer);
        std::thread::Builder::new()
            .name(format!("conn-{id}-write"))
            .spawn(move || writer.write_queue(write_half))
    };
    let writer_thread = match writer_thread {
        Ok(t) => t,
        Err(e) => return ConnError::Io(e),
    };
    let mut conn = Conn {
        broker,
        writer: Arc::clone(&writer),
        advertised,
        connected: false,
        consumers: HashMap::new(),
        producers: HashMap::new(),
        recorder,
    };
    let mut err = conn.read_loop(stream, keep_alive);
    if writer.overflowed() {
        err = ConnError::NotReading;
    }
    conn.cleanup();
    writer.close();
    let _ = writer_thread.join();
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
    /// Reads frames as their bytes arrive (a declared size allocates
    /// nothing up front: memory follows the bytes received, one frame at
    /// most) and handles each; returns why the connection ends.
    fn read_loop(&mut self, mut stream: TcpStream, keep_alive: Duration) -> ConnError {
        let mut pending: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; READ_CHUNK];
        let mut awaiting_pong = false;
        loop {
            // Handle every whole frame in `pending`.
            while pending.len() >= 4 {
                let total = u32::from_be_bytes([pending[0], pending[1], pending[2], pending[3]]);
                let total = u64::from(total);
                if total as usize > MAX_FRAME_SIZE {
                    return ConnError::FrameTooLarge(total);
                }
                if total < 4 {
                    return ConnError::Malformed(format!("total_size {total} below 4"));
                }
                let end = 4 + total as usize;
                if pending.len() < end {
                    break;
                }
                let frame: Vec<u8> = pending.drain(..end).skip(4).collect();
                if let Err(e) = self.frame(&frame, total) {
                    return e;
                }
            }
            let want = if pending.len() >= 4 {
                let total = u32::from_be_bytes([pending[0], pending[1], pending[2], pending[3]]);
                4 + total as usize - pending.len()
            } else {
                4 - pending.len()
            };
            let n = want.clamp(1, READ_CHUNK);
            match stream.read(&mut chunk[..n]) {
                Ok(0) if pending.is_empty() => {
                    return ConnError::Io(std::io::Error::from(ErrorKind::UnexpectedEof))
                }
                Ok(0) => {
                    return ConnError::Malformed(format!(
                        "the stream ended inside a frame ({} bytes of it received)",
                        pending.len()
                    ))
                }
                Ok(n) => {
                    pending.extend_from_slice(&chunk[..n]);
                    awaiting_pong = false;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if !self.connected {
                        return ConnError::KeepAlive(format!(
                            "no CONNECT within {} s",
                            keep_alive.as_secs_f64()
                        ));
                    }
                    if awaiting_pong {
                        return ConnError::KeepAlive(format!(
                            "no command (PONG) within {} s of the server's PING",
                            keep_alive.as_secs_f64()
                        ));
                    }
                    awaiting_pong = true;
                    if let Err(e) = self.reply(ServeCommand {
                        r#type: ty::PING,
                        ping: Some(proto::Empty {}),
                        ..Default::default()
                    }) {
                        return e;
                    }
                }
                Err(e) => return ConnError::Io(e),
            }
        }
    }

    /// One frame without its `total_size`: `[cmd size][cmd][payload]`.
    fn frame(&mut self, frame: &[u8], total: u64) -> Result<(), ConnError> {
        let cmd_size = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as u64;
        if cmd_size + 4 > total {
            return Err(ConnError::Malformed(format!(
                "command_size {cmd_size} exceeds total_size {total}"
            )));
        }
        let cmd_bytes = &frame[4..4 + cmd_size as usize];
        let payload = &frame[4 + cmd_size as usize..];
        if let Some(r) = &self.recorder {
            r.record("in", self.writer.id, cmd_bytes, payload.len());
        }
        let cmd = ServeCommand::decode(cmd_bytes)
            .map_err(|e| ConnError::Malformed(format!("BaseCommand: {e}")))?;
        self.handle(cmd, cmd_bytes, payload)
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
                if let Some(existing) = self.producers.get(&p.producer_id) {
                    // Pulsar's ServerCnx: a producer id already open on this
                    // connection answers success with that producer's name
                    // and keeps it (on its topic).
                    let producer_name = existing.name.clone();
                    return self.reply(ServeCommand {
                        r#type: ty::PRODUCER_SUCCESS,
                        producer_success: Some(proto::CommandProducerSuccess {
                            request_id: p.request_id,
                            producer_name,
                            last_sequence_id: Some(-1),
                        }),
                        ..Default::default()
                    });
                }
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
                    Some(_) if a.message_id.iter().any(|m| position_of(m).is_none()) => Err(
                        "ack of a message id whose ledger_id or entry_id is above i64::MAX".into(),
                    ),
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
                    let positions: Vec<Position> =
                        r.message_ids.iter().filter_map(position_of).collect();
                    if positions.len() != r.message_ids.len() {
                        tracing::warn!(
                            conn = self.writer.id,
                            "redeliver: message ids above i64::MAX ignored"
                        );
                        if positions.is_empty() {
                            // Never "redeliver everything" for ids that were all invalid.
                            return Ok(());
                        }
                    }
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
        if s.subscription.len() > super::broker::MAX_NAME_BYTES {
            return self.error(
                s.request_id,
                server_error::NOT_ALLOWED_ERROR,
                format!(
                    "subscription name {} is above {} bytes",
                    super::broker::name_for_error(&s.subscription),
                    super::broker::MAX_NAME_BYTES
                ),
            );
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

/// The position of a message id; `None` when its ledger_id or entry_id is
/// above `i64::MAX` (no entry is there: positions are signed).
fn position_of(m: &MessageIdData) -> Option<Position> {
    Some(Position::new(
        i64::try_from(m.ledger_id).ok()?,
        i64::try_from(m.entry_id).ok()?,
    ))
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
