//! Pending-ack log records and their wire format: the proto2 messages of
//! Pulsar's `TransactionPendingAck.proto` (`PendingAckMetadataEntry`,
//! `PendingAckMetadata`, `BatchedPendingAckMetadataEntry`) with their tags,
//! labels and enum values, so a log entry is the bytes Pulsar's
//! `MLPendingAckStore` writes and reads. The required `ledgerId`/`entryId`
//! of every position are checked before decoding
//! ([`crate::permits::presence`]).
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
use crate::permits::presence::{check_required, RequiredSpec};
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

/// The operation a pending-ack log record records (`PendingAckOp` of
/// Pulsar's `TransactionPendingAck.proto`: ACK = 1, COMMIT = 2, ABORT = 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PendingAckOp {
    /// A transactional acknowledgement became pending.
    Ack = 1,
    /// The transaction committed: its pending acks take effect.
    Commit = 2,
    /// The transaction aborted: its pending acks are dropped.
    Abort = 3,
}

/// Individual or cumulative acknowledgement (`CommandAck.AckType`:
/// Individual = 0, Cumulative = 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum AckType {
    /// Acknowledges exactly the listed positions.
    Individual = 0,
    /// Acknowledges everything up to and including the position.
    Cumulative = 1,
}

/// Wire form of one acknowledged position: `message PendingAckMetadata {
/// required uint64 ledgerId = 1; required uint64 entryId = 2; repeated int64
/// ack_set = 3; optional int32 batch_size = 4; }` (proto2; `ack_set`
/// unpacked on the wire, read in both forms).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PendingAckMetadata {
    /// `ledgerId = 1`, required uint64 (a [`Position`] ledger id, bit for bit).
    #[prost(uint64, required, tag = "1")]
    pub ledger_id: u64,
    /// `entryId = 2`, required uint64 (a [`Position`] entry id, bit for bit).
    #[prost(uint64, required, tag = "2")]
    pub entry_id: u64,
    /// `ack_set = 3`: batch-index ack bits (a `BitSet` as longs); empty =
    /// whole entry.
    #[prost(int64, repeated, packed = "false", tag = "3")]
    pub ack_set: Vec<i64>,
    /// `batch_size = 4`: messages in the batch entry; absent = not batched.
    #[prost(int32, optional, tag = "4")]
    pub batch_size: Option<i32>,
}

/// Wire form of one pending-ack log record: `message PendingAckMetadataEntry
/// { optional PendingAckOp pending_ack_op = 1; optional CommandAck.AckType
/// ack_type = 2; optional uint64 txnid_least_bits = 3; optional uint64
/// txnid_most_bits = 4; repeated PendingAckMetadata pending_ack_metadata = 5;
/// }` (proto2: the encoder sets all four scalars, so they are on the wire
/// also when 0; an absent one reads as its proto2 default).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PendingAckMetadataEntry {
    /// `pending_ack_op = 1`: [`PendingAckOp`] as i32 (absent = ACK, the
    /// enum's first value).
    #[prost(enumeration = "PendingAckOp", optional, tag = "1")]
    pub pending_ack_op: Option<i32>,
    /// `ack_type = 2`: [`AckType`] as i32 (absent = Individual).
    #[prost(enumeration = "AckType", optional, tag = "2")]
    pub ack_type: Option<i32>,
    /// `txnid_least_bits = 3`: low half of the txn id.
    #[prost(uint64, optional, tag = "3")]
    pub txnid_least_bits: Option<u64>,
    /// `txnid_most_bits = 4`: high half of the txn id.
    #[prost(uint64, optional, tag = "4")]
    pub txnid_most_bits: Option<u64>,
    /// `pending_ack_metadata = 5`: acknowledged positions (ACK records only).
    #[prost(message, repeated, tag = "5")]
    pub pending_ack_metadata: Vec<PendingAckMetadata>,
}

/// Required fields of `PendingAckMetadata`.
pub static PENDING_ACK_METADATA_REQUIRED: RequiredSpec = RequiredSpec {
    message: "PendingAckMetadata",
    required: &[(1, "ledgerId"), (2, "entryId")],
    nested: &[],
};
/// Required fields below `PendingAckMetadataEntry` (its own are optional).
pub static PENDING_ACK_METADATA_ENTRY_REQUIRED: RequiredSpec = RequiredSpec {
    message: "PendingAckMetadataEntry",
    required: &[],
    nested: &[(5, true, &PENDING_ACK_METADATA_REQUIRED)],
};
/// Required fields below `BatchedPendingAckMetadataEntry`.
pub static BATCHED_PENDING_ACK_METADATA_ENTRY_REQUIRED: RequiredSpec = RequiredSpec {
    message: "BatchedPendingAckMetadataEntry",
    required: &[],
    nested: &[(1, true, &PENDING_ACK_METADATA_ENTRY_REQUIRED)],
};

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
        // MLPendingAckStore sets batch_size on every position of an
        // individual ACK (also 0) and on none of a cumulative one
        let with_batch_size = self.ack_type == AckType::Individual;
        PendingAckMetadataEntry {
            pending_ack_op: Some(self.op as i32),
            ack_type: Some(self.ack_type as i32),
            txnid_least_bits: Some(self.txn_id.least_sig_bits),
            txnid_most_bits: Some(self.txn_id.most_sig_bits),
            pending_ack_metadata: self
                .positions
                .iter()
                .map(|p| PendingAckMetadata {
                    // i64 → u64 keeps the bits: the varint on the wire is the same
                    ledger_id: p.position.ledger_id as u64,
                    entry_id: p.position.entry_id as u64,
                    ack_set: p.ack_set.clone(),
                    batch_size: with_batch_size.then_some(p.batch_size),
                })
                .collect(),
        }
    }

    fn from_wire(w: PendingAckMetadataEntry) -> Result<Self, String> {
        // the raw values: prost's enum accessors map an unknown value to the
        // default, which would hide it
        let op_value = w.pending_ack_op.unwrap_or(PendingAckOp::Ack as i32);
        let op = PendingAckOp::try_from(op_value)
            .map_err(|_| format!("unknown pending_ack_op {op_value}"))?;
        let ack_type_value = w.ack_type.unwrap_or(AckType::Individual as i32);
        let ack_type = AckType::try_from(ack_type_value)
            .map_err(|_| format!("unknown ack_type {ack_type_value}"))?;
        let rec = Self {
            txn_id: TxnId::new(w.txnid_most_bits(), w.txnid_least_bits()),
            op,
            ack_type,
            positions: w
                .pending_ack_metadata
                .into_iter()
                .map(|m| AckedPosition {
                    // u64 → i64 keeps the bits written by `to_wire`
                    position: Position::new(m.ledger_id as i64, m.entry_id as i64),
                    batch_size: m.batch_size.unwrap_or(0),
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
        check_required(&BATCHED_PENDING_ACK_METADATA_ENTRY_REQUIRED, &data[4..])
            .map_err(|e| err(format!("batched entry: {e}")))?;
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
    check_required(&PENDING_ACK_METADATA_ENTRY_REQUIRED, data).map_err(|e| err(e.to_string()))?;
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

    /// Records are the bytes protoc writes from Pulsar's
    /// `TransactionPendingAck.proto` (proto2): `PendingAckOp` is ACK = 1,
    /// COMMIT = 2, ABORT = 3; op, ack type and both txn id halves are set
    /// (so on the wire also when 0); `ack_set` is unpacked; `batch_size` is
    /// set on every position of an individual ACK and on none of a
    /// cumulative one (as `MLPendingAckStore` writes them).
    #[test]
    fn records_are_pulsar_transaction_pending_ack_bytes() {
        let t = TxnId::new(2, 3);
        // ACK Individual of 5:7 (whole entry: batch_size 0, on the wire)
        let ack = PendingAckRecord::individual_ack(t, vec![AckedPosition::whole(p(5, 7))]);
        let ack_bytes = [
            0x08, 1, 0x10, 0, 0x18, 3, 0x20, 2, 0x2a, 6, 0x08, 5, 0x10, 7, 0x20, 0,
        ];
        assert_eq!(ack.encode(), ack_bytes);
        // ACK Cumulative up to 5:7: no batch_size
        assert_eq!(
            PendingAckRecord::cumulative_ack(t, p(5, 7)).encode(),
            [0x08, 1, 0x10, 1, 0x18, 3, 0x20, 2, 0x2a, 4, 0x08, 5, 0x10, 7]
        );
        // COMMIT Cumulative, and ABORT Individual of txn (0, 0)
        assert_eq!(
            PendingAckRecord::commit(t, AckType::Cumulative).encode(),
            [0x08, 2, 0x10, 1, 0x18, 3, 0x20, 2]
        );
        assert_eq!(
            PendingAckRecord::abort(TxnId::new(0, 0), AckType::Individual).encode(),
            [0x08, 3, 0x10, 0, 0x18, 0, 0x20, 0]
        );
        // a batch-index ack: ack_set [5, 6] unpacked, batch_size 4
        let batched = PendingAckRecord::individual_ack(
            t,
            vec![AckedPosition {
                position: p(5, 7),
                batch_size: 4,
                ack_set: vec![5, 6],
            }],
        );
        let batched_bytes = [
            0x08, 1, 0x10, 0, 0x18, 3, 0x20, 2, 0x2a, 10, 0x08, 5, 0x10, 7, 0x18, 5, 0x18, 6, 0x20,
            4,
        ];
        assert_eq!(batched.encode(), batched_bytes);
        assert_eq!(
            decode_entry(p(1, 0), &batched_bytes).unwrap(),
            vec![batched.clone()]
        );
        // the packed form of ack_set decodes to the same record
        let packed = [
            0x08, 1, 0x10, 0, 0x18, 3, 0x20, 2, 0x2a, 10, 0x08, 5, 0x10, 7, 0x1a, 2, 5, 6, 0x20, 4,
        ];
        assert_eq!(decode_entry(p(1, 0), &packed).unwrap(), vec![batched]);
        assert_eq!(decode_entry(p(1, 0), &ack_bytes).unwrap(), vec![ack]);
    }

    /// `PendingAckMetadata.ledgerId` and `entryId` are proto2 `required`: a
    /// position without one is a typed decode error (prost alone would read
    /// it as 0), in a single and in a batched entry.
    #[test]
    fn pending_ack_position_without_required_id_is_a_decode_error() {
        let at = p(2, 5);
        let head = [0x08, 1, 0x10, 0, 0x18, 3, 0x20, 2];
        for (position, field) in [(&[0x10, 7][..], "ledgerId"), (&[0x08, 5][..], "entryId")] {
            let mut single = head.to_vec();
            single.extend_from_slice(&[0x2a, 2]);
            single.extend_from_slice(position);
            let mut batch = vec![0x0e, 0x01, 0x00, 0x01, 0x0a, single.len() as u8];
            batch.extend_from_slice(&single);
            for bytes in [single, batch] {
                match decode_entry(at, &bytes) {
                    Err(PendingAckError::Decode { position, reason }) => {
                        assert_eq!(position, at);
                        assert!(reason.contains(field), "{field}: {reason}");
                    }
                    other => panic!("expected missing {field}, got {other:?}"),
                }
            }
        }
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
        // Unknown op / ack type values (also on an otherwise valid ACK record,
        // and 0, which is not a PendingAckOp).
        for (op, ack_type) in [(9, 0), (0, 0), (1, 5)] {
            let mut w = PendingAckRecord::individual_ack(
                TxnId::new(1, 1),
                vec![AckedPosition::whole(p(3, 4))],
            )
            .to_wire();
            w.pending_ack_op = Some(op);
            w.ack_type = Some(ack_type);
            assert!(
                matches!(
                    decode_entry(at, &w.encode_to_vec()),
                    Err(PendingAckError::Decode { .. })
                ),
                "op {op}, ack_type {ack_type}"
            );
        }
        // An ACK with no positions is invalid.
        let w = PendingAckMetadataEntry::default();
        assert!(decode_entry(at, &w.encode_to_vec()).is_err());
    }
}
