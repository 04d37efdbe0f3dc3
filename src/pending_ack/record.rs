//! Pending-ack log records and their wire format (prost).
//!
//! One log entry holds either a single `PendingAckMetadataEntry` or, when the
//! buffered writer batches, the batched form: the big-endian short magic
//! [`BATCHED_ENTRY_MAGIC`] (`0x0e01`), the big-endian short version
//! [`BATCHED_ENTRY_VERSION`] (1), then a `BatchedPendingAckMetadataEntry`
//! holding several records. A plain record can never start with `0x0e`: that
//! byte would be a protobuf key with the invalid wire type 6, so the two
//! forms are unambiguous (Pulsar's `TxnBatchedPositionImpl` / batched
//! pending-ack entries, seed 001).
//!
//! Decoding never panics: bad bytes give [`PendingAckError::Decode`], which
//! fails the replay attempt as non-retryable.

use prost::Message;

use super::error::PendingAckError;
use crate::position::Position;

/// Magic short that starts a batched pending-ack log entry.
pub const BATCHED_ENTRY_MAGIC: u16 = 0x0e01;
/// Version short of the batched entry format.
pub const BATCHED_ENTRY_VERSION: u16 = 1;

/// A transaction id, `(most_sig_bits, least_sig_bits)` as in Pulsar's `TxnID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct TxnId {
    /// High 64 bits (the transaction coordinator id).
    pub most_sig_bits: u64,
    /// Low 64 bits (the sequence within the coordinator).
    pub least_sig_bits: u64,
}

impl TxnId {
    /// Builds a txn id from its two halves.
    pub const fn new(most_sig_bits: u64, least_sig_bits: u64) -> Self {
        Self {
            most_sig_bits,
            least_sig_bits,
        }
    }
}

impl std::fmt::Display for TxnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({},{})", self.most_sig_bits, self.least_sig_bits)
    }
}

/// The operation a pending-ack log record records (`PendingAckOp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PendingAckOp {
    /// A transactional acknowledgement became pending.
    Ack = 0,
    /// The transaction committed: its pending acks take effect.
    Commit = 1,
    /// The transaction aborted: its pending acks are dropped.
    Abort = 2,
}

/// Individual or cumulative acknowledgement (`AckType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum AckType {
    /// Acknowledges exactly the listed positions.
    Individual = 0,
    /// Acknowledges everything up to and including the position.
    Cumulative = 1,
}

/// Wire form of one acknowledged position (`PendingAckMetadata`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PendingAckMetadata {
    /// Ledger id of the acknowledged message.
    #[prost(int64, tag = "1")]
    pub ledger_id: i64,
    /// Entry id of the acknowledged message.
    #[prost(int64, tag = "2")]
    pub entry_id: i64,
    /// Batch-index ack bits (a `BitSet` as longs); empty = whole entry.
    #[prost(int64, repeated, tag = "3")]
    pub ack_set: Vec<i64>,
    /// Number of messages in the batch entry (0 = not batched).
    #[prost(int32, tag = "4")]
    pub batch_size: i32,
}

/// Wire form of one pending-ack log record (`PendingAckMetadataEntry`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PendingAckMetadataEntry {
    /// [`PendingAckOp`] as i32.
    #[prost(enumeration = "PendingAckOp", tag = "1")]
    pub pending_ack_op: i32,
    /// [`AckType`] as i32.
    #[prost(enumeration = "AckType", tag = "2")]
    pub ack_type: i32,
    /// Low half of the txn id.
    #[prost(uint64, tag = "3")]
    pub txnid_least_bits: u64,
    /// High half of the txn id.
    #[prost(uint64, tag = "4")]
    pub txnid_most_bits: u64,
    /// Acknowledged positions (ACK records only).
    #[prost(message, repeated, tag = "5")]
    pub pending_ack_metadata: Vec<PendingAckMetadata>,
}

/// Wire form of a batched entry's payload (`BatchedPendingAckMetadataEntry`),
/// written after the magic and version shorts.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BatchedPendingAckMetadataEntry {
    /// The records of the batch, in append order.
    #[prost(message, repeated, tag = "1")]
    pub pending_ack_logs: Vec<PendingAckMetadataEntry>,
}

/// One acknowledged position in a [`PendingAckRecord`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckedPosition {
    /// The acknowledged message's position in the topic.
    pub position: Position,
    /// Messages in its batch entry (0 = not batched).
    pub batch_size: i32,
    /// Batch-index ack bits; empty = the whole entry.
    pub ack_set: Vec<i64>,
}

impl AckedPosition {
    /// A whole-entry acknowledgement of `position`.
    pub fn whole(position: Position) -> Self {
        Self {
            position,
            batch_size: 0,
            ack_set: Vec::new(),
        }
    }
}

/// A decoded, validated pending-ack log record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingAckRecord {
    /// The transaction the record belongs to.
    pub txn_id: TxnId,
    /// What happened.
    pub op: PendingAckOp,
    /// Individual or cumulative.
    pub ack_type: AckType,
    /// Acknowledged positions: at least one for [`PendingAckOp::Ack`]
    /// (exactly one for a cumulative ack), none for commit/abort.
    pub positions: Vec<AckedPosition>,
}

impl PendingAckRecord {
    /// An individual ACK of `positions` by `txn_id`.
    pub fn individual_ack(txn_id: TxnId, positions: Vec<AckedPosition>) -> Self {
        Self {
            txn_id,
            op: PendingAckOp::Ack,
            ack_type: AckType::Individual,
            positions,
        }
    }

    /// A cumulative ACK up to `position` by `txn_id`.
    pub fn cumulative_ack(txn_id: TxnId, position: Position) -> Self {
        Self {
            txn_id,
            op: PendingAckOp::Ack,
            ack_type: AckType::Cumulative,
            positions: vec![AckedPosition::whole(position)],
        }
    }

    /// COMMIT of `txn_id`'s acks of type `ack_type`.
    pub fn commit(txn_id: TxnId, ack_type: AckType) -> Self {
        Self {
            txn_id,
            op: PendingAckOp::Commit,
            ack_type,
            positions: Vec::new(),
        }
    }

    /// ABORT of `txn_id`'s acks of type `ack_type`.
    pub fn abort(txn_id: TxnId, ack_type: AckType) -> Self {
        Self {
            txn_id,
            op: PendingAckOp::Abort,
            ack_type,
            positions: Vec::new(),
        }
    }

    /// Checks the shape rules listed on [`PendingAckRecord::positions`].
    ///
    /// # Errors
    /// [`PendingAckError::InvalidRecord`].
    pub fn validate(&self) -> Result<(), PendingAckError> {
        match (self.op, self.ack_type) {
            (PendingAckOp::Ack, AckType::Individual) if self.positions.is_empty() => {
                Err(PendingAckError::InvalidRecord(format!(
                    "individual ACK of txn {} lists no positions",
                    self.txn_id
                )))
            }
            (PendingAckOp::Ack, AckType::Cumulative) if self.positions.len() != 1 => {
                Err(PendingAckError::InvalidRecord(format!(
                    "cumulative ACK of txn {} must list exactly one position, got {}",
                    self.txn_id,
                    self.positions.len()
                )))
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn to_wire(&self) -> PendingAckMetadataEntry {
        PendingAckMetadataEntry {
            pending_ack_op: self.op as i32,
            ack_type: self.ack_type as i32,
            txnid_least_bits: self.txn_id.least_sig_bits,
            txnid_most_bits: self.txn_id.most_sig_bits,
            pending_ack_metadata: self
                .positions
                .iter()
                .map(|p| PendingAckMetadata {
                    ledger_id: p.position.ledger_id,
                    entry_id: p.position.entry_id,
                    ack_set: p.ack_set.clone(),
                    batch_size: p.batch_size,
                })
                .collect(),
        }
    }

    fn from_wire(w: PendingAckMetadataEntry) -> Result<Self, String> {
        let op = PendingAckOp::try_from(w.pending_ack_op)
            .map_err(|_| format!("unknown pending_ack_op {}", w.pending_ack_op))?;
        let ack_type = AckType::try_from(w.ack_type)
            .map_err(|_| format!("unknown ack_type {}", w.ack_type))?;
        let rec = Self {
            txn_id: TxnId::new(w.txnid_most_bits, w.txnid_least_bits),
            op,
            ack_type,
            positions: w
                .pending_ack_metadata
                .into_iter()
                .map(|m| AckedPosition {
                    position: Position::new(m.ledger_id, m.entry_id),
                    batch_size: m.batch_size,
                    ack_set: m.ack_set,
                })
                .collect(),
        };
        rec.validate().map_err(|e| e.to_string())?;
        Ok(rec)
    }

    /// Encodes the record as a single (non-batched) log entry.
    pub fn encode(&self) -> Vec<u8> {
        self.to_wire().encode_to_vec()
    }
}

/// Encodes `records` as one batched log entry (magic, version, batch).
pub fn encode_batch(records: &[PendingAckRecord]) -> Vec<u8> {
    frame_batch(&BatchedPendingAckMetadataEntry {
        pending_ack_logs: records.iter().map(PendingAckRecord::to_wire).collect(),
    })
}

/// The batched entry form: magic `0x0e01`, version 1, then the batch.
fn frame_batch(batch: &BatchedPendingAckMetadataEntry) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + batch.encoded_len());
    out.extend_from_slice(&BATCHED_ENTRY_MAGIC.to_be_bytes());
    out.extend_from_slice(&BATCHED_ENTRY_VERSION.to_be_bytes());
    batch
        .encode(&mut out)
        .expect("invariant: a Vec<u8> buffer grows as needed");
    out
}

/// Encodes already-encoded single records (as produced by
/// [`PendingAckRecord::encode`]) into one batched entry without re-validating.
///
/// # Errors
/// [`PendingAckError::InvalidRecord`] if one of `encoded` is not a record.
pub fn encode_batch_of_encoded(encoded: &[&[u8]]) -> Result<Vec<u8>, PendingAckError> {
    let mut logs = Vec::with_capacity(encoded.len());
    for bytes in encoded {
        logs.push(
            PendingAckMetadataEntry::decode(*bytes)
                .map_err(|e| PendingAckError::InvalidRecord(e.to_string()))?,
        );
    }
    Ok(frame_batch(&BatchedPendingAckMetadataEntry {
        pending_ack_logs: logs,
    }))
}

/// Decodes one pending-ack log entry (single or batched) read at `position`.
///
/// # Errors
/// [`PendingAckError::Decode`] for bad protobuf, an unknown batch version, an
/// unknown enum value or an invalid record shape.
pub fn decode_entry(
    position: Position,
    data: &[u8],
) -> Result<Vec<PendingAckRecord>, PendingAckError> {
    let err = |reason: String| PendingAckError::Decode { position, reason };
    if data.len() >= 2 && u16::from_be_bytes([data[0], data[1]]) == BATCHED_ENTRY_MAGIC {
        if data.len() < 4 {
            return Err(err("batched entry shorter than its 4-byte header".into()));
        }
        let version = u16::from_be_bytes([data[2], data[3]]);
        if version != BATCHED_ENTRY_VERSION {
            return Err(err(format!("unsupported batched entry version {version}")));
        }
        let batch = BatchedPendingAckMetadataEntry::decode(&data[4..])
            .map_err(|e| err(format!("batched entry: {e}")))?;
        if batch.pending_ack_logs.is_empty() {
            return Err(err("batched entry holds no records".into()));
        }
        return batch
            .pending_ack_logs
            .into_iter()
            .map(|w| PendingAckRecord::from_wire(w).map_err(&err))
            .collect();
    }
    let w = PendingAckMetadataEntry::decode(data).map_err(|e| err(e.to_string()))?;
    Ok(vec![PendingAckRecord::from_wire(w).map_err(err)?])
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    fn p(l: i64, e: i64) -> Position {
        Position::new(l, e)
    }

    #[test]
    fn single_and_batched_round_trip() {
        let t = TxnId::new(1, 7);
        let recs = vec![
            PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p(3, 4))]),
            PendingAckRecord::cumulative_ack(t, p(3, 9)),
            PendingAckRecord::commit(t, AckType::Individual),
            PendingAckRecord::abort(t, AckType::Cumulative),
        ];
        for r in &recs {
            assert_eq!(decode_entry(p(1, 0), &r.encode()).unwrap(), vec![r.clone()]);
        }
        let b = encode_batch(&recs);
        assert_eq!(&b[..4], &[0x0e, 0x01, 0x00, 0x01]);
        assert_eq!(decode_entry(p(1, 0), &b).unwrap(), recs);
        let enc: Vec<Vec<u8>> = recs.iter().map(|r| r.encode()).collect();
        let refs: Vec<&[u8]> = enc.iter().map(|v| v.as_slice()).collect();
        assert_eq!(encode_batch_of_encoded(&refs).unwrap(), b);
    }

    #[test]
    fn bad_bytes_are_typed_errors() {
        let at = p(2, 5);
        for bad in [
            &[0x0e, 0x01, 0x00][..],
            &[0x0e, 0x01, 0x00, 0x02, 0x0a][..],
            &[0xff, 0xff, 0xff][..],
            &[0x0e, 0x01, 0x00, 0x01][..],
        ] {
            match decode_entry(at, bad) {
                Err(PendingAckError::Decode { position, .. }) => assert_eq!(position, at),
                other => panic!("expected a decode error for {bad:?}, got {other:?}"),
            }
        }
        // Unknown op value.
        let w = PendingAckMetadataEntry {
            pending_ack_op: 9,
            ..Default::default()
        };
        assert!(matches!(
            decode_entry(at, &w.encode_to_vec()),
            Err(PendingAckError::Decode { .. })
        ));
        // An ACK with no positions is invalid.
        let w = PendingAckMetadataEntry::default();
        assert!(decode_entry(at, &w.encode_to_vec()).is_err());
    }
}
