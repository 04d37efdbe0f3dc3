//! What dispatch reads from a stored entry: its `MessageMetadata` (batch
//! size, sticky key, `deliver_at_time`), validated so a peer's number never
//! sizes an ack set or a permit debit beyond what the payload holds.

use super::key_shared::{sticky_key, sticky_key_hash, NONE_KEY};

/// What dispatch needs from an entry's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryInfo {
    /// `num_messages_in_batch` (1 for a single message).
    pub batch_size: u32,
    /// Key_Shared slot of the entry's sticky key ([`sticky_key_hash`]).
    pub key_hash: u32,
    /// `deliver_at_time`, epoch ms.
    pub deliver_at: Option<i64>,
}

impl EntryInfo {
    /// What dispatch assumes for an entry whose metadata is unreadable: one
    /// message with Pulsar's `NONE_KEY` sticky key, never delayed.
    pub fn unreadable() -> Self {
        Self {
            batch_size: 1,
            key_hash: sticky_key_hash(NONE_KEY),
            deliver_at: None,
        }
    }
}

/// Smallest encoding of one message inside a batch payload: its 4-byte
/// metadata size and a `SingleMessageMetadata` holding only the required
/// `payload_size` (key + 1-byte varint), with an empty payload.
const MIN_BATCHED_MESSAGE_BYTES: usize = 6;

/// Reads the `MessageMetadata` of a stored entry (`[0x0e02 …]? [0x0e01][crc]?
/// [size][MessageMetadata]…`).
///
/// # Errors
/// A description of the defect: a payload that does not parse (checksum,
/// sizes), metadata that does not decode, or a batch count the payload
/// cannot hold.
pub fn entry_info(data: &[u8]) -> Result<EntryInfo, String> {
    let parsed = crate::proto::frame::parse_entry_payload(data).map_err(|e| e.to_string())?;
    let m = &parsed.metadata;
    let batch = m.num_messages_in_batch.unwrap_or(1);
    // Each message of a batch takes at least MIN_BATCHED_MESSAGE_BYTES of the
    // payload: a count the payload cannot hold is corrupt, and trusting it
    // would size ack sets and permits from a peer's number.
    // A compressed batch holds `uncompressed_size` bytes once inflated,
    // bounded like any frame.
    let batch_bytes = match m.compression {
        Some(c) if c != 0 => (m.uncompressed_size.unwrap_or(0) as usize)
            .min(crate::proto::frame::DEFAULT_MAX_FRAME_SIZE),
        _ => parsed.payload.len(),
    };
    if batch > 1 && (batch as usize).saturating_mul(MIN_BATCHED_MESSAGE_BYTES) > batch_bytes {
        return Err(format!(
            "num_messages_in_batch {batch} exceeds what a {batch_bytes}-byte batch payload can hold"
        ));
    }
    let key = sticky_key(
        m.ordering_key.as_deref(),
        m.partition_key.as_deref(),
        m.partition_key_b64_encoded.unwrap_or(false),
    );
    Ok(EntryInfo {
        batch_size: u32::try_from(batch.max(1)).unwrap_or(1),
        key_hash: sticky_key_hash(&key),
        deliver_at: m.deliver_at_time,
    })
}
