//! The crate's own persisted form of a cursor's deletion state: portable
//! Roaring bitmaps per ledger, no range cap, split into bounded chunks so no
//! single store entry grows with the backlog.
//!
//! Pulsar's two forms ([`super::position_info`]) either cap the number of
//! ranges (excess silently dropped, #25540) or grow with the backlog (the
//! long[] form reaches BookKeeper's ~5 MB entry limit at about 30 M entries,
//! #25985). This form is exact at any size: each ledger's bitmap in the
//! [portable Roaring format](https://github.com/RoaringBitmap/RoaringFormatSpec)
//! (run-optimised first, so striped acks cost a few bytes per run and random
//! acks at most 8 KiB per 65,536 entries), the byte stream cut into chunks
//! of at most `chunk_bytes` each (one store row per chunk).
//!
//! # Layout (little-endian), concatenation of the chunks in order
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `PCDS` |
//! | 1 | version (1) |
//! | 8 + 8 | mark-delete ledger id, entry id (i64) |
//! | 4 | ledger count `n` (u32) |
//! | `n` × (8 + 4 + len) | ledger id (i64, ascending, ≥ 0), `len` (u32), portable Roaring bytes |
//! | 4 | batch count `m` (u32) |
//! | `m` × (8 + 8 + 4 + 8·w) | batch position (ledger, entry), word count `w`, ack-set words (i64) |
//! | 4 | CRC-32C of every byte before it |
//!
//! Decoding checks the checksum before parsing, never allocates more than
//! the input's size, and reports every defect as a [`CompactError`].

use std::collections::BTreeMap;

use roaring::RoaringBitmap;

use super::snapshot::DeletionSnapshot;
use crate::position::Position;

/// First bytes of the stream.
pub const MAGIC: [u8; 4] = *b"PCDS";
/// The only version this crate writes and reads.
pub const VERSION: u8 = 1;
/// Default chunk size: 1 MiB, well below BookKeeper's 5 MB entry limit and
/// redb's comfortable value size.
pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;

/// Why a compact deletion state could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompactError {
    /// No chunks, or the stream ends inside a field.
    #[error("compact deletion state truncated at byte {at} (needed {needed} more)")]
    Truncated {
        /// Offset where input ran out.
        at: usize,
        /// Bytes the field needed.
        needed: usize,
    },
    /// The stream does not start with [`MAGIC`].
    #[error("not a compact deletion state (magic {found:02x?})")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// A version other than [`VERSION`].
    #[error("compact deletion state version {0} is not supported (expected {VERSION})")]
    UnsupportedVersion(u8),
    /// The CRC-32C trailer does not match.
    #[error("compact deletion state checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// The trailer.
        stored: u32,
        /// CRC-32C of the bytes before it.
        computed: u32,
    },
    /// A ledger's bitmap is not valid portable Roaring.
    #[error("ledger {ledger_id}: invalid Roaring bitmap: {reason}")]
    Bitmap {
        /// The ledger.
        ledger_id: i64,
        /// The decoder's message.
        reason: String,
    },
    /// Ledger ids not strictly ascending, or negative.
    #[error("ledger id {ledger_id} is negative or out of order")]
    LedgerOrder {
        /// The offending id.
        ledger_id: i64,
    },
    /// A mark-delete or batch position the deletion state cannot hold.
    #[error("invalid position {position} in compact deletion state: {what}")]
    InvalidPosition {
        /// The position.
        position: Position,
        /// Which field.
        what: &'static str,
    },
    /// Bytes after the last field and before the checksum.
    #[error("{0} unexpected bytes before the checksum")]
    TrailingBytes(usize),
}

/// Encodes `snapshot` and cuts the stream into chunks of at most
/// `chunk_bytes` (≥ 1) bytes each. Exact: every deleted entry and ack set
/// is kept, whatever their number.
pub fn encode(snapshot: &DeletionSnapshot, chunk_bytes: usize) -> Vec<Vec<u8>> {
    let stream = encode_stream(snapshot);
    let chunk_bytes = chunk_bytes.max(1);
    stream.chunks(chunk_bytes).map(<[u8]>::to_vec).collect()
}

/// As [`encode`], optimizing `snapshot`'s bitmaps in place (their content
/// is unchanged, only their containers' representation) instead of
/// encoding an optimized copy of each: the same bytes, one bitmap copy
/// fewer per ledger. For a snapshot taken only to be persisted.
pub fn encode_in_place(snapshot: &mut DeletionSnapshot, chunk_bytes: usize) -> Vec<Vec<u8>> {
    for bits in snapshot.ledgers.values_mut() {
        bits.optimize();
    }
    let stream = encode_stream_with(snapshot, false);
    let chunk_bytes = chunk_bytes.max(1);
    stream.chunks(chunk_bytes).map(<[u8]>::to_vec).collect()
}

/// The unchunked byte stream (see the module's layout table).
pub fn encode_stream(snapshot: &DeletionSnapshot) -> Vec<u8> {
    encode_stream_with(snapshot, true)
}

/// The stream of [`encode_stream`]; `optimize`: encode an optimized copy
/// of each bitmap (else the bitmaps are encoded as they are, already
/// optimized by the caller).
fn encode_stream_with(snapshot: &DeletionSnapshot, optimize: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&snapshot.mark_delete.ledger_id.to_le_bytes());
    out.extend_from_slice(&snapshot.mark_delete.entry_id.to_le_bytes());
    let ledgers: Vec<(&i64, &RoaringBitmap)> = snapshot
        .ledgers
        .iter()
        .filter(|(_, b)| !b.is_empty())
        .collect();
    out.extend_from_slice(&(ledgers.len() as u32).to_le_bytes());
    for (l, bits) in ledgers {
        let optimized;
        let bits = if optimize {
            let mut copy = bits.clone();
            copy.optimize();
            optimized = copy;
            &optimized
        } else {
            bits
        };
        let len = bits.serialized_size();
        out.extend_from_slice(&l.to_le_bytes());
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.reserve(len);
        // Writing into a Vec cannot fail.
        bits.serialize_into(&mut out).expect("write to Vec");
    }
    out.extend_from_slice(&(snapshot.batch_ack_sets.len() as u32).to_le_bytes());
    for (p, words) in &snapshot.batch_ack_sets {
        out.extend_from_slice(&p.ledger_id.to_le_bytes());
        out.extend_from_slice(&p.entry_id.to_le_bytes());
        out.extend_from_slice(&(words.len() as u32).to_le_bytes());
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CompactError> {
        let rest = self.bytes.len() - self.at;
        if n > rest {
            return Err(CompactError::Truncated {
                at: self.at,
                needed: n - rest,
            });
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, CompactError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn i64(&mut self) -> Result<i64, CompactError> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

/// Decodes the chunks written by [`encode`] (in order).
///
/// # Errors
/// [`CompactError`] for any defect; nothing is partially returned.
pub fn decode<C: AsRef<[u8]>>(chunks: &[C]) -> Result<DeletionSnapshot, CompactError> {
    let stream: Vec<u8> = chunks
        .iter()
        .flat_map(|c| c.as_ref().iter().copied())
        .collect();
    decode_stream(&stream)
}

/// Decodes one unchunked stream (see [`encode_stream`]).
///
/// # Errors
/// As [`decode`].
pub fn decode_stream(stream: &[u8]) -> Result<DeletionSnapshot, CompactError> {
    if stream.len() < MAGIC.len() + 1 + 16 + 4 + 4 + 4 {
        return Err(CompactError::Truncated {
            at: stream.len(),
            needed: MAGIC.len() + 1 + 16 + 4 + 4 + 4 - stream.len(),
        });
    }
    let (body, trailer) = stream.split_at(stream.len() - 4);
    let magic: [u8; 4] = body[..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(CompactError::BadMagic { found: magic });
    }
    if body[4] != VERSION {
        return Err(CompactError::UnsupportedVersion(body[4]));
    }
    let stored = u32::from_le_bytes(trailer.try_into().expect("4 bytes"));
    let computed = crc32c::crc32c(body);
    if stored != computed {
        return Err(CompactError::Checksum { stored, computed });
    }
    let mut r = Reader { bytes: body, at: 5 };
    let mark_delete = Position::new(r.i64()?, r.i64()?);
    if mark_delete.entry_id != -1 && u32::try_from(mark_delete.entry_id).is_err() {
        return Err(CompactError::InvalidPosition {
            position: mark_delete,
            what: "mark-delete entry id must be -1 or a u32",
        });
    }
    let n = r.u32()?;
    let mut ledgers = BTreeMap::new();
    let mut previous: Option<i64> = None;
    for _ in 0..n {
        let ledger_id = r.i64()?;
        if ledger_id < 0 || previous.is_some_and(|p| p >= ledger_id) {
            return Err(CompactError::LedgerOrder { ledger_id });
        }
        previous = Some(ledger_id);
        let len = r.u32()? as usize;
        let bytes = r.take(len)?;
        let bits = RoaringBitmap::deserialize_from(bytes).map_err(|e| CompactError::Bitmap {
            ledger_id,
            reason: e.to_string(),
        })?;
        if bits.serialized_size() != len {
            // deserialize_from may stop before the end of a damaged blob.
            return Err(CompactError::Bitmap {
                ledger_id,
                reason: format!(
                    "{len} bytes stored, the bitmap uses {}",
                    bits.serialized_size()
                ),
            });
        }
        ledgers.insert(ledger_id, bits);
    }
    let m = r.u32()?;
    let mut batch_ack_sets = BTreeMap::new();
    for _ in 0..m {
        let position = Position::new(r.i64()?, r.i64()?);
        if position.ledger_id < 0 || u32::try_from(position.entry_id).is_err() {
            return Err(CompactError::InvalidPosition {
                position,
                what: "batch positions must be entries of real ledgers",
            });
        }
        let w = r.u32()? as usize;
        let raw = r.take(w.checked_mul(8).ok_or(CompactError::Truncated {
            at: r.at,
            needed: usize::MAX,
        })?)?;
        let words = raw
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        batch_ack_sets.insert(position, words);
    }
    if r.at != body.len() {
        return Err(CompactError::TrailingBytes(body.len() - r.at));
    }
    let mut snapshot = DeletionSnapshot {
        mark_delete,
        ledgers,
        batch_ack_sets,
    };
    snapshot.normalize();
    Ok(snapshot)
}
