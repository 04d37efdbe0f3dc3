//! Chunked messages (PIP-37) over the wire (`faults.chunked_ratio`).
//!
//! A producer sends a drawn fraction of its messages as 2–4 chunks: each
//! chunk is one SEND (`is_chunk = true`) with the message's `uuid`
//! (`{producer name}-{sequence id}`, as Pulsar's producer names it), its
//! `chunk_id`, `num_chunks_from_msg`, `total_chunk_msg_size` and the one
//! `sequence_id` of the message. As Pulsar's `ProducerImpl`, each chunk is
//! its own pending op: a chunk's receipt removes it, the message is
//! receipted (acknowledged to the application) by its last chunk's receipt
//! only, and after a reconnect the chunks without a receipt are resent.
//!
//! The broker stores and dispatches each chunk as one entry; the consumer
//! client reassembles them as Pulsar's `ConsumerImpl.processMessageChunk`
//! does (a context per `uuid`; a first chunk received again starts the
//! context over, acknowledging the old context's chunks when none of them
//! is this chunk (a corrupted chunked message the producer resent); a
//! chunk at or below the last one received is a duplicate, acknowledged
//! when it is a copy at another position; any other chunk out of sequence
//! drops the context, its chunks left unacknowledged for redelivery), and
//! reports ONE delivery of the whole message, identified by its last
//! chunk's message id, to the checker. The application acknowledges a
//! chunked message by acknowledging every chunk's message id.
//!
//! The checker's rules judge the whole message (nothing lost, no
//! duplicates, order); a reassembled message must also be the message its
//! `uuid` names, of its `total_chunk_msg_size` (a broker that drops,
//! reorders or mixes a chunk shows up as a loss or here).

use std::collections::BTreeMap;

use crate::broker::chunking::{publish_metadata, PublishFields};
use crate::permits::client::ReceivedMessage;
use crate::proto::command::{ty, BrokerCommand};
use crate::proto::metadata::{MessageMetadata, SingleMessageMetadata};
use crate::proto::wire::{CommandRedeliverUnacknowledgedMessages, MessageIdData};

use super::Node;

/// What the chunked messages did (the report's node activity).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ChunkActivity {
    /// Messages a producer sent as chunks.
    pub messages_sent: u64,
    /// Chunks sent (first sends).
    pub chunks_sent: u64,
    /// Chunks resent after a reconnect (no receipt).
    pub chunks_resent: u64,
    /// Chunk receipts (the last chunk's included).
    pub chunk_receipts: u64,
    /// Chunked messages a consumer reassembled and delivered.
    pub reassembled: u64,
    /// Chunks a consumer received (every delivery of one).
    pub chunks_received: u64,
    /// Duplicated chunks a consumer skipped (a resent chunk, a redelivery).
    pub duplicate_chunks: u64,
    /// Contexts started over on a first chunk received again.
    pub restarted: u64,
    /// Contexts a chunk out of sequence dropped.
    pub dropped_out_of_sequence: u64,
    /// Negative acks of a dropped context's chunks.
    pub redelivery_requests: u64,
}

/// One chunk of a MESSAGE frame, as its metadata says.
#[derive(Debug, Clone)]
struct ChunkInfo {
    uuid: String,
    chunk_id: u32,
    num_chunks: u32,
    total_size: i32,
}

/// A chunked message being reassembled (Pulsar's `ChunkedMessageCtx`).
#[derive(Debug, Clone, Default)]
struct Ctx {
    ids: Vec<MessageIdData>,
    buf: Vec<u8>,
    last: u32,
}

/// One consumer's chunk state.
#[derive(Debug, Default)]
pub(super) struct ConsumerChunks {
    /// Chunk metadata of MESSAGE frames not yet handed off, by entry.
    seen: BTreeMap<(u64, u64), ChunkInfo>,
    contexts: BTreeMap<String, Ctx>,
    /// The chunk ids of a delivered chunked message, by its last chunk's
    /// entry (acknowledged with it).
    whole: BTreeMap<(u64, u64), Vec<MessageIdData>>,
}

/// The chunk state of every consumer.
#[derive(Debug, Default)]
pub(super) struct ChunkSide {
    consumers: BTreeMap<usize, ConsumerChunks>,
    pub(super) activity: ChunkActivity,
}

/// A chunk's payloads: `body` split into `k` parts (2..=4, at most one
/// part per byte), each a non-batched entry payload with the chunk fields.
pub(super) fn chunk_payloads(meta: &MessageMetadata, body: &[u8], k: usize) -> Vec<Vec<u8>> {
    let k = k.clamp(1, body.len().max(1));
    let per = body.len().div_ceil(k);
    let uuid = format!("{}-{}", meta.producer_name, meta.sequence_id);
    let parts: Vec<&[u8]> = body.chunks(per.max(1)).collect();
    let n = parts.len() as i32;
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            let m = MessageMetadata {
                uuid: Some(uuid.clone()),
                chunk_id: Some(i as i32),
                num_chunks_from_msg: Some(n),
                total_chunk_msg_size: Some(body.len() as i32),
                ..meta.clone()
            };
            crate::proto::frame::encode_entry_payload(
                &m,
                &[(
                    SingleMessageMetadata {
                        partition_key: None,
                        payload_size: part.len() as i32,
                        compacted_out: None,
                    },
                    part.to_vec(),
                )],
            )
        })
        .collect()
}

fn key(id: &MessageIdData) -> (u64, u64) {
    (id.ledger_id, id.entry_id)
}

fn same_entry(a: &MessageIdData, b: &MessageIdData) -> bool {
    key(a) == key(b)
}

impl Node<'_> {
    /// A MESSAGE frame reached consumer `c`: a chunk's metadata is kept
    /// until the client library hands the message off.
    pub(super) fn chunk_frame(&mut self, c: usize, id: Option<&MessageIdData>, payload: &[u8]) {
        if self.w.faults.chunked_ratio <= 0.0 {
            return;
        }
        let Some(id) = id else { return };
        let Ok(md) = publish_metadata(payload) else {
            return;
        };
        let Ok(Some(part)) = md.chunk(false) else {
            return;
        };
        self.chunks.consumers.entry(c).or_default().seen.insert(
            key(id),
            ChunkInfo {
                uuid: md.uuid.clone().unwrap_or_default(),
                chunk_id: part.chunk_id,
                num_chunks: part.num_chunks,
                total_size: md.total_chunk_msg_size.unwrap_or(-1),
            },
        );
    }

    /// The client library handed off `m`: a whole message comes back
    /// unchanged, a chunk goes into its context (`None`: the application
    /// gets nothing yet; the chunk's permit returns, as Pulsar's client
    /// does not count a chunk against the receiver queue), and the last
    /// chunk of a complete context comes back carrying the whole payload.
    pub(super) fn chunk_arrived(
        &mut self,
        c: usize,
        mut m: ReceivedMessage,
    ) -> Option<ReceivedMessage> {
        if self.w.faults.chunked_ratio <= 0.0 {
            return Some(m);
        }
        let cc = self.chunks.consumers.entry(c).or_default();
        let Some(info) = cc.seen.remove(&key(&m.message_id)) else {
            return Some(m);
        };
        let a = &mut self.chunks.activity;
        a.chunks_received += 1;
        let id = MessageIdData {
            ledger_id: m.message_id.ledger_id,
            entry_id: m.message_id.entry_id,
            ..Default::default()
        };
        let mut ack_now: Vec<MessageIdData> = Vec::new();
        let mut redeliver: Vec<MessageIdData> = Vec::new();
        let mut done = None;
        if info.chunk_id == 0 {
            if let Some(old) = cc.contexts.remove(&info.uuid) {
                a.restarted += 1;
                // None of the old context's chunks is this one: a chunked
                // message the producer sent again; its chunks are acked.
                if !old.ids.iter().any(|o| same_entry(o, &id)) {
                    ack_now.extend(old.ids);
                }
            }
            cc.contexts.insert(
                info.uuid.clone(),
                Ctx {
                    ids: vec![id.clone()],
                    buf: std::mem::take(&mut m.payload),
                    last: 0,
                },
            );
        } else {
            match cc.contexts.get_mut(&info.uuid) {
                Some(ctx) if info.chunk_id == ctx.last + 1 => {
                    ctx.ids.push(id.clone());
                    ctx.buf.extend_from_slice(&m.payload);
                    ctx.last = info.chunk_id;
                }
                Some(ctx) if info.chunk_id <= ctx.last => {
                    a.duplicate_chunks += 1;
                    if !ctx.ids.iter().any(|o| same_entry(o, &id)) {
                        ack_now.push(id.clone());
                    }
                }
                _ => {
                    a.dropped_out_of_sequence += 1;
                    if let Some(old) = cc.contexts.remove(&info.uuid) {
                        redeliver.extend(old.ids);
                    }
                    redeliver.push(id.clone());
                }
            }
        }
        if info.chunk_id + 1 == info.num_chunks {
            if let Some(ctx) = cc.contexts.get(&info.uuid) {
                if ctx.last + 1 == info.num_chunks
                    && ctx.ids.last().is_some_and(|l| same_entry(l, &id))
                {
                    done = cc.contexts.remove(&info.uuid);
                }
            }
        }
        if !ack_now.is_empty() {
            self.chunk_ack_now(c, ack_now);
        }
        if !redeliver.is_empty() {
            self.chunk_redeliver(c, redeliver);
        }
        let ctx = done?;
        self.chunks.activity.reassembled += 1;
        let expected = info.uuid.rsplit_once('-').and_then(|(pn, seq)| {
            Some((
                pn.strip_prefix("p-")?.parse::<usize>().ok()?,
                seq.parse::<u64>().ok()?,
            ))
        });
        let origin = super::client::payload_origin(&ctx.buf).map(|(p, s, _)| (p, s));
        if ctx.buf.len() as i64 != i64::from(info.total_size)
            || origin.is_none()
            || origin != expected
        {
            let now = self.now();
            self.checker.chunked_message_broken(
                &format!(
                    "chunked message {} reassembled from {} chunks at {:?}: {} bytes (total_chunk_msg_size {}), payload {:?}",
                    info.uuid,
                    ctx.ids.len(),
                    ctx.ids.iter().map(key).collect::<Vec<_>>(),
                    ctx.buf.len(),
                    info.total_size,
                    String::from_utf8_lossy(&ctx.buf),
                ),
                now,
            );
        }
        let cc = self.chunks.consumers.entry(c).or_default();
        cc.whole.insert(key(&m.message_id), ctx.ids);
        m.payload = ctx.buf;
        Some(m)
    }

    /// Chunks of a dropped context, unacknowledged: Pulsar's client tracks
    /// them for its ack timeout, which redelivers them; here they are
    /// asked back at once (a negative ack of their ids), so the message's
    /// chunks come again in order (a Key_Shared consumer that got a
    /// message's later chunks after its first went to a consumer that
    /// left, say).
    fn chunk_redeliver(&mut self, c: usize, ids: Vec<MessageIdData>) {
        let Some(conn) = self.consumers[c].conn else {
            return;
        };
        self.chunks.activity.redelivery_requests += 1;
        let cmd = BrokerCommand {
            r#type: ty::REDELIVER_UNACKNOWLEDGED_MESSAGES,
            redeliver_unacknowledged_messages: Some(CommandRedeliverUnacknowledgedMessages {
                consumer_id: super::client::CONSUMER_ID,
                message_ids: ids,
                consumer_epoch: None,
            }),
            ..Default::default()
        };
        self.send_to_broker(conn, super::wire::frame(&cmd, Vec::new()));
    }

    /// The message ids an individual ack of the message at `id` covers:
    /// every chunk's, for a chunked message.
    pub(super) fn chunk_ack_ids(&mut self, c: usize, id: MessageIdData) -> Vec<MessageIdData> {
        match self
            .chunks
            .consumers
            .get_mut(&c)
            .and_then(|cc| cc.whole.remove(&key(&id)))
        {
            Some(ids) => ids,
            None => vec![id],
        }
    }
}

/// The report's component line for chunked messages (none when the
/// workload asks for no chunks).
pub(super) fn component(
    a: &ChunkActivity,
    asked: bool,
) -> Option<crate::sim::report::ComponentReport> {
    if !asked {
        return None;
    }
    Some(crate::sim::report::ComponentReport::new(
        "chunked messages (PIP-37), over the wire",
        &[
            ("chunked messages sent", a.messages_sent, true),
            ("chunks sent", a.chunks_sent, true),
            ("chunks resent after a reconnect", a.chunks_resent, false),
            ("chunk receipts", a.chunk_receipts, true),
            ("chunks received by consumers", a.chunks_received, true),
            ("chunked messages reassembled", a.reassembled, true),
            ("duplicated chunks skipped", a.duplicate_chunks, false),
            ("contexts started over", a.restarted, false),
            (
                "contexts dropped (chunk out of sequence)",
                a.dropped_out_of_sequence,
                false,
            ),
            (
                "chunks asked back (negative ack)",
                a.redelivery_requests,
                false,
            ),
        ],
    ))
}
