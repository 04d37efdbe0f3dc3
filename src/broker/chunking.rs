//! Chunked messages (PIP-37) and what a SEND's metadata says about its
//! producer and sequence ids.
//!
//! A producer splits a message above `max_message_size` into chunks; each
//! chunk is one SEND (`is_chunk = true`) whose `MessageMetadata` carries the
//! message's `uuid`, `chunk_id`, `num_chunks_from_msg` and
//! `total_chunk_msg_size`, and the message's `sequence_id` (every chunk has
//! the same one). As in Pulsar, the broker does not reassemble: each chunk
//! is stored as one entry and dispatched as one message (one permit); the
//! consumer reassembles by `uuid` and acknowledges every chunk.
//! Deduplication ([`super::dedup`]) judges a chunked message by its last
//! chunk only (Pulsar's `MessageDeduplication`: "all chunks of a message use
//! the same sequence ID").

use crate::proto::metadata::MessageMetadata;

/// Where a chunk stands in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPart {
    /// `chunk_id`.
    pub chunk_id: u32,
    /// `num_chunks_from_msg`.
    pub num_chunks: u32,
}

impl ChunkPart {
    /// Whether this is the message's last chunk.
    pub fn is_last(&self) -> bool {
        self.chunk_id + 1 == self.num_chunks
    }
}

/// Reads the full [`MessageMetadata`] of an entry's bytes (checksum and
/// sizes checked here).
///
/// # Errors
/// A description of the defect.
pub fn publish_metadata(data: &[u8]) -> Result<MessageMetadata, String> {
    crate::proto::frame::parse_entry_payload(data)
        .map(|p| p.metadata)
        .map_err(|e| e.to_string())
}

/// What a SEND's metadata says about chunking and markers.
pub trait PublishFields {
    /// The chunk this entry is, if it is one (`None`: a whole message).
    ///
    /// # Errors
    /// A description of chunk fields that do not describe a chunk:
    /// `is_chunk` set without them, a `chunk_id` outside
    /// `0..num_chunks_from_msg`, no `uuid`, a negative total size.
    fn chunk(&self, is_chunk: bool) -> Result<Option<ChunkPart>, String>;
    /// Whether the entry is a marker (transaction commit/abort, …), which
    /// no producer's sequence counts.
    fn is_marker(&self) -> bool;
}

impl PublishFields for MessageMetadata {
    fn chunk(&self, is_chunk: bool) -> Result<Option<ChunkPart>, String> {
        let (Some(id), Some(n)) = (self.chunk_id, self.num_chunks_from_msg) else {
            if is_chunk {
                return Err(
                    "is_chunk set, but no chunk_id / num_chunks_from_msg in the metadata".into(),
                );
            }
            return Ok(None);
        };
        if n < 1 || id < 0 || id >= n {
            return Err(format!("chunk_id {id} outside 0..num_chunks_from_msg {n}"));
        }
        if self.uuid.as_deref().is_none_or(str::is_empty) {
            return Err("a chunk without the uuid of its message".into());
        }
        if self.total_chunk_msg_size.is_some_and(|s| s < 0) {
            return Err("a negative total_chunk_msg_size".into());
        }
        Ok(Some(ChunkPart {
            chunk_id: id as u32,
            num_chunks: n as u32,
        }))
    }

    fn is_marker(&self) -> bool {
        self.marker_type.is_some_and(|m| m != 0)
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    fn md(chunk: Option<(i32, i32)>, uuid: Option<&str>) -> MessageMetadata {
        MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 3,
            uuid: uuid.map(String::from),
            num_chunks_from_msg: chunk.map(|c| c.1),
            total_chunk_msg_size: chunk.map(|_| 10),
            chunk_id: chunk.map(|c| c.0),
            ..MessageMetadata::default()
        }
    }

    #[test]
    fn chunk_fields_are_validated() {
        assert_eq!(md(None, None).chunk(false), Ok(None));
        assert!(md(None, None).chunk(true).is_err());
        let last = md(Some((2, 3)), Some("u")).chunk(true).unwrap().unwrap();
        assert!(last.is_last());
        assert!(!md(Some((0, 3)), Some("u"))
            .chunk(true)
            .unwrap()
            .unwrap()
            .is_last());
        assert!(md(Some((3, 3)), Some("u")).chunk(true).is_err());
        assert!(md(Some((-1, 3)), Some("u")).chunk(true).is_err());
        assert!(md(Some((0, 3)), None).chunk(true).is_err());
    }
}
