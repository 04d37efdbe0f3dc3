//! Pending-ack log records and their wire format (prost).
//!
//! One log entry holds either a single `PendingAckMetadataEntry` or, when the
//! buffered writer batches, the batched form: the big-endian short magic
//! [`BATCHED_ENTRY_MAGIC`] (`0x0e01`), the big-endian short version
//! [`BATCHED_ENTRY_VERSION`] (1), then a `BatchedPendingAckMetadataEntry`
//! holding several records. A plain record can never start with `0x0e`: that
//! byte would be a protobuf key with the invalid wire type 6, so the two
//! forms are unambiguous (Pulsar's `TxnBatchedPositionImpl` / batched
//! pending-ack entries).
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

/// The operation a pending-ack log record records (Pulsar's `PendingAckOp`
/// in `TransactionPendingAck.proto`: `ACK = 1`, `COMMIT = 2`, `ABORT = 3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PendingAckOp {
    /// A transactional acknowledgement became pending (`ACK = 1`).
    Ack = 1,
    /// The transaction committed: its pending acks take effect (`COMMIT = 2`).
    Commit = 2,
    /// The transaction aborted: its pending acks are dropped (`ABORT = 3`).
    Abort = 3,
}

/// Individual or cumulative acknowledgement: `TransactionPendingAck.proto`
/// imports `PulsarApi.proto`'s `CommandAck.AckType`, so this is the one
/// definition in [`crate::proto::wire`].
pub use crate::proto::wire::AckType;

/// Wire form of one acknowledged position (proto2 `PendingAckMetadata`).
///
/// Presence is explicit (`Option`): a present zero is on the wire, an absent
/// field is not. `ledgerId` and `entryId` are `required` in Pulsar's schema:
/// the encoder always writes them and the decoder rejects their absence with
/// [`PendingAckError::MissingField`]. `ack_set` is a proto2 `repeated int64`
/// without `[packed = true]`: written unpacked (one tag per word), accepted
/// packed or unpacked.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PendingAckMetadata {
    /// `required uint64 ledgerId = 1`.
    #[prost(uint64, optional, tag = "1")]
    pub ledger_id: Option<u64>,
    /// `required uint64 entryId = 2`.
    #[prost(uint64, optional, tag = "2")]
    pub entry_id: Option<u64>,
    /// `repeated int64 ack_set = 3` (unpacked): the batch's `BitSet` as
    /// little-endian 64-bit words; a SET bit is an index this ack leaves
    /// unacknowledged. Empty = the whole entry.
    #[prost(int64, repeated, packed = "false", tag = "3")]
    pub ack_set: Vec<i64>,
    /// `optional int32 batch_size = 4`.
    #[prost(int32, optional, tag = "4")]
    pub batch_size: Option<i32>,
}

/// Wire form of one pending-ack log record (proto2 `PendingAckMetadataEntry`;
/// every scalar field `optional`, so an explicit zero is on the wire).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PendingAckMetadataEntry {
    /// `optional PendingAckOp pending_ack_op = 1`.
    #[prost(enumeration = "PendingAckOp", optional, tag = "1")]
    pub pending_ack_op: Option<i32>,
    /// `optional CommandAck.AckType ack_type = 2`.
    #[prost(enumeration = "AckType", optional, tag = "2")]
    pub ack_type: Option<i32>,
    /// `optional uint64 txnid_least_bits = 3`.
    #[prost(uint64, optional, tag = "3")]
    pub txnid_least_bits: Option<u64>,
    /// `optional uint64 txnid_most_bits = 4`.
    #[prost(uint64, optional, tag = "4")]
    pub txnid_most_bits: Option<u64>,
    /// `repeated PendingAckMetadata pending_ack_metadata = 5` (ACK records).
    #[prost(message, repeated, tag = "5")]
    pub pending_ack_metadata: Vec<PendingAckMetadata>,
}

/// Wire form of a batched entry's payload (`BatchedPendingAckMetadataEntry`:
/// `repeated PendingAckMetadataEntry pending_ack_logs = 1`), written after
/// the magic and version shorts.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BatchedPendingAckMetadataEntry {
    /// The records of the batch, in append order.
    #[prost(message, repeated, tag = "1")]
    pub pending_ack_logs: Vec<PendingAckMetadataEntry>,
}

/// One acknowledged position in a [`PendingAckRecord`].
///
/// A batch-index ack carries the batch's `ack_set` in Pulsar's convention
/// (`java.util.BitSet.toLongArray()`: little-endian 64-bit words, trailing
/// zero words trimmed, a SET bit is an index this ack leaves unacknowledged)
/// and the number of messages in the batch entry (`batch_size`). An empty
/// `ack_set` acknowledges the whole entry.
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
    /// Largest `batch_size` accepted (1 Mi messages). Batch-index acks cost
    /// memory per index, so the batch size is bounded by what one entry can
    /// hold: Pulsar's default `maxMessageSize` is 5 MiB and every batched
    /// message takes at least 5 bytes (its 4-byte metadata size and a
    /// non-empty `SingleMessageMetadata`), so no storable batch is larger.
    pub const MAX_BATCH_SIZE: i32 = 1 << 20;

    /// A whole-entry acknowledgement of `position`.
    pub fn whole(position: Position) -> Self {
        Self {
            position,
            batch_size: 0,
            ack_set: Vec::new(),
        }
    }

    /// An acknowledgement of the batch indexes `acked` (each `< batch_size`)
    /// of the batch entry at `position` holding `batch_size` messages.
    ///
    /// # Errors
    /// [`PendingAckError::InvalidRecord`] if `batch_size` is not positive or
    /// above [`AckedPosition::MAX_BATCH_SIZE`], an index is out of range, or
    /// `acked` is empty.
    pub fn batch_indexes(
        position: Position,
        batch_size: i32,
        acked: &[u32],
    ) -> Result<Self, PendingAckError> {
        if batch_size <= 0 {
            return Err(PendingAckError::InvalidRecord(format!(
                "batch-index ack of {position} needs a positive batch_size, got {batch_size}"
            )));
        }
        if batch_size > Self::MAX_BATCH_SIZE {
            return Err(PendingAckError::InvalidRecord(format!(
                "batch-index ack of {position}: batch_size {batch_size} exceeds {}",
                Self::MAX_BATCH_SIZE
            )));
        }
        if acked.is_empty() {
            return Err(PendingAckError::InvalidRecord(format!(
                "batch-index ack of {position} acknowledges no index"
            )));
        }
        let n = batch_size as u32;
        let mut words = vec![0i64; n.div_ceil(64) as usize];
        for i in 0..n {
            words[(i / 64) as usize] |= 1i64 << (i % 64);
        }
        for &i in acked {
            if i >= n {
                return Err(PendingAckError::InvalidRecord(format!(
                    "batch index {i} of {position} is outside its batch of {batch_size}"
                )));
            }
            words[(i / 64) as usize] &= !(1i64 << (i % 64));
        }
        let used = words
            .iter()
            .rposition(|w| *w != 0)
            .map_or(0, |last| last + 1);
        words.truncate(used);
        // Every index acknowledged leaves no word: the whole entry, as Pulsar
        // sends it.
        Ok(Self {
            position,
            batch_size,
            ack_set: words,
        })
    }

    /// Whether this acknowledges only some batch indexes (a non-empty
    /// `ack_set`).
    pub fn is_batch_index_ack(&self) -> bool {
        !self.ack_set.is_empty()
    }

    /// The batch indexes this ack acknowledges (clear bits below
    /// `batch_size`), or `None` for a whole-entry ack.
    pub fn acked_indexes(&self) -> Option<std::collections::BTreeSet<u32>> {
        if self.ack_set.is_empty() {
            return None;
        }
        let n = self.batch_size.max(0) as u32;
        Some(
            (0..n)
                .filter(|&i| {
                    let w = self.ack_set.get((i / 64) as usize).copied().unwrap_or(0);
                    w & (1i64 << (i % 64)) == 0
                })
                .collect(),
        )
    }

    /// `cumulative`: the position of a cumulative ACK, whose `ack_set`
    /// Pulsar writes without a `batch_size` (`appendCumulativeAck`), so its
    /// bits cannot be checked against one.
    fn validate(&self, cumulative: bool) -> Result<(), PendingAckError> {
        let p = self.position;
        if p.ledger_id < 0 || p.entry_id < 0 {
            return Err(PendingAckError::InvalidRecord(format!(
                "acknowledged position {p} has a negative ledger or entry id"
            )));
        }
        if self.batch_size < 0 {
            return Err(PendingAckError::InvalidRecord(format!(
                "acknowledged position {p} has a negative batch_size {}",
                self.batch_size
            )));
        }
        if self.batch_size > Self::MAX_BATCH_SIZE {
            return Err(PendingAckError::InvalidRecord(format!(
                "acknowledged position {p} has batch_size {} above {}",
                self.batch_size,
                Self::MAX_BATCH_SIZE
            )));
        }
        if self.ack_set.is_empty() || (cumulative && self.batch_size == 0) {
            return Ok(());
        }
        let n = self.batch_size as u32;
        if n == 0 {
            return Err(PendingAckError::InvalidRecord(format!(
                "batch-index ack of {p} has an ack_set but no batch_size"
            )));
        }
        if self.ack_set.len() > n.div_ceil(64) as usize {
            return Err(PendingAckError::InvalidRecord(format!(
                "batch-index ack of {p}: ack_set has {} words for a batch of {n}",
                self.ack_set.len()
            )));
        }
        let last = self.ack_set.len() - 1;
        let bits_in_last = n - 64 * last as u32;
        if bits_in_last < 64 && (self.ack_set[last] as u64) >> bits_in_last != 0 {
            return Err(PendingAckError::InvalidRecord(format!(
                "batch-index ack of {p}: ack_set sets bits at or above batch_size {n}"
            )));
        }
        Ok(())
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

    /// Checks the shape rules listed on [`PendingAckRecord::positions`] and
    /// each position's ids and batch-index ack set.
    ///
    /// # Errors
    /// [`PendingAckError::InvalidRecord`].
    pub fn validate(&self) -> Result<(), PendingAckError> {
        match (self.op, self.ack_type) {
            (PendingAckOp::Ack, AckType::Individual) if self.positions.is_empty() => {
                return Err(PendingAckError::InvalidRecord(format!(
                    "individual ACK of txn {} lists no positions",
                    self.txn_id
                )))
            }
            (PendingAckOp::Ack, AckType::Cumulative) if self.positions.len() != 1 => {
                return Err(PendingAckError::InvalidRecord(format!(
                    "cumulative ACK of txn {} must list exactly one position, got {}",
                    self.txn_id,
                    self.positions.len()
                )))
            }
            (PendingAckOp::Commit | PendingAckOp::Abort, _) if !self.positions.is_empty() => {
                return Err(PendingAckError::InvalidRecord(format!(
                    "{:?} of txn {} must list no positions",
                    self.op, self.txn_id
                )))
            }
            _ => {}
        }
        let cumulative = self.ack_type == AckType::Cumulative;
        self.positions
            .iter()
            .try_for_each(|p| p.validate(cumulative))
    }

    /// The wire message Pulsar's `MLPendingAckStore` writes for this record:
    /// op, ack type and both txn id halves always present (explicit zeros
    /// included); for an individual ACK every position carries `batch_size`
    /// (0 when not batched); a cumulative ACK's position carries it only when
    /// non-zero (Pulsar's `appendCumulativeAck` never sets it).
    pub(crate) fn to_wire(&self) -> PendingAckMetadataEntry {
        let individual = self.ack_type == AckType::Individual;
        PendingAckMetadataEntry {
            pending_ack_op: Some(self.op as i32),
            ack_type: Some(self.ack_type as i32),
            txnid_least_bits: Some(self.txn_id.least_sig_bits),
            txnid_most_bits: Some(self.txn_id.most_sig_bits),
            pending_ack_metadata: self
                .positions
                .iter()
                .map(|p| PendingAckMetadata {
                    ledger_id: Some(p.position.ledger_id as u64),
                    entry_id: Some(p.position.entry_id as u64),
                    ack_set: p.ack_set.clone(),
                    batch_size: (individual || p.batch_size != 0).then_some(p.batch_size),
                })
                .collect(),
        }
    }

    fn from_wire(position: Position, w: PendingAckMetadataEntry) -> Result<Self, PendingAckError> {
        let missing = |message: &'static str, field: &'static str| PendingAckError::MissingField {
            position,
            message,
            field,
        };
        let bad = |reason: String| PendingAckError::Decode { position, reason };
        const ENTRY: &str = "PendingAckMetadataEntry";
        let op_raw = w
            .pending_ack_op
            .ok_or_else(|| missing(ENTRY, "pending_ack_op"))?;
        let op = PendingAckOp::try_from(op_raw)
            .map_err(|_| bad(format!("unknown pending_ack_op {op_raw}")))?;
        let type_raw = w.ack_type.ok_or_else(|| missing(ENTRY, "ack_type"))?;
        let ack_type =
            AckType::try_from(type_raw).map_err(|_| bad(format!("unknown ack_type {type_raw}")))?;
        let least = w
            .txnid_least_bits
            .ok_or_else(|| missing(ENTRY, "txnid_least_bits"))?;
        let most = w
            .txnid_most_bits
            .ok_or_else(|| missing(ENTRY, "txnid_most_bits"))?;
        let mut positions = Vec::with_capacity(w.pending_ack_metadata.len());
        for m in w.pending_ack_metadata {
            const META: &str = "PendingAckMetadata";
            let ledger = m.ledger_id.ok_or_else(|| missing(META, "ledgerId"))?;
            let entry = m.entry_id.ok_or_else(|| missing(META, "entryId"))?;
            let to_i64 = |v: u64, what: &str| {
                i64::try_from(v).map_err(|_| bad(format!("{what} {v} is out of range")))
            };
            // Pulsar writes a cumulative ACK's ack_set without batch_size.
            if ack_type == AckType::Individual && !m.ack_set.is_empty() && m.batch_size.is_none() {
                return Err(missing(META, "batch_size"));
            }
            positions.push(AckedPosition {
                position: Position::new(to_i64(ledger, "ledgerId")?, to_i64(entry, "entryId")?),
                batch_size: m.batch_size.unwrap_or(0),
                ack_set: m.ack_set,
            });
        }
        let rec = Self {
            txn_id: TxnId::new(most, least),
            op,
            ack_type,
            positions,
        };
        rec.validate().map_err(|e| bad(e.to_string()))?;
        Ok(rec)
    }

    /// Encodes the record as a single (non-batched) log entry, byte-identical
    /// to what Pulsar's `MLPendingAckStore` writes for it. Call
    /// [`PendingAckRecord::validate`] first for untrusted input (the buffered
    /// writer does): a negative ledger/entry id would be written as its
    /// two's-complement `uint64` and rejected on decode.
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
            .map(|w| PendingAckRecord::from_wire(position, w))
            .collect();
    }
    let w = PendingAckMetadataEntry::decode(data).map_err(|e| err(e.to_string()))?;
    Ok(vec![PendingAckRecord::from_wire(position, w)?])
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    use crate::test_support::p;

    fn invalid(r: &PendingAckRecord) -> bool {
        matches!(r.validate(), Err(PendingAckError::InvalidRecord(_)))
    }

    fn individual(ap: AckedPosition) -> PendingAckRecord {
        PendingAckRecord::individual_ack(TxnId::new(1, 7), vec![ap])
    }

    #[test]
    fn txn_ids_display_as_their_two_halves() {
        assert_eq!(TxnId::new(3, 7).to_string(), "(3,7)");
    }

    #[test]
    fn only_an_ack_set_makes_a_batch_index_ack() {
        assert!(!AckedPosition::whole(p(3, 4)).is_batch_index_ack());
        let some = AckedPosition::batch_indexes(p(3, 4), 4, &[1]).unwrap();
        assert!(some.is_batch_index_ack());
    }

    #[test]
    fn position_ids_from_zero_are_valid() {
        assert!(individual(AckedPosition::whole(p(0, 0))).validate().is_ok());
        assert!(invalid(&individual(AckedPosition::whole(p(-1, 0)))));
        assert!(invalid(&individual(AckedPosition::whole(p(0, -1)))));
    }

    #[test]
    fn an_individual_ack_set_needs_a_batch_size_a_cumulative_one_need_not() {
        let bits = AckedPosition {
            position: p(3, 4),
            batch_size: 0,
            ack_set: vec![0b1010],
        };
        assert!(invalid(&individual(bits.clone())));
        let cumulative = PendingAckRecord {
            positions: vec![bits],
            ..PendingAckRecord::cumulative_ack(TxnId::new(1, 7), p(3, 4))
        };
        assert!(
            cumulative.validate().is_ok(),
            "Pulsar writes no batch_size there"
        );
        // With a batch_size, a cumulative ack's bits are checked too.
        let over = AckedPosition {
            position: p(3, 4),
            batch_size: 2,
            ack_set: vec![0b100],
        };
        let cumulative = PendingAckRecord {
            positions: vec![over],
            ..PendingAckRecord::cumulative_ack(TxnId::new(1, 7), p(3, 4))
        };
        assert!(invalid(&cumulative));
    }

    #[test]
    fn ack_set_bits_at_or_above_the_batch_size_are_rejected_in_the_last_word() {
        // 100 messages: word 1 holds indexes 64..=127, valid up to bit 35.
        let with_bit = |bit: u32| {
            individual(AckedPosition {
                position: p(3, 4),
                batch_size: 100,
                ack_set: vec![-1, 1i64 << bit],
            })
        };
        assert!(with_bit(35).validate().is_ok());
        assert!(invalid(&with_bit(36)), "index 100");
        assert!(invalid(&with_bit(40)), "index 104");
    }

    #[test]
    fn a_batched_entry_header_is_exactly_four_bytes() {
        let mut header = BATCHED_ENTRY_MAGIC.to_be_bytes().to_vec();
        header.extend(BATCHED_ENTRY_VERSION.to_be_bytes());
        let short = |r: Result<Vec<PendingAckRecord>, PendingAckError>| matches!(r, Err(PendingAckError::Decode { reason, .. }) if reason.contains("shorter than its 4-byte header"));
        assert!(short(decode_entry(p(1, 0), &header[..3])));
        assert!(
            !short(decode_entry(p(1, 0), &header)),
            "a whole header is not short"
        );
    }

    #[test]
    fn a_cumulative_ack_lists_exactly_one_position() {
        let two = PendingAckRecord {
            positions: vec![AckedPosition::whole(p(3, 4)), AckedPosition::whole(p(3, 5))],
            ..PendingAckRecord::cumulative_ack(TxnId::new(1, 7), p(3, 4))
        };
        assert!(invalid(&two));
        let none = PendingAckRecord {
            positions: vec![],
            ..PendingAckRecord::cumulative_ack(TxnId::new(1, 7), p(3, 4))
        };
        assert!(invalid(&none));
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
            pending_ack_op: Some(9),
            ack_type: Some(0),
            txnid_least_bits: Some(0),
            txnid_most_bits: Some(0),
            ..Default::default()
        };
        assert!(matches!(
            decode_entry(at, &w.encode_to_vec()),
            Err(PendingAckError::Decode { .. })
        ));
        // An ACK with no positions is invalid.
        let w = PendingAckMetadataEntry {
            pending_ack_op: Some(1),
            ack_type: Some(0),
            txnid_least_bits: Some(0),
            txnid_most_bits: Some(0),
            ..Default::default()
        };
        assert!(decode_entry(at, &w.encode_to_vec()).is_err());
    }
}
