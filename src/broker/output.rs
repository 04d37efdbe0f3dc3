//! The core's outputs: frames per connection, connection closes, the
//! permit-ledger records of consumer incarnations and the cursor reads
//! issued (whose completions the driver delivers), queued in order and
//! taken with [`super::Broker::poll_output`]; plus the per-connection
//! outbound byte count that decides writability.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use prost::Message;

use super::ConnectionId;
use crate::proto::command::BrokerCommand;

/// One output of the core, in the order it was produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A frame for connection `conn`.
    Frame {
        /// The connection.
        conn: ConnectionId,
        /// The frame.
        frame: OutFrame,
    },
    /// The core closed connection `conn` (a malformed command or a protocol
    /// violation); the adapter closes its socket.
    Close {
        /// The connection.
        conn: ConnectionId,
        /// Why.
        reason: String,
    },
    /// A consumer incarnation subscribed or ended: one permit-ledger record.
    Incarnation(IncarnationRecord),
    /// A subscription issued cursor read `read` (`dispatch.rs`): the
    /// driver delivers its completion with
    /// [`super::Broker::complete_read`], right away (`serve`) or after a
    /// latency (the simulator), and other inputs may come first.
    ReadIssued {
        /// The read.
        read: ReadId,
    },
}

/// A cursor read the core issued and waits to see completed, unique per
/// [`super::Broker`] value (a driver drops the completions of a core it
/// replaced, as it drops every other input meant for it).
pub type ReadId = u64;

/// One frame as the core produced it: the encoded `BaseCommand` and the
/// payload that follows it (a MESSAGE's entry; empty otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutFrame {
    /// The encoded `BaseCommand` (protoc's bytes).
    pub command: Vec<u8>,
    /// The bytes after the command (Pulsar's headers and payload).
    pub payload: Vec<u8>,
}

impl OutFrame {
    pub(crate) fn new(cmd: &BrokerCommand, payload: Vec<u8>) -> Self {
        Self {
            command: cmd.encode_to_vec(),
            payload,
        }
    }

    /// Bytes on the wire: `[total_size][command_size][command][payload]`.
    pub fn wire_len(&self) -> usize {
        8 + self.command.len() + self.payload.len()
    }

    /// The frame as written on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let total = 4 + self.command.len() + self.payload.len();
        let mut buf = Vec::with_capacity(4 + total);
        buf.extend_from_slice(&(total as u32).to_be_bytes());
        buf.extend_from_slice(&(self.command.len() as u32).to_be_bytes());
        buf.extend_from_slice(&self.command);
        buf.extend_from_slice(&self.payload);
        buf
    }

    /// The command, decoded again (for tests and recorders).
    ///
    /// # Errors
    /// prost's error for bytes that do not decode (never for a frame the
    /// core produced).
    pub fn decode_command(&self) -> Result<BrokerCommand, prost::DecodeError> {
        BrokerCommand::decode(self.command.as_slice())
    }
}

/// The permit ledger of one consumer incarnation (PIP-491 accounting, as
/// the broker saw it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncarnationRecord {
    /// Unique per subscribe across connections (1, 2, … per core).
    pub incarnation: u64,
    /// The connection.
    pub connection_id: u64,
    /// The consumer id on it.
    pub consumer_id: u64,
    /// Topic name.
    pub topic: String,
    /// Subscription name.
    pub subscription: String,
    /// Σ Flow permits received.
    pub granted: u64,
    /// Σ `message_permits` of the MESSAGE commands sent.
    pub debited: u64,
    /// Available permits now.
    pub available: i64,
    /// Lowest available balance observed.
    pub min_available: i64,
    /// MESSAGE commands sent.
    pub commands: u64,
    /// Unacknowledged messages now.
    pub unacked: i64,
    /// `subscribed`, `closed`, `disconnected`, or the caller's label of a
    /// snapshot.
    pub end: String,
}

/// The output queue and each connection's outbound bytes not yet reported
/// written ([`super::Broker::handle_written`]): dispatch sends a connection
/// no MESSAGE while its count is at or above the high watermark (Pulsar's
/// `Consumer.isWritable`).
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    pub(crate) queue: VecDeque<Output>,
    pub(crate) outbound: BTreeMap<ConnectionId, usize>,
    pub(crate) high_watermark: usize,
    /// Connections whose client understands `ACTIVE_CONSUMER_CHANGE`
    /// (protocol version 12 or later).
    pub(crate) active_listeners: BTreeSet<ConnectionId>,
    /// Per connection, the frames queued and not yet reported written or
    /// failed, in order: (bytes left, the MESSAGE it carries if any).
    pub(crate) writes: BTreeMap<ConnectionId, VecDeque<(usize, Option<SentMessage>)>>,
    /// The last [`ReadId`] issued.
    pub(crate) last_read: ReadId,
    /// Read completions that matched no read in flight (the read was
    /// dropped by a seek, a rewind or an unsubscribe; `dispatch.rs`).
    pub(crate) stale_reads: u64,
    /// How many outputs at the front of `queue` their turn's durable
    /// commit covers (`turn_commit.rs`); the rest wait for the next one.
    pub(crate) durable: usize,
}

/// The delivery a queued MESSAGE frame carries (to settle a failed write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SentMessage {
    pub(crate) consumer: crate::permits::broker::ConsumerKey,
    pub(crate) incarnation: u64,
    pub(crate) position: crate::Position,
    /// The id its subscription's dispatcher issued for the write
    /// (`SharedDispatcher::on_write_complete`).
    pub(crate) write_id: u64,
}

impl Outbox {
    pub(crate) fn frame(&mut self, conn: ConnectionId, cmd: &BrokerCommand, payload: Vec<u8>) {
        self.push(conn, OutFrame::new(cmd, payload), None);
    }

    /// A MESSAGE frame carrying `sent`.
    pub(crate) fn message_frame(
        &mut self,
        conn: ConnectionId,
        cmd: &BrokerCommand,
        payload: Vec<u8>,
        sent: SentMessage,
    ) {
        self.push(conn, OutFrame::new(cmd, payload), Some(sent));
    }

    fn push(&mut self, conn: ConnectionId, frame: OutFrame, sent: Option<SentMessage>) {
        if let Some(b) = self.outbound.get_mut(&conn) {
            *b += frame.wire_len();
            self.writes
                .entry(conn)
                .or_default()
                .push_back((frame.wire_len(), sent));
        }
        self.queue.push_back(Output::Frame { conn, frame });
    }

    /// The next `bytes` bytes queued for `conn` completed (written or
    /// failed): the MESSAGE deliveries of the frames they finish, in order.
    pub(crate) fn completed(&mut self, conn: ConnectionId, mut bytes: usize) -> Vec<SentMessage> {
        let mut done = Vec::new();
        let Some(q) = self.writes.get_mut(&conn) else {
            return done;
        };
        while bytes > 0 {
            let Some(front) = q.front_mut() else { break };
            let n = bytes.min(front.0);
            front.0 -= n;
            bytes -= n;
            if front.0 == 0 {
                if let Some((_, Some(m))) = q.pop_front() {
                    done.push(m);
                }
            }
        }
        done
    }

    /// Issues a cursor read: a new [`ReadId`], announced as
    /// [`Output::ReadIssued`].
    pub(crate) fn issue_read(&mut self) -> ReadId {
        self.last_read += 1;
        let read = self.last_read;
        self.queue.push_back(Output::ReadIssued { read });
        read
    }

    pub(crate) fn is_writable(&self, conn: ConnectionId) -> bool {
        self.outbound
            .get(&conn)
            .is_some_and(|b| *b < self.high_watermark)
    }
}
